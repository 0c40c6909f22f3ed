// Package pprofhttp serves the Go runtime's profiles (net/http/pprof) under
// /debug/pprof/ to a key with the admin scope, for `go tool pprof`:
//
//	GET /debug/pprof/                  the index of the named profiles
//	GET /debug/pprof/{name}            heap, goroutine, allocs, block, mutex, threadcreate
//	GET /debug/pprof/profile?seconds=N a CPU profile of the next N seconds (30 by default)
//	GET /debug/pprof/trace?seconds=N   an execution trace
//	GET /debug/pprof/cmdline           the command line
//	GET, POST /debug/pprof/symbol      symbols of program counters
//
// A profile costs the process while it runs and shows its internals, so
// the gateway serves these only when configured to (gateway.pprof).
package pprofhttp

import (
	"net/http"
	"net/http/pprof"

	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// Prefix is the path the handler serves; mount it there.
const Prefix = "/debug/pprof/"

// New returns the profiles' handler, every path of it behind the admin
// scope of k (auth.New(nil): authentication off).
func New(k *auth.Keyring) http.Handler {
	if k == nil {
		panic("pprofhttp: nil keyring; use auth.New(nil) to run without keys")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Prefix, pprof.Index)
	mux.HandleFunc("GET "+Prefix+"cmdline", pprof.Cmdline)
	mux.HandleFunc("GET "+Prefix+"profile", pprof.Profile)
	mux.HandleFunc("GET "+Prefix+"trace", pprof.Trace)
	mux.HandleFunc("GET "+Prefix+"symbol", pprof.Symbol)
	mux.HandleFunc("POST "+Prefix+"symbol", pprof.Symbol)
	mux.HandleFunc(Prefix, func(w http.ResponseWriter, r *http.Request) {
		allow := "GET, HEAD"
		if r.URL.Path == Prefix+"symbol" {
			allow = "GET, HEAD, POST"
		}
		openai.MethodNotAllowed(allow)(w, r)
	})
	return k.Require(auth.ScopeAdmin, mux)
}
