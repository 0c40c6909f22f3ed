package test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/enginesim"
)

// TestUnknownPathOpenAIError: a path the gateway has no endpoint on is
// answered an OpenAI-shaped 404 naming the method and path, with or
// without a key; known paths keep their answers.
func TestUnknownPathOpenAIError(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys()}, enginesim.Config{ID: "w1", Model: "m"})
	for _, tc := range []struct{ method, path, key string }{
		{http.MethodGet, "/", ""},
		{http.MethodPost, "/v1/images/generations", "key-plain"},
		{http.MethodPost, "/v1/assistants", "key-plain"},
		{http.MethodGet, "/v2/models", ""},
		{http.MethodDelete, "/nothing/here", ""},
	} {
		req, err := http.NewRequest(tc.method, c.url+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.key != "" {
			req.Header.Set("Authorization", "Bearer "+tc.key)
		}
		r := c.do(req)
		var e struct {
			Error *struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    string  `json:"code"`
			} `json:"error"`
		}
		if r.status != http.StatusNotFound || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
			t.Fatalf("%s %s: %d %q %s, want a JSON 404", tc.method, tc.path, r.status, r.header.Get("Content-Type"), r.body)
		}
		if err := json.Unmarshal(r.body, &e); err != nil || e.Error == nil {
			t.Fatalf("%s %s: body %s is not an OpenAI error: %v", tc.method, tc.path, r.body, err)
		}
		if e.Error.Type != "not_found_error" || e.Error.Code != "not_found" || e.Error.Param != nil ||
			!strings.Contains(e.Error.Message, tc.method+" "+tc.path) {
			t.Fatalf("%s %s: error %+v", tc.method, tc.path, *e.Error)
		}
	}
	// Known paths are unchanged: a wrong method is 405, an admin path 404
	// is the admin API's, the ops endpoints answer.
	r := c.get("/v1/completions", "key-plain")
	if r.status != http.StatusMethodNotAllowed {
		t.Fatalf("GET /v1/completions: %d %s", r.status, r.body)
	}
	if r := c.get("/admin/v1/nothing", "key-admin"); r.status != http.StatusNotFound || errorCode(t, r.body) != "not_found" {
		t.Fatalf("GET /admin/v1/nothing: %d %s", r.status, r.body)
	}
	if r := c.get("/healthz", ""); r.status != http.StatusOK {
		t.Fatalf("GET /healthz: %d", r.status)
	}
}
