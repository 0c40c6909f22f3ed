package test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

const cascadeRoutes = `
[[gateway.routes]]
model = "auto"
cascade = [{ model = "small", accept_if = "mean_logprob > -1.2" }, { model = "large" }]
`

// cascadeFakes runs a small engine whose confidence is written in the
// prompt ("sure" or "unsure", or "empty" for an answer with no tokens) and a
// large one that counts its calls.
type cascadeFakes struct {
	mu          sync.Mutex
	smallBodies []map[string]any
	largeCalls  atomic.Int32
}

func (f *cascadeFakes) small(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req map[string]any
	_ = json.Unmarshal(b, &req)
	f.mu.Lock()
	f.smallBodies = append(f.smallBodies, req)
	f.mu.Unlock()
	prompt := fmt.Sprint(req["messages"])
	lps := `[{"token":"a","logprob":-0.1},{"token":"b","logprob":-0.3}]`
	text := "small answer"
	switch {
	case strings.Contains(prompt, "unsure"):
		lps = `[{"token":"a","logprob":-2.5},{"token":"b","logprob":-3.0}]`
	case strings.Contains(prompt, "empty"):
		lps, text = `[]`, ""
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"s","object":"chat.completion","model":"small","choices":[{"index":0,"message":{"role":"assistant","content":%q},"logprobs":{"content":%s},"finish_reason":"stop"}]}`, text, lps)
}

func (f *cascadeFakes) large(w http.ResponseWriter, r *http.Request) {
	f.largeCalls.Add(1)
	b, _ := io.ReadAll(r.Body)
	if strings.Contains(string(b), `"stream":true`) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"object\":\"chat.completion.chunk\",\"model\":\"large\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"large answer\"}}]}\n\ndata: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"id":"l","object":"chat.completion","model":"large","choices":[{"index":0,"message":{"role":"assistant","content":"large answer"},"logprobs":null,"finish_reason":"stop"}]}`)
}

func chatMsg(content string, extra map[string]any) map[string]any {
	m := map[string]any{"model": "auto", "messages": []map[string]string{{"role": "user", "content": content}}}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// TestCascadeAcceptsOrEscalates: a confident small answer is kept (the large
// worker never called, logprobs requested from the small one and removed
// from the answer when the client did not ask); an unsure one or an empty
// one is escalated; a streamed request goes straight to the last step.
func TestCascadeAcceptsOrEscalates(t *testing.T) {
	c := newCluster(t, cascadeRoutes, []clusterOpt{keys()})
	f := &cascadeFakes{}
	c.addFake("small-1", "small", f.small)
	c.addFake("large-1", "large", f.large)
	content := func(b []byte) (string, any) {
		var v struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
				Logprobs any `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &v); err != nil || len(v.Choices) == 0 {
			t.Fatalf("answer %s: %v", b, err)
		}
		return v.Choices[0].Message.Content, v.Choices[0].Logprobs
	}

	// Confident: kept, large never called.
	r := c.post("/v1/chat/completions", "key-debug", chatMsg("I am sure", nil))
	text, lp := content(r.body)
	if r.status != 200 || text != "small answer" || f.largeCalls.Load() != 0 {
		t.Fatalf("confident: %d %q, large called %d times", r.status, text, f.largeCalls.Load())
	}
	if lp != nil {
		t.Fatalf("forced logprobs leaked to a client that did not ask: %v", lp)
	}
	if got := r.header.Get("X-TL-Cascade-Step"); got != "0" {
		t.Fatalf("X-TL-Cascade-Step %q, want 0", got)
	}
	f.mu.Lock()
	if f.smallBodies[0]["logprobs"] != true {
		t.Fatalf("small step not asked for logprobs: %v", f.smallBodies[0])
	}
	f.mu.Unlock()

	// The client asked for logprobs: they are returned.
	r = c.post("/v1/chat/completions", "key-plain", chatMsg("I am sure", map[string]any{"logprobs": true}))
	if _, lp := content(r.body); lp == nil {
		t.Fatal("logprobs the client asked for were removed")
	}

	// Unsure: escalated to the large model.
	r = c.post("/v1/chat/completions", "key-debug", chatMsg("I am unsure", nil))
	if text, _ := content(r.body); text != "large answer" || f.largeCalls.Load() != 1 || r.header.Get("X-TL-Cascade-Step") != "1" {
		t.Fatalf("unsure: %q step %q large calls %d", text, r.header.Get("X-TL-Cascade-Step"), f.largeCalls.Load())
	}

	// No tokens: never accepted.
	r = c.post("/v1/chat/completions", "key-plain", chatMsg("empty please", nil))
	if text, _ := content(r.body); text != "large answer" || f.largeCalls.Load() != 2 {
		t.Fatalf("empty answer accepted: %q", text)
	}

	// Streamed: straight to the last step, the small model never asked.
	f.mu.Lock()
	before := len(f.smallBodies)
	f.mu.Unlock()
	r = c.post("/v1/chat/completions", "key-plain", chatMsg("I am sure", map[string]any{"stream": true}))
	if r.status != 200 || !strings.Contains(completionText(t, r.body), "large answer") {
		t.Fatalf("streamed cascade: %d %s", r.status, r.body)
	}
	f.mu.Lock()
	after := len(f.smallBodies)
	f.mu.Unlock()
	if after != before || f.largeCalls.Load() != 3 {
		t.Fatalf("streamed request asked the small model (%d -> %d) or not the large (%d)", before, after, f.largeCalls.Load())
	}
	_, _, cascades := c.hooks.snapshot()
	want := "auto:0:accepted,auto:0:accepted,auto:0:escalated,auto:0:escalated"
	if strings.Join(cascades, ",") != want {
		t.Fatalf("cascade decisions %v, want %s", cascades, want)
	}
}

// TestCascadeEndToEnd runs the cascade over reference engines of a small
// and a large model: for each prompt the gateway's choice matches the
// small model's mean token logprob against the rule, computed here from the
// small engine's own answer.
func TestCascadeEndToEnd(t *testing.T) {
	c := newCluster(t, cascadeRoutes, nil,
		enginesim.Config{ID: "small-1", Model: "small", Confidence: 0.5},
		enginesim.Config{ID: "large-1", Model: "large", Confidence: 0.9})
	small := c.engines["small-1"]
	accepted, escalated := 0, 0
	for i := range 16 {
		prompt := fmt.Sprintf("Question %d: what is the answer to item %d?", i, i*7)
		body := map[string]any{"model": "auto", "prompt": prompt, "max_tokens": 8, "seed": i}
		r := c.post("/v1/completions", "", body)
		if r.status != 200 {
			t.Fatalf("prompt %d: %d %s", i, r.status, r.body)
		}
		var got struct {
			Model   string `json:"model"`
			Choices []struct {
				Logprobs any `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(r.body, &got); err != nil {
			t.Fatal(err)
		}
		if got.Choices[0].Logprobs != nil {
			t.Fatalf("prompt %d: forced logprobs returned", i)
		}
		// The small model's own answer with logprobs, straight from it.
		direct := map[string]any{"model": "small", "prompt": prompt, "max_tokens": 8, "seed": i, "logprobs": 0}
		dr := c.postTo(small.URL()+"/v1/completions", direct)
		var dv struct {
			Choices []struct {
				Logprobs struct {
					TokenLogprobs []float64 `json:"token_logprobs"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(dr, &dv); err != nil {
			t.Fatal(err)
		}
		lps := dv.Choices[0].Logprobs.TokenLogprobs
		mean := 0.0
		for _, l := range lps {
			mean += l
		}
		mean /= math.Max(1, float64(len(lps)))
		wantModel := "large"
		if len(lps) > 0 && mean > -1.2 {
			wantModel = "small"
			accepted++
		} else {
			escalated++
		}
		if got.Model != wantModel {
			t.Fatalf("prompt %d: mean logprob %.3f, answered by %s, want %s", i, mean, got.Model, wantModel)
		}
	}
	if accepted == 0 || escalated == 0 {
		t.Fatalf("the cascade made no real decisions: %d accepted, %d escalated", accepted, escalated)
	}
	t.Logf("%d accepted, %d escalated", accepted, escalated)
}

// TestCascadeFallbackWhenLaterStepHasNoCapacity: a cascade whose first
// step answers but is not accepted, and whose later step cannot run (no
// worker of it, its model drained, its workers refusing connections),
// answers with the first step's answer (the logprobs it was asked for
// removed) and X-TL-Cascade-Escalation saying which step failed and why,
// to every key; a route with on_escalation_failure = "error" answers the
// later step's error instead, naming the step. An accepted answer carries
// no such header.
func TestCascadeFallbackWhenLaterStepHasNoCapacity(t *testing.T) {
	logs := &syncBuffer{}
	c := newClusterGateway(t, cascadeRoutes+`
[[gateway.routes]]
model = "auto-strict"
cascade = [{ model = "small", accept_if = "mean_logprob > -1.2" }, { model = "large" }]
on_escalation_failure = "error"
`, []clusterOpt{keys()}, nil, func(o *gateway.Options) { o.Logger = zerolog.New(logs) })
	f := &cascadeFakes{}
	c.addFake("small-1", "small", f.small)

	fallback := func(what, model, reason string) {
		t.Helper()
		for _, key := range []string{"key-plain", "key-debug"} {
			r := c.post("/v1/chat/completions", key, chatMsg("I am unsure", map[string]any{"model": model}), "X-Request-Id", what)
			if r.status != http.StatusOK || completionText(t, r.body) != "small answer" {
				t.Fatalf("%s (%s): %d %s, want the small answer", what, key, r.status, r.body)
			}
			if got, want := r.header.Get("X-TL-Cascade-Escalation"), "failed; step=1; model=large; reason="+reason; got != want {
				t.Fatalf("%s (%s): X-TL-Cascade-Escalation %q, want %q", what, key, got, want)
			}
			if strings.Contains(string(r.body), `"logprob":`) {
				t.Fatalf("%s: the forced logprobs reached the client: %s", what, r.body)
			}
		}
		var lines []map[string]any
		eventually(t, 5*eventuallyUnit, func() bool { lines = accessLines(t, logs, what); return len(lines) == 2 }, "the access log lines")
		if lines[0]["escalation_failed"] != "step 1 (large): "+reason || lines[0]["status"] != float64(200) {
			t.Fatalf("%s: access log %v, want escalation_failed and status 200", what, lines[0])
		}
	}
	strict := func(what string) {
		t.Helper()
		r := c.post("/v1/chat/completions", "key-plain", chatMsg("I am unsure", map[string]any{"model": "auto-strict"}))
		if r.status != http.StatusServiceUnavailable || errorCode(t, r.body) != "no_capacity" || r.header.Get("Retry-After") == "" ||
			!strings.Contains(string(r.body), "step 1 (large) could not run") || r.header.Get("X-TL-Cascade-Escalation") != "" {
			t.Fatalf("%s, on_escalation_failure error: %d %s, want 503 no_capacity naming step 1 (large)", what, r.status, r.body)
		}
	}

	fallback("no-large-worker", "auto", "no_capacity")
	strict("no large worker")

	large := c.addFake("large-1", "large", f.large)
	r := c.post("/v1/chat/completions", "key-plain", chatMsg("I am unsure", nil))
	if r.status != http.StatusOK || completionText(t, r.body) != "large answer" || r.header.Get("X-TL-Cascade-Escalation") != "" {
		t.Fatalf("with a large worker: %d %s (escalation %q)", r.status, r.body, r.header.Get("X-TL-Cascade-Escalation"))
	}
	r = c.post("/v1/chat/completions", "key-plain", chatMsg("I am sure", nil))
	if r.status != http.StatusOK || completionText(t, r.body) != "small answer" || r.header.Get("X-TL-Cascade-Escalation") != "" {
		t.Fatalf("an accepted answer: %d %s (escalation %q)", r.status, r.body, r.header.Get("X-TL-Cascade-Escalation"))
	}

	if r := c.post("/admin/v1/models/large:drain", "key-admin", nil); r.status != http.StatusAccepted {
		t.Fatalf("drain large: %d %s", r.status, r.body)
	}
	eventually(t, 5*eventuallyUnit, func() bool { w, _ := c.drillWorker("large-1"); return !w.Routable }, "large-1 drained")
	fallback("large-drained", "auto", "no_capacity")
	strict("large drained")
	if r := c.post("/admin/v1/models/large:resume", "key-admin", nil); r.status != http.StatusAccepted {
		t.Fatalf("resume large: %d %s", r.status, r.body)
	}

	c.waitRoutable("large-1")

	// The large worker refuses connections (it still heartbeats): the
	// attempt on it fails, then it is ejected.
	large.srv.Listener.Close()
	large.srv.CloseClientConnections()
	fallback("large-refusing", "auto", "no_capacity")
	strict("large refusing")
}

// TestCascadeStepErrorAnswerRelayed: a step before the last that answers
// with an error of its own (a 4xx) has it relayed to the client whole, its
// status, message and code: there are no forced logprobs to take out.
func TestCascadeStepErrorAnswerRelayed(t *testing.T) {
	c := newCluster(t, cascadeRoutes, []clusterOpt{keys()})
	f := &cascadeFakes{}
	c.addFake("small-1", "small", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"message":"This model's maximum context length is 2048 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`)
	})
	c.addFake("large-1", "large", f.large)
	for _, extra := range []map[string]any{nil, {"logprobs": true}} {
		r := c.post("/v1/chat/completions", "key-debug", chatMsg("a long prompt", extra))
		if r.status != http.StatusBadRequest || errorCode(t, r.body) != "context_length_exceeded" ||
			!strings.Contains(string(r.body), "maximum context length is 2048 tokens") || r.header.Get("Content-Type") != "application/json" {
			t.Fatalf("logprobs %v: %d %q (%s), want the small engine's 400 context_length_exceeded whole", extra, r.status, r.body, r.header.Get("Content-Type"))
		}
	}
}

// TestCascadeStepsLeaveFailoverBudget: a three-step cascade under the
// default max_attempts (3) whose first two steps answer and are
// escalated, and whose last step's first worker fails before the first
// byte: the request fails over to the last step's other worker, since
// the steps that answered were not failed attempts.
func TestCascadeStepsLeaveFailoverBudget(t *testing.T) {
	c := newCluster(t, `
[[gateway.routes]]
model = "auto"
cascade = [{ model = "small", accept_if = "mean_logprob > -1.2" }, { model = "medium", accept_if = "mean_logprob > -1.2" }, { model = "large" }]
`, []clusterOpt{keys()})
	f := &cascadeFakes{}
	c.addFake("small-1", "small", f.small)
	c.addFake("medium-1", "medium", f.small)
	var failed atomic.Int32
	c.addFake("large-1", "large", func(w http.ResponseWriter, _ *http.Request) {
		failed.Add(1)
		http.Error(w, `{"error":{"message":"restarting"}}`, http.StatusServiceUnavailable)
	})
	c.addFake("large-2", "large", f.large)
	r := c.post("/v1/chat/completions", "key-debug", chatMsg("I am unsure", nil))
	if r.status != http.StatusOK || r.header.Get("X-TL-Cascade-Escalation") != "" || !strings.Contains(string(r.body), "large answer") {
		t.Fatalf("%d escalation %q: %s, want large-2's answer", r.status, r.header.Get("X-TL-Cascade-Escalation"), r.body)
	}
	if failed.Load() != 1 || f.largeCalls.Load() != 1 {
		t.Fatalf("large-1 asked %d times, large-2 %d, want once each", failed.Load(), f.largeCalls.Load())
	}
}

// TestCascadeUnjudgedAnswersGoToLastStep: a request whose answer accept_if
// cannot judge on one choice's completion tokens (n above 1: only the
// first choice would be judged; echo: the prompt's tokens' logprobs come
// first) goes straight to the last step, as a stream does; n = 1 and echo
// false are judged as usual.
func TestCascadeUnjudgedAnswersGoToLastStep(t *testing.T) {
	c := newCluster(t, cascadeRoutes, []clusterOpt{keys()})
	f := &cascadeFakes{}
	c.addFake("small-1", "small", f.small)
	c.addFake("large-1", "large", f.large)
	cases := []struct {
		extra map[string]any
		large bool
	}{
		{map[string]any{"n": 2}, true},
		{map[string]any{"echo": true}, true},
		{map[string]any{"n": 1, "echo": false}, false},
	}
	for _, tc := range cases {
		before := f.largeCalls.Load()
		r := c.post("/v1/chat/completions", "key-debug", chatMsg("I am sure", tc.extra))
		if r.status != http.StatusOK {
			t.Fatalf("%v: %d %s", tc.extra, r.status, r.body)
		}
		if large := f.largeCalls.Load() > before; large != tc.large || (r.header.Get("X-TL-Cascade-Step") == "1") != tc.large {
			t.Fatalf("%v: large asked %v (step %q), want %v", tc.extra, large, r.header.Get("X-TL-Cascade-Step"), tc.large)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.smallBodies) != 1 {
		t.Fatalf("small asked %d times, want once (n = 1)", len(f.smallBodies))
	}
}
