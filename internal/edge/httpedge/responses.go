package httpedge

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/routing/echo"
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
		req := openai.Request{Endpoint: openai.EndpointResponses, MaxTokens: new(int)} // no generation: nothing to reserve
		if s := r.URL.Query().Get("stream"); s != "" && r.Method == http.MethodGet {
			// A retrieval may stream the response's events (a background
			// response still running, from starting_after on).
			stream, err := strconv.ParseBool(s)
			if err != nil {
				param := "stream"
				d.reject(w, r, http.StatusBadRequest, openai.CodeInvalidRequest,
					fmt.Sprintf("The stream query parameter must be true or false, got %s.", echo.Quote(s)), &param)
				return
			}
			req.Stream = stream
		}
		d.run(w, r, openai.WriteError, rid, cid, req)
	}
	mux.Handle("GET /v1/responses/{id}", inf(byID))
	mux.Handle("DELETE /v1/responses/{id}", inf(byID))
	mux.Handle("/v1/responses", d.Keyring.Require(auth.ScopeInference, openai.MethodNotAllowed("POST")))
	mux.Handle("/v1/responses/{id}", d.Keyring.Require(auth.ScopeInference, openai.MethodNotAllowed("GET, HEAD, DELETE")))
}
