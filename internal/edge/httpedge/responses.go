package httpedge

import (
	"fmt"
	"net/http"

	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

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
		if !openai.ValidResponseID(id) {
			param := "response_id"
			d.reject(w, r, http.StatusBadRequest, openai.CodeInvalidRequest,
				fmt.Sprintf("The response id must be 1 to %d printable ASCII characters without '/'.", openai.MaxResponseIDLen), &param)
			return
		}
		none := 0 // no generation: nothing to reserve
		d.run(w, r, openai.WriteError, rid, cid, openai.Request{Endpoint: openai.EndpointResponses, MaxTokens: &none})
	}
	mux.Handle("GET /v1/responses/{id}", inf(byID))
	mux.Handle("DELETE /v1/responses/{id}", inf(byID))
	mux.Handle("/v1/responses", d.Keyring.Require(auth.ScopeInference, openai.MethodNotAllowed("POST")))
	mux.Handle("/v1/responses/{id}", d.Keyring.Require(auth.ScopeInference, openai.MethodNotAllowed("GET, HEAD, DELETE")))
}
