package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/adapter/config"
)

// hardenPost posts body to /v1/completions without a key, bounded by its
// own deadline: an engine that stalls must fail the test within seconds,
// not at the package timeout.
func (c *cluster) hardenPost(body map[string]any) reply {
	c.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		c.t.Fatal(err)
	}
	cl := &http.Client{Timeout: 10 * time.Second}
	defer cl.CloseIdleConnections()
	resp, err := cl.Post(c.url+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		c.t.Fatalf("%s: %v", b, err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s: reading the answer: %v", b, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: rb}
}

// fakeGood answers like an engine: SSE for a streamed request, a JSON
// completion otherwise.
func fakeGood(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if strings.Contains(string(b), `"stream":true`) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"good\"}]}\n\ndata: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"id":"c","object":"text_completion","choices":[{"index":0,"text":"good","finish_reason":"stop"}]}`)
}

// The stalling fakes read the body first, as an engine does: the server
// notices that the gateway went away only once the body is consumed.

// fakeStall never answers.
func fakeStall(_ http.ResponseWriter, r *http.Request) {
	_, _ = io.ReadAll(r.Body)
	<-r.Context().Done()
}

// fakePartial sends its headers and part of a body, then stalls.
func fakePartial(w http.ResponseWriter, r *http.Request) {
	_, _ = io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", "1000")
	fmt.Fprint(w, `{"id":"c","choices":[`)
	_ = http.NewResponseController(w).Flush()
	<-r.Context().Done()
}

// fakeOneEventThenStall streams one event and stalls.
func fakeOneEventThenStall(w http.ResponseWriter, r *http.Request) {
	_, _ = io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"one\"}]}\n\n")
	_ = http.NewResponseController(w).Flush()
	<-r.Context().Done()
}

// fakeTruncatedJSON answers a streamed request with plain JSON that
// announces 100,000 bytes, sends 13 and closes.
func fakeTruncatedJSON(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", "100000")
	fmt.Fprint(w, `{"id":"trunc`)
	_ = http.NewResponseController(w).Flush()
	panic(http.ErrAbortHandler)
}

// fakeBad answers what the prompt asks for: answers no engine should give,
// each carrying an internal detail that must not reach the client.
func fakeBad(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req struct {
		Prompt string `json:"prompt"`
	}
	_ = json.Unmarshal(b, &req)
	switch req.Prompt {
	case "500":
		http.Error(w, "panic: SECRET internal detail", http.StatusInternalServerError)
	case "307":
		w.WriteHeader(http.StatusTemporaryRedirect)
	case "notjson":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, "not json SECRET")
	case "401":
		http.Error(w, "SECRET engine key rejected", http.StatusUnauthorized)
	case "403":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"error":{"message":"SECRET forbidden","code":"forbidden"}}`)
	case "sse-garbage":
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "SECRET garbage\n\ndata: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
	case "sse-garbage-later":
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n")
		_ = http.NewResponseController(w).Flush()
		fmt.Fprint(w, "SECRET garbage\n\ndata: [DONE]\n\n")
	case "400":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"message":"max_tokens is too large","type":"invalid_request_error","param":"max_tokens","code":"invalid_value","internal":"SECRET"}}`)
	}
}

// upstreamCluster is a gateway with short engine timeouts (1 s: far above
// what a fake on loopback takes to answer, even on a busy machine) and fake engines
// for each case, by model: the faulty worker's id sorts first, so the
// router tries it first (ties go to the smallest id).
func upstreamCluster(t *testing.T) *cluster {
	c := newCluster(t, "", []clusterOpt{drillGateway(func(g *config.Gateway) {
		g.FirstByteTimeout = config.D(time.Second)
		g.IdleTimeout = config.D(time.Second)
	})})
	c.addFake("a-stall", "stall", fakeStall)
	c.addFake("b-stall", "stall", fakeGood)
	c.addFake("a-partial", "partial", fakePartial)
	c.addFake("b-partial", "partial", fakeGood)
	c.addFake("a-500", "five", fakeBad)
	c.addFake("b-500", "five", fakeGood)
	c.addFake("idle-1", "idle", fakeOneEventThenStall)
	c.addFake("trunc-1", "trunc", fakeTruncatedJSON)
	c.addFake("bad-1", "bad", fakeBad)
	return c
}

// TestUpstreamFailuresFailOver: before the first byte, an engine that never
// answers a non-streamed request, one that sends headers and part of a body
// and stalls, and one that answers 500 are failed over to another worker;
// the client gets the good answer.
func TestUpstreamFailuresFailOver(t *testing.T) {
	c := upstreamCluster(t)
	for _, tc := range []struct {
		model, prompt string
		stream        bool
		failover      string
	}{
		{"stall", "hi", false, "a-stall:timeout"},
		{"stall", "hi", true, "a-stall:timeout"},
		{"partial", "hi", false, "a-partial:timeout"},
		{"partial", "hi", true, "a-partial:bad_answer"}, // JSON to a streamed request
		{"five", "500", false, "a-500:status_5xx"},
		{"five", "500", true, "a-500:status_5xx"},
	} {
		{
			stream := tc.stream
			_, before, _ := c.hooks.snapshot()
			r := c.hardenPost(map[string]any{"model": tc.model, "prompt": tc.prompt, "stream": stream})
			if r.status != 200 || !strings.Contains(string(r.body), `"good"`) {
				t.Fatalf("%s (stream %v): %d %s", tc.model, stream, r.status, r.body)
			}
			if _, after, _ := c.hooks.snapshot(); !slices.Contains(after[len(before):], tc.failover) {
				t.Fatalf("%s (stream %v): failovers %v, want %s", tc.model, stream, after[len(before):], tc.failover)
			}
		}
	}
}

// TestUpstreamAnswersAreNotRelayed: what an engine answers that is neither
// an OpenAI-shaped success nor an OpenAI-shaped client error reaches the
// client as 502 upstream_failed, never as it is (no engine detail in the
// body); an OpenAI-shaped 4xx is relayed in OpenAI's shape.
func TestUpstreamAnswersAreNotRelayed(t *testing.T) {
	c := upstreamCluster(t)
	for _, tc := range []struct {
		model, prompt string
		stream        bool
	}{
		{"bad", "500", false}, {"bad", "500", true},
		{"bad", "307", false}, {"bad", "307", true},
		{"bad", "notjson", false},
		{"bad", "401", false}, {"bad", "403", true},
		{"bad", "sse-garbage", true},
		{"trunc", "hi", true},
	} {
		r := c.hardenPost(map[string]any{"model": tc.model, "prompt": tc.prompt, "stream": tc.stream})
		if r.status != http.StatusBadGateway || errorCode(t, r.body) != "upstream_failed" {
			t.Fatalf("%s %s (stream %v): %d %s, want 502 upstream_failed", tc.model, tc.prompt, tc.stream, r.status, r.body)
		}
		if strings.Contains(string(r.body), "SECRET") || strings.Contains(string(r.body), `{"id":"trunc`) {
			t.Fatalf("%s %s: the engine's answer leaks: %s", tc.model, tc.prompt, r.body)
		}
	}
	// A truncated non-streamed answer is the engines failing to answer,
	// not a lack of workers: 502 upstream_failed, and nothing of the
	// partial body is relayed.
	r := c.hardenPost(map[string]any{"model": "trunc", "prompt": "hi"})
	if r.status != http.StatusBadGateway || errorCode(t, r.body) != "upstream_failed" || strings.Contains(string(r.body), `{"id":"trunc`) {
		t.Fatalf("truncated answer: %d %s, want 502 upstream_failed", r.status, r.body)
	}

	// Garbage after the first event: the stream ends with the error event,
	// and the garbage is not relayed.
	r = c.hardenPost(map[string]any{"model": "bad", "prompt": "sse-garbage-later", "stream": true})
	if ev := sseEvents(r.body); r.status != 200 || len(ev) != 2 || !strings.Contains(ev[1], `"upstream_failed"`) ||
		strings.Contains(string(r.body), "SECRET") || strings.Contains(string(r.body), "[DONE]") {
		t.Fatalf("garbage after the first event: %d %q", r.status, r.body)
	}
	for _, stream := range []bool{false, true} {
		r := c.hardenPost(map[string]any{"model": "bad", "prompt": "400", "stream": stream})
		code, msg, param := hostileError(t, r.body)
		if r.status != 400 || code != "invalid_value" || msg != "max_tokens is too large" || param == nil || *param != "max_tokens" ||
			strings.Contains(string(r.body), "SECRET") {
			t.Fatalf("an engine's 400 (stream %v): %d %s", stream, r.status, r.body)
		}
	}
}

// TestStreamIdleAfterFirstByte: an engine that sends one event and stalls
// ends the client's stream with the upstream_failed event after
// idle_timeout, and no [DONE].
func TestStreamIdleAfterFirstByte(t *testing.T) {
	c := upstreamCluster(t)
	r := c.hardenPost(map[string]any{"model": "idle", "prompt": "hi", "stream": true})
	ev := sseEvents(r.body)
	if r.status != 200 || len(ev) != 2 || !strings.Contains(ev[0], `"one"`) || !strings.Contains(ev[1], `"upstream_failed"`) {
		t.Fatalf("stream %d %q, want the event and then the upstream_failed event", r.status, r.body)
	}
	if strings.Contains(string(r.body), "[DONE]") {
		t.Fatalf("a failed stream ends with [DONE]: %q", r.body)
	}
}

// TestCascadeEscalatesOnEngineError: a cascade whose first step's engine
// answers 500 escalates to the next step instead of answering 500.
func TestCascadeEscalatesOnEngineError(t *testing.T) {
	c := newCluster(t, cascadeRoutes, []clusterOpt{keys()})
	f := &cascadeFakes{}
	c.addFake("small-1", "small", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	})
	c.addFake("large-1", "large", f.large)
	r := c.post("/v1/chat/completions", "key-debug", chatMsg("hi", nil))
	if r.status != 200 || !strings.Contains(string(r.body), "large answer") || r.header.Get("X-TL-Cascade-Step") != "1" {
		t.Fatalf("cascade with a failing first step: %d step %q %s", r.status, r.header.Get("X-TL-Cascade-Step"), r.body)
	}
	if _, _, cascades := c.hooks.snapshot(); !slices.Equal(cascades, []string{"auto:0:escalated"}) {
		t.Fatalf("cascade hooks %v", cascades)
	}
}
