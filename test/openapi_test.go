package test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/edge/openapi"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// TestOpenAPIMatchesResponses sends real requests to a running gateway —
// successes and each kind of error, on the OpenAI subset, the admin API
// and the ops endpoints — and checks every request and answer against the
// OpenAPI document the gateway serves: status documented, headers and body
// matching the schema.
func TestOpenAPIMatchesResponses(t *testing.T) {
	c := newClusterGateway(t, `
[[gateway.routes]]
model = "smol"
aliases = ["smol-latest"]
backends = [{ model = "m", weight = 1 }]

[[gateway.routes]]
model = "auto"
cascade = [{ model = "m", accept_if = "mean_logprob > -1.2" }, { model = "m" }]
`, []clusterOpt{keys(), withLimitedKey()}, nil, func(o *gateway.Options) { o.Now = newFakeClock().now },
		enginesim.Config{ID: "w1", Model: "m"}, enginesim.Config{ID: "w2", Model: "m"},
		enginesim.Config{ID: "w3", Model: "plain", Unserved: []string{"/v1/messages"}})

	served := c.get("/openapi.json", "")
	if served.status != http.StatusOK {
		t.Fatalf("GET /openapi.json: %d", served.status)
	}
	if !bytes.Equal(served.body, openapi.Document()) {
		t.Fatal("GET /openapi.json does not serve the embedded document")
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(served.body)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Route by path alone: the document's server is an example address.
	doc.Servers = nil
	rt, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}

	etag := c.get("/admin/v1/routes", "key-admin").header.Get("ETag")
	cases := []struct {
		name, method, path, key, body string
		hdr                           []string
		want                          int
	}{
		{"chat", "POST", "/v1/chat/completions", "key-plain", `{"model":"smol","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`, nil, 200},
		{"chat stream", "POST", "/v1/chat/completions", "key-plain", `{"model":"smol","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`, nil, 200},
		{"completion", "POST", "/v1/completions", "key-debug", `{"model":"smol-latest","prompt":"hello","max_tokens":3,"logprobs":1}`, nil, 200},
		{"cascade", "POST", "/v1/completions", "key-plain", `{"model":"auto","prompt":"hello","max_tokens":3}`, nil, 200},
		{"embeddings", "POST", "/v1/embeddings", "key-plain", `{"model":"smol","input":"hello there"}`, nil, 200},
		{"embeddings batch, base64", "POST", "/v1/embeddings", "key-plain", `{"model":"smol","input":["a","b"],"encoding_format":"base64"}`, nil, 200},
		{"embeddings tokens", "POST", "/v1/embeddings", "key-plain", `{"model":"auto","input":[[1,2],[3]]}`, nil, 200},
		{"embeddings bad input", "POST", "/v1/embeddings", "key-plain", `{"model":"smol","input":[]}`, nil, 400},
		{"rerank", "POST", "/v1/rerank", "key-plain", `{"model":"smol","query":"red fruit","documents":["an apple",{"text":"a car"}],"top_n":1}`, nil, 200},
		{"rerank v2", "POST", "/v2/rerank", "key-plain", `{"model":"smol","query":"red fruit","documents":["an apple","a car"]}`, nil, 200},
		{"score", "POST", "/v1/score", "key-plain", `{"model":"smol","text_1":"red fruit","text_2":["an apple","a car"]}`, nil, 200},
		{"tokenize", "POST", "/tokenize", "key-plain", `{"model":"smol","prompt":"hello there","return_token_strs":true}`, nil, 200},
		{"tokenize chat", "POST", "/tokenize", "key-plain", `{"model":"smol","messages":[{"role":"user","content":"hi"}]}`, nil, 200},
		{"detokenize", "POST", "/detokenize", "key-plain", `{"model":"smol","tokens":[1,2,3]}`, nil, 200},
		{"detokenize unknown model", "POST", "/detokenize", "key-plain", `{"model":"nope","tokens":[1]}`, nil, 404},
		{"limited key", "POST", "/v1/completions", "key-limited", `{"model":"smol","prompt":"hello","max_tokens":3}`, nil, 200},
		{"rate limited", "POST", "/v1/chat/completions", "key-limited", `{"model":"smol","messages":[{"role":"user","content":"hi"}]}`, nil, 429},
		{"bad json", "POST", "/v1/completions", "key-plain", `{"model":`, nil, 400},
		{"unknown model", "POST", "/v1/completions", "key-plain", `{"model":"nope","prompt":"x"}`, nil, 404},
		{"no key", "POST", "/v1/completions", "", `{"model":"smol","prompt":"x"}`, nil, 401},
		{"wrong scope", "POST", "/v1/completions", "key-admin", `{"model":"smol","prompt":"x"}`, nil, 403},
		{"responses", "POST", "/v1/responses", "key-plain", `{"model":"smol","input":"hi","max_output_tokens":3}`, nil, 200},
		{"responses stream", "POST", "/v1/responses", "key-plain", `{"model":"smol","instructions":"Be brief.","input":[{"role":"user","content":"hi"}],"max_output_tokens":3,"stream":true,"store":false}`, nil, 200},
		{"responses no input", "POST", "/v1/responses", "key-plain", `{"model":"smol"}`, nil, 400},
		{"response unknown", "GET", "/v1/responses/resp_nope", "key-plain", "", nil, 404},
		{"response delete unknown", "DELETE", "/v1/responses/resp_nope", "key-plain", "", nil, 404},
		{"messages", "POST", "/v1/messages", "key-plain", `{"model":"smol","max_tokens":3,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}`, nil, 200},
		{"messages stream, x-api-key", "POST", "/v1/messages", "", `{"model":"smol","max_tokens":3,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"stream":true}`, []string{"X-Api-Key", "key-plain"}, 200},
		{"messages no messages", "POST", "/v1/messages", "key-plain", `{"model":"smol","max_tokens":3}`, nil, 400},
		{"messages unknown model", "POST", "/v1/messages", "key-plain", `{"model":"nope","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, nil, 404},
		{"messages the engine does not serve", "POST", "/v1/messages", "key-plain", `{"model":"plain","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, nil, 404},
		{"messages no key", "POST", "/v1/messages", "", `{"model":"smol","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, nil, 401},
		{"messages wrong scope", "POST", "/v1/messages", "key-admin", `{"model":"smol","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, nil, 403},
		{"messages rate limited", "POST", "/v1/messages", "key-limited", `{"model":"smol","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, nil, 429},
		{"models", "GET", "/v1/models", "key-plain", "", nil, 200},
		{"two keys", "GET", "/v1/models", "", "", []string{"Authorization", "Bearer key-plain", "Authorization", "Bearer key-admin"}, 400},
		{"two keys, admin", "GET", "/admin/v1/workers", "", "", []string{"Authorization", "Bearer key-admin", "Authorization", "Bearer key-admin"}, 400},
		{"model", "GET", "/v1/models/smol", "key-plain", "", nil, 200},
		{"model unknown", "GET", "/v1/models/nope", "key-plain", "", nil, 404},
		{"workers", "GET", "/admin/v1/workers", "key-admin", "", nil, 200},
		{"workers wrong scope", "GET", "/admin/v1/workers", "key-plain", "", nil, 403},
		{"routes", "GET", "/admin/v1/routes", "key-admin", "", nil, 200},
		{"put no if-match", "PUT", "/admin/v1/routes", "key-admin", `{"routes":[]}`, nil, 428},
		{"put stale", "PUT", "/admin/v1/routes", "key-admin", `{"routes":[]}`, []string{"If-Match", `"999"`}, 412},
		{"put invalid", "PUT", "/admin/v1/routes", "key-admin", `{"routes":[{"model":"x","cascade":[{"model":"m"}]}]}`, []string{"If-Match", etag}, 400},
		{"put dry run", "PUT", "/admin/v1/routes?dry_run=true", "key-admin", `{"routes":[{"model":"smol","backends":[{"model":"mm","weight":1}]}]}`, nil, 200},
		{"put", "PUT", "/admin/v1/routes", "key-admin", `{"routes":[{"model":"smol","backends":[{"model":"m","weight":1}]}]}`, []string{"If-Match", etag}, 200},
		{"drain", "POST", "/admin/v1/models/m:drain", "key-admin", "", nil, 202},
		{"drain the other", "POST", "/admin/v1/models/plain:drain", "key-admin", "", nil, 202},
		{"readyz drained", "GET", "/readyz", "", "", nil, 503},
		{"resume", "POST", "/admin/v1/models/m:resume", "key-admin", "", nil, 202},
		{"drain unknown", "POST", "/admin/v1/models/nope:drain", "key-admin", "", nil, 404},
		{"traffic", "GET", "/admin/v1/traffic", "key-admin", "", nil, 200},
		{"traffic wrong scope", "GET", "/admin/v1/traffic", "key-plain", "", nil, 403},
		{"healthz", "GET", "/healthz", "", "", nil, 200},
		{"openapi", "GET", "/openapi.json", "", "", nil, 200},
	}
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true}
	for _, tc := range cases {
		var body io.Reader
		if tc.body != "" {
			body = strings.NewReader(tc.body)
		}
		req, err := http.NewRequest(tc.method, c.url+tc.path, body)
		if err != nil {
			t.Fatal(err)
		}
		if tc.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if tc.key != "" {
			req.Header.Set("Authorization", "Bearer "+tc.key)
		}
		for i := 0; i+1 < len(tc.hdr); i += 2 {
			req.Header.Add(tc.hdr[i], tc.hdr[i+1])
		}
		if tc.name == "readyz drained" {
			c.eventuallyStatus(req, tc.want)
		}
		route, params, err := rt.FindRoute(req)
		if err != nil {
			t.Fatalf("%s: %s %s is not in the document: %v", tc.name, tc.method, tc.path, err)
		}
		in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
		// Requests the test sends malformed on purpose are not checked.
		if tc.want < 400 || tc.want == 412 || tc.want == 428 {
			if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil && tc.want != 428 {
				t.Fatalf("%s: the request does not match the document: %v", tc.name, err)
			}
		}
		if tc.body != "" {
			req.Body = io.NopCloser(strings.NewReader(tc.body))
		}
		r := c.do(req)
		if r.status != tc.want {
			t.Fatalf("%s: status %d, want %d: %s", tc.name, r.status, tc.want, r.body)
		}
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: r.status, Header: r.header, Options: opts}
		out.SetBodyBytes(r.body)
		if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
			t.Errorf("%s: %d answer does not match the document: %v\n%s", tc.name, r.status, err, r.body)
		}
		if strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
			checkEvents(t, tc.name, doc, route.Operation.Responses.Status(r.status).Value.Content.Get("text/event-stream"), r.body)
		}
	}
	// An undocumented path is not found by the router: the check above
	// would have failed on a path the document does not list.
	if _, _, err := rt.FindRoute(mustRequest(t, "GET", c.url+"/admin/v1/nothing")); !errors.Is(err, routers.ErrPathNotFound) {
		t.Fatalf("an undocumented path was found: %v", err)
	}
}

// checkEvents checks each data event of an SSE answer against the chunk
// schema the document names for the stream (x-tlgate-event-schema), and
// that the stream ends with [DONE], or with the event whose type the
// document names (x-tlgate-stream-end).
func checkEvents(t *testing.T, name string, doc *openapi3.T, mt *openapi3.MediaType, body []byte) {
	t.Helper()
	ref, _ := mt.Extensions["x-tlgate-event-schema"].(string)
	schema := doc.Components.Schemas[strings.TrimPrefix(ref, "#/components/schemas/")]
	if schema == nil {
		t.Fatalf("%s: the stream's event schema %q is not in the document", name, ref)
	}
	events := sseEvents(body)
	if end, _ := mt.Extensions["x-tlgate-stream-end"].(string); end != "" {
		if len(events) < 2 || gjson.Get(events[len(events)-1], "type").Str != end {
			t.Fatalf("%s: stream does not end with a %s event: %q", name, end, events)
		}
		events = append(events, "[DONE]") // every event is checked below
	}
	if len(events) < 2 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("%s: stream does not end with [DONE]: %q", name, events)
	}
	for _, e := range events[:len(events)-1] {
		var v any
		if err := jsonUnmarshal([]byte(e), &v); err != nil {
			t.Fatalf("%s: event is not JSON: %q", name, e)
		}
		if err := schema.Value.VisitJSON(v); err != nil {
			t.Errorf("%s: event does not match %s: %v\n%s", name, ref, err, e)
		}
	}
}

// eventuallyStatus waits until req answers want (a drain takes effect
// through the actors, not synchronously with the 202).
func (c *cluster) eventuallyStatus(req *http.Request, want int) {
	c.t.Helper()
	eventually(c.t, 10*eventuallyUnit, func() bool {
		r, err := http.NewRequest(req.Method, req.URL.String(), nil)
		if err != nil {
			c.t.Fatal(err)
		}
		r.Header = req.Header.Clone()
		return c.do(r).status == want
	}, "%s %s to answer %d", req.Method, req.URL.Path, want)
}

func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func init() {
	// The SSE body is checked event by event (checkEvents); to the filter
	// it is a string.
	openapi3filter.RegisterBodyDecoder("text/event-stream", func(r io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
		b, err := io.ReadAll(r)
		return string(b), err
	})
}
