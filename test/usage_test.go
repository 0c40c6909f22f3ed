package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// lockedBuffer collects the access log.
type lockedBuffer struct{ syncBuffer }

// line returns the access-log line of the request the client named id
// (its client_request_id), or nil.
func (l *lockedBuffer) line(id string) map[string]any {
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	for sc.Scan() {
		var v map[string]any
		if json.Unmarshal(sc.Bytes(), &v) == nil && v["message"] == "request" && v["client_request_id"] == id {
			return v
		}
	}
	return nil
}

// llamaEngine answers like llama.cpp's server: a stream's usage (and
// timings) ride in its final chunk, which still has choices, whatever
// stream_options says; a whole answer has usage as OpenAI's. It records
// whether each streamed request asked for the usage chunk.
type llamaEngine struct {
	mu    sync.Mutex
	asked []bool
}

func (e *llamaEngine) handle(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	timings := `"timings":{"prompt_n":9,"prompt_ms":1.5,"predicted_n":2,"predicted_ms":3.1}`
	if !gjson.GetBytes(body, "stream").Bool() {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"Hi there"}}],"created":1,"model":"llama","system_fingerprint":"b1-x","object":"chat.completion","usage":{"completion_tokens":3,"prompt_tokens":9,"total_tokens":12},`+timings+`}`)
		return
	}
	e.mu.Lock()
	e.asked = append(e.asked, gjson.GetBytes(body, "stream_options.include_usage").Bool())
	e.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range []string{
		`{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1,"id":"chatcmpl-l","model":"llama","object":"chat.completion.chunk"}`,
		`{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hi"}}],"created":1,"id":"chatcmpl-l","model":"llama","object":"chat.completion.chunk",` + timings + `}`,
		`{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"chatcmpl-l","model":"llama","object":"chat.completion.chunk","usage":{"completion_tokens":2,"prompt_tokens":9,"total_tokens":11},` + timings + `}`,
		`[DONE]`,
	} {
		_, _ = io.WriteString(w, "data: "+ev+"\n\n")
		w.(http.Flusher).Flush()
	}
}

// bareEngine answers without any usage: the gateway estimates it.
func bareEngine(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if !gjson.GetBytes(body, "stream").Bool() {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"abcdefgh"},"finish_reason":"stop"}]}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, tok := range []string{"ab", "cd", "ef"} {
		_, _ = io.WriteString(w, `data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"`+tok+`"}}]}`+"\n\n")
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// usageChunks returns the usage objects among a stream's events, and how
// many of them were usage-only (empty choices).
func usageChunks(b []byte) (usages []string, usageOnly int) {
	for _, ev := range sseEvents(b) {
		u := gjson.Get(ev, "usage")
		if !u.IsObject() {
			continue
		}
		usages = append(usages, u.Raw)
		if !gjson.Get(ev, "choices.0").Exists() {
			usageOnly++
		}
	}
	return usages, usageOnly
}

func TestUsageCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	logs := &lockedBuffer{}
	c := limitedCluster(t, newFakeClock(), config.APIKey{TokensPerMinute: 1_000_000}, reg, logs, enginesim.Config{ID: "w1", Model: "sim"})
	llama := &llamaEngine{}
	c.addFake("ll1", "llama", llama.handle)
	c.addFake("bare1", "bare", bareEngine)

	// The rendered prompt is "user\nhello there\n": 17 bytes, estimated as
	// 5 tokens.
	chat := func(model string, stream bool, askUsage bool) map[string]any {
		b := map[string]any{"model": model, "messages": []map[string]any{{"role": "user", "content": "hello there"}}, "max_tokens": 6, "stream": stream}
		if askUsage {
			b["stream_options"] = map[string]any{"include_usage": true}
		}
		return b
	}
	type want struct{ prompt, completion int }
	cases := []struct {
		name          string
		model         string
		stream, asked bool
		// check inspects the client's answer and returns the usage the
		// gateway must count for it.
		check     func(t *testing.T, b []byte) want
		estimated bool
	}{
		{"enginesim whole", "sim", false, false, func(t *testing.T, b []byte) want {
			p, n := usageOf(t, b)
			return want{p, n}
		}, false},
		{"enginesim stream, client asks for usage", "sim", true, true, func(t *testing.T, b []byte) want {
			us, only := usageChunks(b)
			if len(us) != 1 || only != 1 {
				t.Fatalf("usage chunks %v (%d usage-only), want exactly one:\n%s", us, only, b)
			}
			return want{int(gjson.Get(us[0], "prompt_tokens").Int()), int(gjson.Get(us[0], "completion_tokens").Int())}
		}, false},
		{"enginesim stream, client does not ask", "sim", true, false, func(t *testing.T, b []byte) want {
			if us, _ := usageChunks(b); len(us) != 0 {
				t.Fatalf("the client got usage it did not ask for: %v\n%s", us, b)
			}
			if !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				t.Fatalf("stream does not end with [DONE]:\n%s", b)
			}
			return want{-1, 6} // prompt: as enginesim counts it (from the whole answer)
		}, false},
		{"llama.cpp whole", "llama", false, false, func(t *testing.T, b []byte) want { return want{9, 3} }, false},
		{"llama.cpp stream: usage in the final chunk", "llama", true, false, func(t *testing.T, b []byte) want {
			if us, only := usageChunks(b); len(us) != 1 || only != 0 {
				t.Fatalf("llama.cpp's final chunk was not relayed as sent: %v\n%s", us, b)
			}
			return want{9, 2}
		}, false},
		{"no usage, whole: estimated", "bare", false, false, func(t *testing.T, b []byte) want { return want{5, 2} }, true},
		{"no usage, stream: estimated", "bare", true, false, func(t *testing.T, b []byte) want { return want{5, 3} }, true},
	}
	simPrompt := -1
	total := map[string]want{}
	for i, tc := range cases {
		id := fmt.Sprintf("usage-%d", i)
		r := c.post("/v1/chat/completions", "key-alice", chat(tc.model, tc.stream, tc.asked), "X-Request-Id", id)
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.name, r.status, r.body)
		}
		w := tc.check(t, r.body)
		if tc.model == "sim" && w.prompt >= 0 {
			simPrompt = w.prompt
		}
		if w.prompt < 0 {
			w.prompt = simPrompt
		}
		sum := total[tc.model]
		total[tc.model] = want{sum.prompt + w.prompt, sum.completion + w.completion}

		// The access log carries the usage, estimated or not.
		var line map[string]any
		eventually(t, 10*time.Second, func() bool { line = logs.line(id); return line != nil }, "access log of %s", id)
		if line["prompt_tokens"] != float64(w.prompt) || line["completion_tokens"] != float64(w.completion) ||
			(line["usage_estimated"] == true) != tc.estimated || line["key"] != "alice" {
			t.Fatalf("%s: access log %v, want prompt %d completion %d estimated %v", tc.name, line, w.prompt, w.completion, tc.estimated)
		}
	}
	if simPrompt <= 0 {
		t.Fatalf("enginesim reported prompt tokens %d", simPrompt)
	}
	llama.mu.Lock()
	if len(llama.asked) != 1 || !llama.asked[0] {
		t.Errorf("the gateway did not ask llama.cpp for the usage chunk: %v", llama.asked)
	}
	llama.mu.Unlock()

	waitKeyRequests(t, reg, "alice", len(cases))
	for model, w := range total {
		for kind, n := range map[string]int{"prompt": w.prompt, "completion": w.completion} {
			got := counter(t, reg, "tlgate_tokens_total", map[string]string{"key": "alice", "model": model, "kind": kind})
			if got != float64(n) {
				t.Errorf("tlgate_tokens_total{key=alice,model=%s,kind=%s} = %v, want %d", model, kind, got, n)
			}
		}
	}
	if got := counter(t, reg, "tlgate_key_requests_total", map[string]string{"key": "alice", "outcome": "ok"}); got != float64(len(cases)) {
		t.Errorf("tlgate_key_requests_total{alice,ok} = %v, want %d", got, len(cases))
	}

	// What was counted is what the key was charged: what it used, and the
	// next request's reservation (its prompt's estimate, 17 bytes: 5
	// tokens, plus max_tokens 6) show in the tokens headers of its answer.
	var all int
	for _, w := range total {
		all += w.prompt + w.completion
	}
	r := c.post("/v1/chat/completions", "key-alice", chat("bare", false, false))
	if got, want := r.header.Get("x-ratelimit-remaining-tokens"), fmt.Sprint(1_000_000-all-5-6); got != want {
		t.Errorf("remaining tokens %s, want %s", got, want)
	}
}

// TestUsageCountsEveryCascadeStep: a cascade whose first step is never
// accepted answers twice; the key is charged and counted for both answers.
func TestUsageCountsEveryCascadeStep(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := newClusterGateway(t, `
[[gateway.routes]]
model = "twice"
cascade = [{ model = "sim", accept_if = "mean_logprob > 1" }, { model = "sim" }]
`, []clusterOpt{withKeys(config.APIKey{Name: "alice", Key: "key-alice", Scopes: []string{"inference"}})}, nil,
		func(o *gateway.Options) { o.Registry, o.Gatherer = reg, reg }, enginesim.Config{ID: "w1", Model: "sim"})
	body := map[string]any{"model": "sim", "prompt": "hello there", "max_tokens": 4}
	r := c.post("/v1/completions", "key-alice", body)
	if r.status != http.StatusOK {
		t.Fatalf("direct: %d %s", r.status, r.body)
	}
	p, n := usageOf(t, r.body)
	body["model"] = "twice"
	if r = c.post("/v1/completions", "key-alice", body); r.status != http.StatusOK {
		t.Fatalf("cascade: %d %s", r.status, r.body)
	}
	waitKeyRequests(t, reg, "alice", 2)
	for kind, want := range map[string]int{"prompt": 2 * p, "completion": 2 * n} {
		if got := counter(t, reg, "tlgate_tokens_total", map[string]string{"key": "alice", "model": "twice", "kind": kind}); got != float64(want) {
			t.Errorf("tlgate_tokens_total{model=twice,kind=%s} = %v, want %d (both steps)", kind, got, want)
		}
	}
}
