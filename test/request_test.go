package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
)

const smolRoutes = `
[[gateway.routes]]
model = "smol"
aliases = ["smol-latest"]
backends = [{ model = "smol-v3", weight = 1 }]

[[gateway.routes]]
model = "big"
`

func chat(model string, stream bool) map[string]any {
	return map[string]any{"model": model, "stream": stream, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": "Tell me about gateways."}}}
}

func TestModelNotFoundAndNoCapacity(t *testing.T) {
	c := newCluster(t, smolRoutes, nil)
	if r := c.get("/readyz", ""); r.status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with no worker: %d, want 503", r.status)
	}
	if r := c.get("/healthz", ""); r.status != http.StatusOK {
		t.Fatalf("/healthz: %d", r.status)
	}
	r := c.post("/v1/chat/completions", "", chat("no-such-model", false))
	if r.status != http.StatusNotFound || errorCode(t, r.body) != "model_not_found" {
		t.Fatalf("unknown model: %d %s", r.status, r.body)
	}
	r = c.post("/v1/chat/completions", "", chat("big", false))
	if r.status != http.StatusServiceUnavailable || errorCode(t, r.body) != "no_capacity" {
		t.Fatalf("routed model without workers: %d %s", r.status, r.body)
	}
	c.addEngine(enginesim.Config{ID: "s1", Model: "smol-v3"})
	c.waitRoutable("s1")
	if r := c.get("/readyz", ""); r.status != http.StatusOK {
		t.Fatalf("/readyz with a worker: %d", r.status)
	}
	if r := c.post("/v1/chat/completions", "", chat("smol", false)); r.status != http.StatusOK {
		t.Fatalf("smol: %d %s", r.status, r.body)
	}
}

// TestModelRewrittenForBackend: an alias reaches the engine as the served
// model id, and every other byte of the body is as the client sent it.
func TestModelRewrittenForBackend(t *testing.T) {
	c := newCluster(t, smolRoutes, nil)
	got := make(chan []byte, 1)
	c.addFake("f1", "smol-v3", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		select {
		case got <- b:
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","model":"smol-v3","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	})
	sent := `{"model": "smol-latest",  "temperature":0.25,"messages":[{"role":"user","content":"héllo \u00e9"}],"x_vendor":{"a":[1,2]}}`
	r := c.post("/v1/chat/completions", "", sent)
	if r.status != http.StatusOK {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	b := <-got
	want := strings.Replace(sent, `"smol-latest"`, `"smol-v3"`, 1)
	if string(b) != want {
		t.Fatalf("engine got\n%s\nwant\n%s", b, want)
	}
	// The reference engine answers only its own id (404 for any other):
	// through the alias, every request it gets succeeds.
	c.addEngine(enginesim.Config{ID: "a0", Model: "smol-v3"})
	c.waitRoutable("a0")
	for range 4 {
		if r := c.post("/v1/completions", "", map[string]any{"model": "smol-latest", "prompt": "hi", "max_tokens": 2}); r.status != http.StatusOK {
			t.Fatalf("alias through the reference engine: %d %s", r.status, r.body)
		}
	}
}

// TestFailoverBeforeFirstByte: a refused worker and a 503 worker are each
// tried once and the request completes on the third.
func TestFailoverBeforeFirstByte(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			c := newCluster(t, "", nil,
				enginesim.Config{ID: "a", Model: "m"}, enginesim.Config{ID: "b", Model: "m"}, enginesim.Config{ID: "c", Model: "m"})
			if err := c.engines["a"].SetFaults(enginesim.Faults{Refuse: true}); err != nil {
				t.Fatal(err)
			}
			if err := c.engines["b"].SetFaults(enginesim.Faults{Unavailable: true}); err != nil {
				t.Fatal(err)
			}
			r := c.post("/v1/completions", "", map[string]any{"model": "m", "prompt": "hello", "max_tokens": 4, "stream": stream})
			if r.status != http.StatusOK {
				t.Fatalf("status %d %s", r.status, r.body)
			}
			if stream && !strings.Contains(string(r.body), "data: [DONE]") {
				t.Fatalf("stream did not finish: %s", r.body)
			}
			routed, failovers, _ := c.hooks.snapshot()
			if strings.Join(routed, ",") != "a,b,c" {
				t.Fatalf("routed %v, want a, b, c (ties to the smallest id, each once)", routed)
			}
			if strings.Join(failovers, ",") != "a:refused,b:status_503" {
				t.Fatalf("failovers %v", failovers)
			}
			if n := c.engines["c"].Stats().Requests; n != 1 {
				t.Fatalf("c got %d requests, want 1", n)
			}
			// All three failing: 503 no_capacity after max_attempts.
			if err := c.engines["c"].SetFaults(enginesim.Faults{Unavailable: true}); err != nil {
				t.Fatal(err)
			}
			r = c.post("/v1/completions", "", map[string]any{"model": "m", "prompt": "hello", "max_tokens": 4, "stream": stream})
			if r.status != http.StatusServiceUnavailable || errorCode(t, r.body) != "no_capacity" {
				t.Fatalf("all failing: %d %s", r.status, r.body)
			}
			for _, w := range c.workers() {
				if w.InFlight != 0 {
					t.Fatalf("worker %s in flight %d after the requests", w.ID, w.InFlight)
				}
			}
		})
	}
}

// TestNoSpliceAfterFirstByte: a worker that dies after one token: the
// client gets that token and an SSE error event; no other worker is called.
func TestNoSpliceAfterFirstByte(t *testing.T) {
	c := newCluster(t, "", nil, enginesim.Config{ID: "a", Model: "m"}, enginesim.Config{ID: "b", Model: "m"})
	if err := c.engines["a"].SetFaults(enginesim.Faults{Die: true, DieAfterTokens: 1}); err != nil {
		t.Fatal(err)
	}
	r := c.post("/v1/completions", "", map[string]any{"model": "m", "prompt": "hello", "max_tokens": 8, "stream": true})
	if r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	ev := sseEvents(r.body)
	if len(ev) < 2 {
		t.Fatalf("events %q", ev)
	}
	last := ev[len(ev)-1]
	if !strings.Contains(last, `"code":"upstream_failed"`) {
		t.Fatalf("last event %q is not the upstream_failed error", last)
	}
	for _, e := range ev {
		if e == "[DONE]" {
			t.Fatal("stream claims [DONE] after the worker died")
		}
	}
	var tokens int
	for _, e := range ev[:len(ev)-1] {
		var v struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(e), &v); err != nil {
			t.Fatalf("event %q: %v", e, err)
		}
		if len(v.Choices) > 0 && v.Choices[0].Text != "" {
			tokens++
		}
	}
	if tokens != 1 {
		t.Fatalf("client got %d tokens before the error, want exactly 1", tokens)
	}
	routed, failovers, _ := c.hooks.snapshot()
	if len(routed) != 1 || routed[0] != "a" || len(failovers) != 0 {
		t.Fatalf("routed %v failovers %v: the request was retried after commit", routed, failovers)
	}
	if n := c.engines["b"].Stats().Requests; n != 0 {
		t.Fatalf("b was called %d times", n)
	}
}

func keys() clusterOpt {
	return withKeys(
		config.APIKey{Name: "dbg", Key: "key-debug", Scopes: []string{"inference", "debug"}},
		config.APIKey{Name: "plain", Key: "key-plain", Scopes: []string{"inference"}},
		config.APIKey{Name: "ops", Key: "key-admin", Scopes: []string{"admin"}},
	)
}

func TestRouteHeaderOnlyForDebug(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys()}, enginesim.Config{ID: "w1", Model: "m"})
	for _, stream := range []bool{false, true} {
		body := map[string]any{"model": "m", "prompt": "hi", "max_tokens": 2, "stream": stream}
		r := c.post("/v1/completions", "key-debug", body)
		if r.status != http.StatusOK || r.header.Get("X-TL-Route") != "w1" {
			t.Fatalf("debug key (stream %v): %d route %q", stream, r.status, r.header.Get("X-TL-Route"))
		}
		if _, ok := r.header["X-Tl-Cascade-Step"]; ok { // a cascade route's only
			t.Fatalf("debug key (stream %v) on a route that is no cascade: X-TL-Cascade-Step %q", stream, r.header.Get("X-TL-Cascade-Step"))
		}
		r = c.post("/v1/completions", "key-plain", body, "X-Request-Id", "my-req-1")
		if r.status != http.StatusOK || r.header.Get("X-TL-Route") != "" || r.header.Get("X-TL-Cascade-Step") != "" {
			t.Fatalf("plain key (stream %v): %d route %q", stream, r.status, r.header.Get("X-TL-Route"))
		}
		if r.header.Get("X-Client-Request-Id") != "my-req-1" || !strings.HasPrefix(r.header.Get("X-Request-Id"), "req-") {
			t.Fatalf("client id not echoed beside the gateway's: X-Client-Request-Id %q, X-Request-Id %q",
				r.header.Get("X-Client-Request-Id"), r.header.Get("X-Request-Id"))
		}
	}
}

func TestModelsList(t *testing.T) {
	c := newCluster(t, smolRoutes, nil, enginesim.Config{ID: "w1", Model: "smol-v3"}, enginesim.Config{ID: "w2", Model: "other"})
	r := c.get("/v1/models", "")
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil || list.Object != "list" {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var ids []string
	for _, m := range list.Data {
		if m.Object != "model" {
			t.Fatalf("entry %+v", m)
		}
		ids = append(ids, m.ID)
	}
	if got := strings.Join(sorted(ids), ","); got != "big,other,smol,smol-latest,smol-v3" {
		t.Fatalf("models %s", got)
	}
	if r := c.get("/v1/models/smol-latest", ""); r.status != http.StatusOK {
		t.Fatalf("known model: %d", r.status)
	}
	if r := c.get("/v1/models/nope%2Fx", ""); r.status != http.StatusNotFound || errorCode(t, r.body) != "model_not_found" {
		t.Fatalf("unknown model: %d %s", r.status, r.body)
	}
	// An unknown model is the same error, naming the same field, on every
	// path that takes a model.
	for _, r := range []reply{
		c.get("/v1/models/nope", ""),
		c.post("/v1/chat/completions", "", map[string]any{"model": "nope", "messages": []map[string]string{{"role": "user", "content": "hi"}}}),
		c.post("/v1/completions", "", map[string]any{"model": "nope", "prompt": "hi"}),
	} {
		if r.status != http.StatusNotFound || errorCode(t, r.body) != "model_not_found" || !strings.Contains(string(r.body), `"param":"model"`) {
			t.Fatalf("unknown model: %d %s, want 404 model_not_found with param model", r.status, r.body)
		}
	}
}

func TestAuthScopes(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys()}, enginesim.Config{ID: "w1", Model: "m"})
	body := map[string]any{"model": "m", "prompt": "hi", "max_tokens": 2}
	cases := []struct {
		name, path, key string
		status          int
		code            string
	}{
		{"no key", "/v1/completions", "", 401, "invalid_api_key"},
		{"wrong key", "/v1/completions", "nope", 401, "invalid_api_key"},
		{"admin-only key on inference", "/v1/completions", "key-admin", 403, "insufficient_scope"},
		{"inference key", "/v1/completions", "key-plain", 200, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := c.post(tc.path, tc.key, body)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if tc.code != "" {
				if got := errorCode(t, r.body); got != tc.code {
					t.Fatalf("code %q, want %q", got, tc.code)
				}
				if strings.Contains(string(r.body), "key-") {
					t.Fatal("a key appears in the error")
				}
			}
		})
	}
	if r := c.get("/v1/models", ""); r.status != http.StatusUnauthorized {
		t.Fatalf("models without a key: %d", r.status)
	}
}

// TestClientDisconnectCancelsUpstream: a client that goes away mid-stream
// cancels the engine's request at once and frees its in-flight slot.
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	c := newCluster(t, "", nil)
	canceled := make(chan struct{})
	c.addFake("f1", "m", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // an engine that would stream for ever
		close(canceled)
	})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q %v", line, err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-canceled:
	case <-time.After(5 * time.Second):
		t.Fatal("the engine's request was not canceled after the client left")
	}
	eventually(t, 5*time.Second, func() bool { return c.workers()[0].InFlight == 0 }, "in-flight slot released")
}

// TestRequestActorPanicReleases: a request actor that panics after it was
// routed releases its in-flight slot, answers 500, and other requests go on.
func TestRequestActorPanicReleases(t *testing.T) {
	c := newCluster(t, "", nil, enginesim.Config{ID: "w1", Model: "m"})
	c.hooks.mu.Lock()
	c.hooks.panicOn = "boom"
	c.hooks.mu.Unlock()
	r := c.post("/v1/completions", "", map[string]any{"model": "m", "prompt": "hi", "max_tokens": 2}, "X-Request-Id", "boom")
	if r.status != http.StatusInternalServerError || errorCode(t, r.body) != "internal_error" {
		t.Fatalf("panicking request: %d %s", r.status, r.body)
	}
	eventually(t, 5*time.Second, func() bool { return c.workers()[0].InFlight == 0 }, "slot released after the panic")
	if r := c.post("/v1/completions", "", map[string]any{"model": "m", "prompt": "hi", "max_tokens": 2}); r.status != http.StatusOK {
		t.Fatalf("next request: %d %s", r.status, r.body)
	}
}

// TestOpenAIClientStreamsThroughGateway: the official OpenAI Go client
// streams a chat completion through the gateway.
func TestOpenAIClientStreamsThroughGateway(t *testing.T) {
	c := newCluster(t, smolRoutes, []clusterOpt{keys()}, enginesim.Config{ID: "w1", Model: "smol-v3"})
	client := openai.NewClient(option.WithBaseURL(c.url+"/v1/"), option.WithAPIKey("key-plain"), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:     "smol",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something.")},
		MaxTokens: openai.Int(8),
		Seed:      openai.Int(3),
	})
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if chunks < 2 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" {
		t.Fatalf("%d chunks, accumulated %+v", chunks, acc.Choices)
	}
	// The same request, not streamed, gives the same text (same seed).
	resp, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:     "smol-latest",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something.")},
		MaxTokens: openai.Int(8),
		Seed:      openai.Int(3),
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != acc.Choices[0].Message.Content {
		t.Fatalf("streamed %q, non-streamed %q", acc.Choices[0].Message.Content, resp.Choices[0].Message.Content)
	}
}
