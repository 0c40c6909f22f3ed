#!/usr/bin/env bash
# genproto.sh regenerates the Go code of the gRPC contracts in protos/.
# protoc comes from Debian's protobuf-compiler; the Go plugins are the
# versions pinned as tools in go.mod, built here into a temporary folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
cd protos
protoc \
  --plugin=protoc-gen-go="$bin/protoc-gen-go" \
  --plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
  --go_out=. --go_opt=paths=source_relative \
  --go-grpc_out=. --go-grpc_opt=paths=source_relative \
  tl/control/v1/control.proto tl/engine/v1/engine.proto tl/kv/v1/kv.proto
