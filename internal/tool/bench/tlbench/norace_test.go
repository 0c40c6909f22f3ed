//go:build !race

package tlbench

// raceBuildFlags: without -race the binaries are built as tlbench builds
// them.
var raceBuildFlags []string
