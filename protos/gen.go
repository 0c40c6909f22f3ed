// Package protos holds the tlgate gRPC contracts (copied from the shared
// contracts with names and field numbers unchanged) and their generated Go
// code in its subpackages. Regenerate with `go generate ./protos` (protoc
// from Debian's protobuf-compiler; the Go plugins are pinned as tools in
// go.mod).
package protos

//go:generate ../scripts/genproto.sh
