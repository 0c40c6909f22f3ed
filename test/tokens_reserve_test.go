package test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/guard/ratelimit"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// reserveEngine is a fake engine that records the max_tokens of each
// request, holds each one until released (when hold is set), and streams
// n one-token events without a usage chunk, ignoring max_tokens, when the
// request's prompt is "runaway".
type reserveEngine struct {
	mu      sync.Mutex
	seen    []int64 // max_tokens of each request (-1: absent)
	arrived chan struct{}
	release chan struct{}
	hold    bool
}

func (e *reserveEngine) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	mt := int64(-1)
	if v := gjson.GetBytes(b, "max_tokens"); v.Exists() {
		mt = v.Int()
	}
	e.mu.Lock()
	e.seen = append(e.seen, mt)
	e.mu.Unlock()
	e.mu.Lock()
	hold := e.hold
	e.mu.Unlock()
	if hold {
		e.arrived <- struct{}{}
		select {
		case <-e.release:
		case <-r.Context().Done():
			return
		}
	}
	n := 3
	if gjson.GetBytes(b, "prompt").Str == "runaway" {
		n = 5000
	}
	if !gjson.GetBytes(b, "stream").Bool() {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"index":0,"text":"abc","finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":%d,"total_tokens":%d}}`, n, n+2)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range n {
		if _, err := fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"t%d\"}]}\n\n", i); err != nil {
			return
		}
		if i%100 == 0 {
			fl.Flush()
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (e *reserveEngine) maxTokens() []int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int64(nil), e.seen...)
}

// tokensCluster is a gateway on clk whose key alice (key-alice) has
// tokens_per_minute = 100, bob (key-bob) none, with the fake engine e
// serving model m and cfg's last say on the configuration.
func tokensCluster(t *testing.T, clk *fakeClock, e *reserveEngine, cfg func(*config.Config)) *cluster {
	t.Helper()
	keys := withKeys(
		config.APIKey{Name: "alice", Key: "key-alice", Scopes: []string{"inference"}, TokensPerMinute: 100},
		config.APIKey{Name: "bob", Key: "key-bob", Scopes: []string{"inference"}},
	)
	opts := []clusterOpt{keys}
	if cfg != nil {
		opts = append(opts, cfg)
	}
	c := newClusterGateway(t, "", opts, nil, func(o *gateway.Options) { o.Now = clk.now })
	c.addFake("r1", "m", e.serve)
	return c
}

// TestTokensReservedAtAdmission: a key's tokens_per_minute holds at
// admission. A request reserves its prompt's estimate plus max_tokens; one
// larger than the limit is refused at once; parallel requests are admitted
// only while their reservations fit; the reservation is settled to the real
// usage; a request without max_tokens reserves tokens_default_max_tokens
// and the engine is sent it; with clamp, max_tokens is cut to what is left;
// and a stream that ignores max_tokens is cut with a rate_limit_exceeded
// event at the key's debt cap.
func TestTokensReservedAtAdmission(t *testing.T) {
	// "hello" is estimated at 2 prompt tokens.
	stream := func(prompt string, maxTokens int) map[string]any {
		return map[string]any{"model": "m", "prompt": prompt, "max_tokens": maxTokens, "stream": true}
	}
	parallel := func(c *cluster, n int, body map[string]any) chan reply {
		out := make(chan reply, n)
		for range n {
			go func() { out <- c.post("/v1/completions", "key-alice", body) }()
		}
		return out
	}

	t.Run("refuse", func(t *testing.T) {
		clk := newFakeClock()
		eng := &reserveEngine{arrived: make(chan struct{}, 16), release: make(chan struct{})}
		eng.hold = true
		c := tokensCluster(t, clk, eng, nil)

		// 8 parallel streams asking for 4000 tokens each: every one is
		// larger than the limit itself and refused before any engine.
		out := parallel(c, 8, stream("hello", 4000))
		for range 8 {
			r := <-out
			if r.status != http.StatusTooManyRequests || errorCode(t, r.body) != "rate_limit_exceeded" || !strings.Contains(string(r.body), "requested 4002") {
				t.Fatalf("a stream of 4000 tokens: %d %s", r.status, r.body)
			}
		}
		if n := len(eng.maxTokens()); n != 0 {
			t.Fatalf("%d requests reached the engine", n)
		}

		// 8 parallel streams of 2 + 40 tokens: two fit in 100 while they
		// are in flight; the six others are refused meanwhile.
		out = parallel(c, 8, stream("hello", 40))
		for range 2 {
			select {
			case <-eng.arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("an admitted stream never reached the engine")
			}
		}
		for range 6 {
			if r := <-out; r.status != http.StatusTooManyRequests || !strings.Contains(string(r.body), "tokens per minute") {
				t.Fatalf("a stream beyond the reservations in flight: %d %s", r.status, r.body)
			}
		}
		close(eng.release)
		for range 2 {
			if r := <-out; r.status != http.StatusOK || !strings.Contains(string(r.body), "[DONE]") {
				t.Fatalf("an admitted stream: %d %s", r.status, r.body)
			}
		}
		if n := len(eng.maxTokens()); n != 2 {
			t.Fatalf("%d requests reached the engine, want 2", n)
		}

		// Settled to the real usage: each stream used 2 + 3 (three events),
		// so 90 are left and a reservation of 2 + 88 fits exactly.
		eng.mu.Lock()
		eng.hold = false
		eng.mu.Unlock()
		var r reply
		eventually(t, 10*time.Second, func() bool {
			r = c.post("/v1/completions", "key-alice", map[string]any{"model": "m", "prompt": "hello", "max_tokens": 88})
			return r.status == http.StatusOK
		}, "a reservation of what the settled streams gave back")
		if got := r.header.Get(ratelimit.HeaderRemainingTokens); got != "0" {
			t.Fatalf("remaining after reserving all 90 left: %q", got)
		}
		if mt := eng.maxTokens(); mt[len(mt)-1] != 88 {
			t.Fatalf("max_tokens sent: %v, want 88 last (the client's, within its reservation)", mt)
		}

		// No max_tokens: the default budget (4096) is reserved, larger than
		// the limit.
		clk.add(time.Minute)
		if r := c.post("/v1/completions", "key-alice", map[string]any{"model": "m", "prompt": "hello"}); r.status != http.StatusTooManyRequests ||
			!strings.Contains(string(r.body), "requested 4098") {
			t.Fatalf("no max_tokens, default budget over the limit: %d %s", r.status, r.body)
		}
	})

	t.Run("clamp", func(t *testing.T) {
		clk := newFakeClock()
		eng := &reserveEngine{}
		c := tokensCluster(t, clk, eng, func(cfg *config.Config) {
			cfg.Gateway.TokensAdmission = config.TokensClamp
			cfg.Gateway.TokensDefaultMaxTokens = 50
		})
		// max_tokens 4000 is cut to the 98 left beyond the prompt.
		if r := c.post("/v1/completions", "key-alice", map[string]any{"model": "m", "prompt": "hello", "max_tokens": 4000}); r.status != http.StatusOK {
			t.Fatalf("clamped: %d %s", r.status, r.body)
		}
		// It used 2 + 3: 95 left. No max_tokens: the default 50 is sent.
		if r := c.post("/v1/completions", "key-alice", map[string]any{"model": "m", "prompt": "hello"}); r.status != http.StatusOK {
			t.Fatalf("default budget: %d %s", r.status, r.body)
		}
		// bob has no tokens limit: his body goes as sent.
		if r := c.post("/v1/completions", "key-bob", map[string]any{"model": "m", "prompt": "hello"}); r.status != http.StatusOK {
			t.Fatalf("bob: %d %s", r.status, r.body)
		}
		if got, want := eng.maxTokens(), []int64{98, 50, -1}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("max_tokens the engine saw: %v, want %v", got, want)
		}
	})

	t.Run("stream cut at the debt cap", func(t *testing.T) {
		clk := newFakeClock()
		eng := &reserveEngine{}
		c := tokensCluster(t, clk, eng, nil)
		// The engine ignores max_tokens and sends 5000 events with no usage:
		// the stream is cut once it would take the key more than 10 minutes
		// (1000 tokens) below empty.
		r := c.post("/v1/completions", "key-alice", stream("runaway", 10))
		if r.status != http.StatusOK {
			t.Fatalf("runaway stream: %d %s", r.status, r.body)
		}
		body := string(r.body)
		if strings.Contains(body, "[DONE]") || !strings.Contains(body, `"code":"rate_limit_exceeded"`) || !strings.Contains(body, `"type":"rate_limit_error"`) {
			t.Fatalf("the runaway stream was not cut with rate_limit_exceeded:\n%.300s … %s", body, body[max(len(body)-300, 0):])
		}
		if n := strings.Count(body, "data: {\"choices\""); n < 1000 || n > 1100 {
			t.Fatalf("%d events relayed before the cut, want about 1100 - 2", n)
		}
		// The key is in debt for those tokens: refused.
		if r := c.post("/v1/completions", "key-alice", map[string]any{"model": "m", "prompt": "x", "max_tokens": 1}); r.status != http.StatusTooManyRequests {
			t.Fatalf("after the runaway stream: %d %s", r.status, r.body)
		}
	})
}
