package test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// llamaLikeEngine is a fake engine that answers a chat completion, except
// to a request with an image_url part (500 server_error, as llama-server
// without a vision projector) or a string "tools" (500 with an
// invalid_request_error), or to every request when broken.
func llamaLikeEngine(calls *atomic.Int64, broken bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		raw, _ := io.ReadAll(r.Body)
		b := string(raw)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case broken || strings.Contains(b, "image_url"):
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":{"code":500,"message":"image input is not supported - hint: if this is unexpected, you may need to provide the mmproj","type":"server_error"}}`)
		case strings.Contains(b, `"tools":"x"`):
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":{"code":500,"message":"tools must be an array","type":"invalid_request_error"}}`)
		default:
			fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
		}
	}
}

// TestEngine500ClientErrorNotEjected: an engine that answers a request an
// OpenAI-shaped 500 error is tried once more elsewhere; when that worker
// answers the same, the client gets the engine's error (400 when its type
// says invalid_request_error, the 500 with its message otherwise) and no
// worker is ejected or even suspect, with ejection at its strictest (one
// failure ejects, any share of the pool). An engine that answers every
// request so while another answers it is ejected.
func TestEngine500ClientErrorNotEjected(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys(), drillGateway(func(g *config.Gateway) {
		g.Ejection.ConsecutiveFailures, g.Ejection.MaxPercent = 1, 100
	})})
	var calls [3]atomic.Int64
	for i, id := range []string{"l1", "l2", "l3"} {
		c.addFake(id, "m", llamaLikeEngine(&calls[i], false))
	}
	total := func() int64 { return calls[0].Load() + calls[1].Load() + calls[2].Load() }
	image := map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64,AAAA"}}}}}}
	tools := map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "hi"}}, "tools": "x"}
	for i := range 4 {
		before := total()
		r := c.post("/v1/chat/completions", "key-debug", image)
		if r.status != http.StatusInternalServerError || !strings.Contains(string(r.body), "provide the mmproj") {
			t.Fatalf("image request %d: %d %s, want the engine's 500 and message", i, r.status, r.body)
		}
		if n := total() - before; n != 2 {
			t.Fatalf("image request %d reached %d engines, want 2", i, n)
		}
		before = total()
		r = c.post("/v1/chat/completions", "key-debug", tools)
		if r.status != http.StatusBadRequest || errorCode(t, r.body) != "invalid_request" || !strings.Contains(string(r.body), "tools must be an array") {
			t.Fatalf("tools request %d: %d %s, want 400 invalid_request with the engine's message", i, r.status, r.body)
		}
		if n := total() - before; n != 2 {
			t.Fatalf("tools request %d reached %d engines, want 2", i, n)
		}
	}
	for _, id := range []string{"l1", "l2", "l3"} {
		if w, _ := c.drillWorker(id); !w.Routable || !w.EjectedUntil.IsZero() || w.ConsecutiveFailures != 0 || w.Ejections != 0 {
			t.Errorf("%s after the bad requests: routable %v ejected until %v, %d failures, %d ejections",
				id, w.Routable, w.EjectedUntil, w.ConsecutiveFailures, w.Ejections)
		}
	}
	for i := range 30 {
		o := c.drillSend(t.Context(), "/v1/chat/completions", drillKey, fmt.Sprintf("ok-%d", i),
			map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
		if !o.finishedOK(false) {
			t.Fatalf("good request %d: %v", i, o)
		}
	}

	// A broken engine: its error, with another worker answering the same
	// request, is its failure.
	var bad atomic.Int64
	c.addFake("broken", "m", llamaLikeEngine(&bad, true))
	for i := 0; bad.Load() == 0 && i < 100; i++ {
		o := c.drillSend(t.Context(), "/v1/chat/completions", drillKey, fmt.Sprintf("b-%d", i),
			map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
		if !o.finishedOK(false) || o.route == "broken" {
			t.Fatalf("request %d with a broken engine: %v", i, o)
		}
	}
	if w, _ := c.drillWorker("broken"); w.EjectedUntil.IsZero() || w.EjectionReason != "status_5xx" {
		t.Fatalf("the broken engine answered %d requests and is not ejected: %+v", bad.Load(), w)
	}
}

// TestStreamErrorFirstFailsOver: an engine whose stream starts with its
// error event (vLLM's and SGLang's way of failing a streamed request, then
// [DONE]) has not answered: the request goes to another worker, and the
// client gets that worker's stream, never the error. A request both
// workers fail so gets the engine's error as a whole answer.
func TestStreamErrorFirstFailsOver(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys()})
	errorFirst := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"error\":{\"object\":\"error\",\"message\":\"EngineCore encountered an issue\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n")
	}
	var broken, good atomic.Int64
	var bothFail atomic.Bool
	c.addFake("a-broken", "m", func(w http.ResponseWriter, r *http.Request) { broken.Add(1); errorFirst(w, r) })
	c.addFake("b-good", "m", func(w http.ResponseWriter, r *http.Request) {
		if bothFail.Load() {
			errorFirst(w, r)
			return
		}
		good.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"fine\"}}]}\n\ndata: [DONE]\n\n")
	})
	body := map[string]any{"model": "m", "stream": true, "messages": []map[string]string{{"role": "user", "content": "hi"}}}
	for i := range 6 {
		r := c.post("/v1/chat/completions", "key-debug", body)
		if r.status != http.StatusOK || strings.Contains(string(r.body), "EngineCore") || !strings.Contains(string(r.body), "fine") {
			t.Fatalf("request %d: %d %s, want b-good's stream", i, r.status, r.body)
		}
	}
	if broken.Load() == 0 || good.Load() != 6 {
		t.Fatalf("a-broken asked %d times, b-good %d: want the failing one asked and every stream from b-good", broken.Load(), good.Load())
	}
	bothFail.Store(true)
	r := c.post("/v1/chat/completions", "key-debug", body)
	if r.status != http.StatusInternalServerError || !strings.Contains(string(r.body), "EngineCore encountered an issue") {
		t.Fatalf("both failing: %d %s, want the engine's 500 error", r.status, r.body)
	}
}

// TestTooLargeAnswerNotRetried: an answer over what the gateway relays
// (a non-streamed one over proxy.DefaultMaxResponseBytes) is not asked of
// another worker, which would answer as much: the client gets 502
// upstream_failed saying so, without Retry-After.
func TestTooLargeAnswerNotRetried(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys()})
	var calls atomic.Int64
	big := func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}]}`,
			strings.Repeat("x", proxy.DefaultMaxResponseBytes+1))
	}
	for _, id := range []string{"l1", "l2", "l3"} {
		c.addFake(id, "m", big)
	}
	r := c.post("/v1/chat/completions", "key-debug", map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": "hi"}}})
	if r.status != http.StatusBadGateway || errorCode(t, r.body) != "upstream_failed" || !strings.Contains(string(r.body), "more than the gateway relays") ||
		r.header.Get("Retry-After") != "" {
		t.Fatalf("%d %s (Retry-After %q), want 502 upstream_failed saying the answer is too large", r.status, r.body, r.header.Get("Retry-After"))
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d engines asked, want 1", n)
	}
}
