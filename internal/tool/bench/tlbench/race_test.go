//go:build race

package tlbench

// raceBuildFlags: under -race the binaries the tests start are built with
// it too, so they link from the test build's cache rather than compiling
// every dependency a second time, and the race detector watches them.
var raceBuildFlags = []string{"-race"}
