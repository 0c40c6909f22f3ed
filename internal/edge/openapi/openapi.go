// Package openapi holds tlgate's OpenAPI 3.1 document — the OpenAI subset
// the gateway serves, its admin API and its ops endpoints — and serves it
// at GET /openapi.json. The document is maintained by hand beside the
// handlers it describes; the integration tests check real answers of a
// running gateway against it, so a drift between the two fails CI.
package openapi

import (
	_ "embed"
	"net/http"
	"strconv"
)

//go:embed openapi.json
var document []byte

// Document returns a copy of the OpenAPI document (JSON).
func Document() []byte { return append([]byte(nil), document...) }

// Handler serves the document. It needs no key: it says what the API is,
// not what the fleet holds.
func Handler() http.Handler {
	length := strconv.Itoa(len(document))
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", length)
		h.Set("Cache-Control", "public, max-age=300")
		_, _ = w.Write(document)
	})
}
