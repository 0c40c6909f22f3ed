package httpedge

import (
	"fmt"
	"net/http"

	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// maxResponseIDLen bounds the {id} of /v1/responses/{id}.
const maxResponseIDLen = 256

// registerResponses mounts OpenAI's Responses API: POST /v1/responses,
// GET and DELETE /v1/responses/{id}. Which worker serves a request that
// names a stored response is the request actor's decision.
func (d *Deps) registerResponses(mux *http.ServeMux) {
	inf := func(h http.HandlerFunc) http.Handler { return d.Keyring.Require(auth.ScopeInference, h) }
	mux.Handle("POST /v1/responses", inf(func(w http.ResponseWriter, r *http.Request) {
		d.serve(w, r, openai.WriteError, openai.ParseResponses)
	}))
	byID := func(w http.ResponseWriter, r *http.Request) {
		r, rid, cid := identify(w, r)
		id := r.PathValue("id")
		if !validResponseID(id) {
			param := "response_id"
			d.reject(w, r, http.StatusBadRequest, openai.CodeInvalidRequest,
				fmt.Sprintf("The response id must be 1 to %d printable ASCII characters without '/'.", maxResponseIDLen), &param)
			return
		}
		none := 0 // no generation: nothing to reserve
		d.run(w, r, openai.WriteError, rid, cid, nil, openai.Request{Endpoint: openai.EndpointResponses, MaxTokens: &none})
	}
	mux.Handle("GET /v1/responses/{id}", inf(byID))
	mux.Handle("DELETE /v1/responses/{id}", inf(byID))
	mux.Handle("/v1/responses", d.Keyring.Require(auth.ScopeInference, openai.MethodNotAllowed("POST")))
	mux.Handle("/v1/responses/{id}", d.Keyring.Require(auth.ScopeInference, openai.MethodNotAllowed("GET, HEAD, DELETE")))
}

// validResponseID reports whether id is 1 to maxResponseIDLen printable
// ASCII characters without '/'.
func validResponseID(id string) bool {
	if id == "" || len(id) > maxResponseIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e || id[i] == '/' {
			return false
		}
	}
	return true
}
