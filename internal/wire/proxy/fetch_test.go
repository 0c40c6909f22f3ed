package proxy

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/wire/openai"
)

func TestFetch(t *testing.T) {
	const limit = 4096
	big := `{"choices":[{"text":"` + strings.Repeat("x", limit-len(`{"choices":[{"text":""}]}`)) + `"}]}`
	tests := []struct {
		name       string
		handler    http.HandlerFunc // nil: nothing listens
		cancel     bool             // the client goes away once the engine has the request
		wantStatus int
		wantBody   string
		reason     Failure // "" when a Response is expected
		retryable  bool
	}{
		{name: "200 read whole", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			for i := range 4 { // chunked, in pieces
				_, _ = io.WriteString(w, big[i*limit/4:(i+1)*limit/4])
				_ = http.NewResponseController(w).Flush()
			}
		}, wantStatus: 200, wantBody: big},
		{name: "400 relayed in OpenAI's shape", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			_, _ = io.WriteString(w, `{"error":{"message":"bad"}}`)
		}, wantStatus: 400, wantBody: `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":"invalid_request"}}`},
		{name: "500 fails over", handler: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(500)
			_, _ = io.WriteString(w, "boom")
		}, reason: FailStatus5xx, retryable: true},
		{name: "200 not JSON", handler: func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "not json")
		}, reason: FailBadAnswer, retryable: true},
		{name: "200 JSON without choices", handler: func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, `{"error":{"message":"hidden in a 200"}}`)
		}, reason: FailBadAnswer, retryable: true},
		{name: "401 of the engine", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(401)
			_, _ = io.WriteString(w, `{"error":{"message":"Invalid API key.","code":"invalid_api_key"}}`)
		}, reason: FailBadAnswer, retryable: true},
		{name: "403 plain text", handler: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(403)
			_, _ = io.WriteString(w, "Forbidden")
		}, reason: FailBadAnswer, retryable: true},
		{name: "307 without Location", handler: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(307)
		}, reason: FailBadAnswer, retryable: true},
		{name: "404 not OpenAI-shaped: the path is not served", handler: func(w http.ResponseWriter, r *http.Request) {
			http.NotFound(w, r)
		}, wantStatus: 404, wantBody: string(openai.MarshalError(404, openai.CodeUnsupportedEndpoint,
			"The engine serving this model does not serve POST / (it answered 404 Not Found).", nil))},
		{name: "405 of FastAPI", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(405)
			_, _ = io.WriteString(w, `{"detail":"Method Not Allowed"}`)
		}, wantStatus: 405, wantBody: string(openai.MarshalError(405, openai.CodeUnsupportedEndpoint,
			"The engine serving this model does not serve POST / (it answered 405 Method Not Allowed: Method Not Allowed).", nil))},
		{name: "410 not OpenAI-shaped", handler: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(410)
			_, _ = io.WriteString(w, "gone")
		}, reason: FailBadAnswer, retryable: true},
		{name: "refused", reason: FailRefused, retryable: true},
		{name: "503", handler: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(503)
		}, reason: FailStatus503, retryable: true},
		{name: "reset", handler: func(w http.ResponseWriter, r *http.Request) { resetConn(t, w) },
			reason: FailReset, retryable: true},
		{name: "timeout", handler: func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
			reason: FailTimeout, retryable: true},
		{name: "truncated", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "100")
			_, _ = io.WriteString(w, "0123456789")
			_ = http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		}, reason: FailTruncated, retryable: true},
		{name: "too large by Content-Length", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(limit+1))
			_, _ = io.WriteString(w, big+"x")
		}, reason: FailTooLarge},
		{name: "too large, chunked", handler: func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, big)
			_ = http.NewResponseController(w).Flush()
			_, _ = io.WriteString(w, "x")
		}, reason: FailTooLarge},
		{name: "client gone", cancel: true, handler: func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		}, reason: FailCanceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			url := "http://" + closedAddr(t)
			if tt.handler != nil {
				url = upstream(t, func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get("Accept") != "application/json" || r.Header.Get("X-Request-Id") != "r1" {
						t.Errorf("upstream headers %v", r.Header)
					}
					if tt.cancel {
						cancel()
					}
					tt.handler(w, r)
				}).URL
			}
			p := newProxy(t, Options{ResponseTimeout: 50 * time.Millisecond, MaxResponseBytes: limit})
			resp, err := p.Fetch(ctx, Attempt{URL: url, Body: []byte(`{}`), Header: http.Header{"X-Request-Id": {"r1"}}})
			if tt.reason != "" {
				if resp != nil || ReasonOf(err) != tt.reason || IsRetryable(err) != tt.retryable {
					t.Fatalf("Fetch = %v, %v (reason %q), want reason %q retryable %v", resp, err, ReasonOf(err), tt.reason, tt.retryable)
				}
				return
			}
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			if resp.Status != tt.wantStatus || string(resp.Body) != tt.wantBody {
				t.Fatalf("Fetch = %d %q, want %d %q", resp.Status, resp.Body, tt.wantStatus, tt.wantBody)
			}
			if resp.Header.Get("Content-Type") == "" {
				t.Fatal("no Content-Type in the response header")
			}
		})
	}
}

// TestFetchChoicesNotAList: a 2xx whose choices is null, an object or a
// string is not a completion: a retryable bad answer, never relayed.
func TestFetchChoicesNotAList(t *testing.T) {
	for _, choices := range []string{`null`, `{}`, `"x"`, `{"0":{"text":"hi"}}`} {
		t.Run(choices, func(t *testing.T) {
			srv := upstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"id":"c","object":"text_completion","choices":`+choices+`}`)
			})
			p := newProxy(t, Options{})
			resp, err := p.Fetch(context.Background(), Attempt{URL: srv.URL + "/v1/completions", Body: []byte(`{}`)})
			if resp != nil || ReasonOf(err) != FailBadAnswer || !IsRetryable(err) {
				t.Fatalf("choices %s: %+v, %v; want a retryable bad_answer", choices, resp, err)
			}
		})
	}
}
