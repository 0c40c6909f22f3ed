package httpedge

import (
	"fmt"
	"net/http"

	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/routing/echo"
	"github.com/tlgate/tlgate/internal/wire/anthropic"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// registerMessages mounts Anthropic's Messages API, POST /v1/messages:
// the key is accepted as x-api-key too, and every error the gateway
// answers on it, and on the paths below it it does not serve
// (/v1/messages/count_tokens, /v1/messages/batches...), is Anthropic-shaped.
func (d *Deps) registerMessages(mux *http.ServeMux) {
	opts := auth.RequireOptions{KeyHeader: "X-Api-Key", WriteError: func(w http.ResponseWriter, status int, _, msg string) {
		anthropic.WriteError(w, status, msg)
	}}
	mux.Handle("POST "+anthropic.Path, d.Keyring.RequireWith(auth.ScopeInference, opts, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.serve(w, r, anthropicError, anthropic.ParseRequest)
	})))
	mux.Handle(anthropic.Path, d.Keyring.RequireWith(auth.ScopeInference, opts, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "POST")
		anthropic.WriteError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s is not allowed on %s (allowed: POST).", echo.Clip(r.Method), echo.Clip(r.URL.Path)))
	})))
	// The catch-all's 404 (no key needed), in Anthropic's shape:
	// not_found_error.
	mux.HandleFunc(anthropic.Path+"/", func(w http.ResponseWriter, r *http.Request) {
		d.rejectAs(anthropicError, w, r, http.StatusNotFound, openai.CodeNotFound, fmt.Sprintf("No endpoint %s %s.", echo.Clip(r.Method), echo.Clip(r.URL.Path)), nil)
	})
}

// anthropicError writes the gateway's own error in Anthropic's shape (the
// OpenAI code and param have no place there; the status gives the type).
func anthropicError(w http.ResponseWriter, status int, _, msg string, _ *string) {
	anthropic.WriteError(w, status, msg)
}
