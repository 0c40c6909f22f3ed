package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// printVersion writes the gateway's version and build information: the
// main module's version ("(devel)" for a build from a checkout), the VCS
// revision and time the binary was built from, the Go version and the
// platform.
func printVersion(w io.Writer) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		fmt.Fprintf(w, "tlgate gateway (no build information)\ngo        %s\nplatform  %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	fmt.Fprintf(w, "tlgate gateway %s\n", bi.Main.Version)
	fmt.Fprintf(w, "module    %s\n", bi.Main.Path)
	if rev := settings["vcs.revision"]; rev != "" {
		if settings["vcs.modified"] == "true" {
			rev += " (modified)"
		}
		fmt.Fprintf(w, "revision  %s\n", rev)
	}
	if t := settings["vcs.time"]; t != "" {
		fmt.Fprintf(w, "committed %s\n", t)
	}
	fmt.Fprintf(w, "go        %s\n", bi.GoVersion)
	fmt.Fprintf(w, "platform  %s/%s\n", runtime.GOOS, runtime.GOARCH)
}
