package openapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestDocumentIsValidOpenAPI31 loads the document with kin-openapi and
// validates it as OpenAPI 3.1, every $ref resolved.
func TestDocumentIsValidOpenAPI31(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(Document())
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi = %q, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("validate: %v", err)
	}
	for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{model}",
		"/admin/v1/workers", "/admin/v1/routes", "/admin/v1/models/{model}:drain", "/admin/v1/models/{model}:resume", "/admin/v1/workers/{worker}:lift-ejection", "/admin/v1/traffic",
		"/healthz", "/readyz", "/metrics", "/openapi.json"} {
		if doc.Paths.Find(p) == nil {
			t.Errorf("path %s is not documented", p)
		}
	}
}

func TestHandlerServesJSON(t *testing.T) {
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.json", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var v map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil || v["openapi"] != "3.1.0" {
		t.Fatalf("body: %v, openapi %v", err, v["openapi"])
	}
}

// TestKeyedOperationsDocumentTheirRefusals: every operation that takes a
// key documents the answers of the key check: 400 (two Authorization
// headers), 401 and 403.
func TestKeyedOperationsDocumentTheirRefusals(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(Document())
	if err != nil {
		t.Fatal(err)
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.Security == nil || len(*op.Security) == 0 {
				continue
			}
			for _, code := range []int{400, 401, 403} {
				if op.Responses.Status(code) == nil {
					t.Errorf("%s %s: no %d documented", method, path, code)
				}
			}
		}
	}
}
