package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// probedEngine is an engine that sends no heartbeats, written by the test
// in the shape of vLLM (kind "vllm") or llama.cpp's server (kind
// "llamacpp"): GET /health, /metrics with the kind's names, /v1/models,
// /props (llama.cpp), and POST /v1/completions. The gateway learns of it
// from [[gateway.engines]] and probes it.
//
// Its health can fail, and failing health answers can be gated: each one
// then waits for a token on gate, so the test decides when the gateway's
// probe loop sees each failure.
type probedEngine struct {
	t    *testing.T
	kind string
	srv  *httptest.Server
	quit chan struct{}

	arrived chan struct{} // a gated health check arrived (buffered)
	gate    chan struct{} // a token answers one gated health check
	checks  atomic.Int64  // health checks received

	mu          sync.Mutex
	model       string        // served by /v1/models and named in answers
	healthFail  bool          // /health answers 503
	gated       bool          // failing health answers wait for gate
	healed      chan struct{} // closed by heal: gated checks answer at once
	dead        bool          // /v1/completions drops the connection, unanswered
	completions func(w http.ResponseWriter, body map[string]any)
	bodies      []map[string]any // /v1/completions bodies received
}

func newProbedEngine(t *testing.T, kind, model string) *probedEngine {
	t.Helper()
	e := &probedEngine{t: t, kind: kind, model: model, quit: make(chan struct{}),
		arrived: make(chan struct{}, 16), gate: make(chan struct{})}
	e.srv = httptest.NewServer(e)
	t.Cleanup(e.close)
	return e
}

func (e *probedEngine) addr() string { return e.srv.Listener.Addr().String() }

// close stops the server once (releasing gated health checks).
func (e *probedEngine) close() {
	select {
	case <-e.quit:
		return
	default:
	}
	close(e.quit)
	e.srv.CloseClientConnections()
	e.srv.Close()
}

func (e *probedEngine) set(f func(e *probedEngine)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(e)
}

// toml is the engine's [[gateway.engines]] entry.
func (e *probedEngine) toml(id, model string) string {
	return fmt.Sprintf("\n[[gateway.engines]]\nid = %q\nhttp_address = %q\nmodel = %q\nkind = %q\nprobe_interval = \"50ms\"\n", id, e.addr(), model, e.kind)
}

func (e *probedEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	model, healthFail, gated, healed, dead, complete := e.model, e.healthFail, e.gated, e.healed, e.dead, e.completions
	e.mu.Unlock()
	switch r.Method + " " + r.URL.Path {
	case "GET /health":
		e.checks.Add(1)
		if !healthFail {
			fmt.Fprint(w, `{"status":"ok"}`)
			return
		}
		if gated {
			e.arrived <- struct{}{}
			select {
			case <-e.gate:
			case <-healed: // began while failing: still a failure
			case <-e.quit:
			case <-r.Context().Done():
				return
			}
		}
		http.Error(w, `{"error":"engine dead"}`, http.StatusServiceUnavailable)
	case "GET /metrics":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		if e.kind == config.KindLlamaCPP {
			fmt.Fprint(w, "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 0\n# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n")
			return
		}
		fmt.Fprintf(w, `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name=%[1]q} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name=%[1]q} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name=%[1]q} 0.5
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
`, model)
	case "GET /props":
		fmt.Fprint(w, `{"default_generation_settings":{"n_ctx":8192},"total_slots":1}`)
	case "GET /v1/models":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":%q}]}`, model, e.kind)
	case "POST /v1/completions":
		if dead {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		b, _ := io.ReadAll(r.Body)
		var body map[string]any
		if err := json.Unmarshal(b, &body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		e.mu.Lock()
		e.bodies = append(e.bodies, body)
		e.mu.Unlock()
		if complete != nil {
			complete(w, body)
			return
		}
		text := "from " + model
		if body["stream"] == true {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"text_completion\",\"model\":%q,\"choices\":[{\"index\":0,\"text\":%q,\"finish_reason\":null}]}\n\n", model, text)
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"text_completion\",\"model\":%q,\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n", model)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"text_completion","model":%q,"choices":[{"index":0,"text":%q,"logprobs":null,"finish_reason":"stop"}]}`, model, text)
	default:
		http.NotFound(w, r)
	}
}

// received returns the /v1/completions bodies so far.
func (e *probedEngine) received() []map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.bodies)
}

// failHealth makes every health check fail; each waits for release (or
// heal).
func (e *probedEngine) failHealth() {
	e.set(func(e *probedEngine) { e.healthFail, e.gated, e.healed = true, true, make(chan struct{}) })
}

// heal makes the engine work again; a health check waiting for release
// answers its failure at once.
func (e *probedEngine) heal() {
	e.set(func(e *probedEngine) {
		e.healthFail, e.gated, e.dead = false, false, false
		if e.healed != nil {
			close(e.healed)
			e.healed = nil
		}
	})
}

// awaitProbe waits for the next gated health check to arrive.
func (e *probedEngine) awaitProbe() {
	e.t.Helper()
	select {
	case <-e.arrived:
	case <-time.After(10 * time.Second):
		e.t.Fatal("no health probe arrived within 10s")
	}
}

// release answers one waiting health check with 503.
func (e *probedEngine) release() {
	e.t.Helper()
	select {
	case e.gate <- struct{}{}:
	case <-time.After(10 * time.Second):
		e.t.Fatal("no health probe waiting within 10s")
	}
}

// slowRegistry makes the registry's own deadline (k·T = 3 s) too long to
// matter: the probe loop alone decides when a probed engine goes.
func slowRegistry() clusterOpt {
	return func(c *config.Config) { c.Gateway.HeartbeatInterval = config.D(time.Second) }
}

// worker returns the router's view of id, and whether it is listed as a
// worker (an engine listed down is not one).
func (c *cluster) worker(id string) (fleet.Worker, bool, bool) {
	c.t.Helper()
	for _, w := range c.workers() {
		if w.ID == id && w.State != router.StateDown {
			return w.Worker, w.Routable, true
		}
	}
	return fleet.Worker{}, false, false
}

func completion(model string, stream bool) map[string]any {
	return map[string]any{"model": model, "prompt": "hello", "max_tokens": 4, "stream": stream}
}

// TestProbedEngineDiesFailsOver: a probed vLLM engine whose process dies
// (health failing, completions dropped unanswered) stays routable through
// heartbeat_miss_limit-1 failed probes, during which its requests fail over
// before the first byte to a heartbeating worker; the k-th failed probe
// removes it at once; two good probes bring it back.
func TestProbedEngineDiesFailsOver(t *testing.T) {
	a := newProbedEngine(t, config.KindVLLM, "m")
	c := newCluster(t, a.toml("a-vllm", "m"), []clusterOpt{slowRegistry()}, enginesim.Config{ID: "b-sim", Model: "m"})
	c.waitRoutable("a-vllm")
	w, _, _ := c.worker("a-vllm")
	if w.Source != fleet.SourceProbe || w.Kind != config.KindVLLM || w.Model != "m" || w.KVTotalBlocks != 1000 || w.KVFreeBlocks != 500 {
		t.Fatalf("probed worker %+v: want source probe, kind vllm, model m and the KV figures of its /metrics", w)
	}
	// Both idle: ties go to the smallest id, the probed engine.
	if r := c.post("/v1/completions", "", completion("m", false)); r.status != http.StatusOK || completionText(t, r.body) != "from m" {
		t.Fatalf("request to the live probed engine: %d %s", r.status, r.body)
	}

	a.set(func(e *probedEngine) { e.dead = true })
	a.failHealth()
	const k = 3 // heartbeat_miss_limit
	for range k - 1 {
		a.awaitProbe()
		a.release()
	}
	a.awaitProbe() // the k-th failing probe is waiting: k-1 failures were seen
	if _, routable, _ := c.worker("a-vllm"); !routable {
		t.Fatalf("a-vllm not routable after %d failed probes: fewer than heartbeat_miss_limit must be tolerated", k-1)
	}
	for _, stream := range []bool{false, true} {
		r := c.post("/v1/completions", "", completion("m", stream))
		if r.status != http.StatusOK {
			t.Fatalf("stream=%v: status %d %s", stream, r.status, r.body)
		}
		if stream && !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
			t.Fatalf("stream did not finish: %s", r.body)
		}
		if got := completionText(t, r.body); got == "" || strings.Contains(got, "from m") {
			t.Fatalf("stream=%v: text %q, want the reference engine's", stream, got)
		}
	}
	routed, failovers, _ := c.hooks.snapshot()
	if strings.Join(routed, ",") != "a-vllm,a-vllm,b-sim,a-vllm,b-sim" {
		t.Fatalf("routed %v: want the dead probed engine tried first, then b-sim", routed)
	}
	if len(failovers) != 2 {
		t.Fatalf("failovers %v, want one from a-vllm per request", failovers)
	}
	for _, f := range failovers {
		if f != "a-vllm:eof" && f != "a-vllm:reset" { // the connection dropped unanswered
			t.Fatalf("failovers %v, want a-vllm:eof or a-vllm:reset", failovers)
		}
	}

	a.release() // the k-th failure
	eventually(t, 5*time.Second, func() bool { _, _, listed := c.worker("a-vllm"); return !listed }, "a-vllm removed")
	for range 2 {
		if r := c.post("/v1/completions", "", completion("m", false)); r.status != http.StatusOK {
			t.Fatalf("after removal: %d %s", r.status, r.body)
		}
	}
	routed, failovers, _ = c.hooks.snapshot()
	if strings.Join(routed[5:], ",") != "b-sim,b-sim" || len(failovers) != 2 {
		t.Fatalf("after removal routed %v failovers %v: the removed engine was tried", routed[5:], failovers)
	}

	// It recovers: two good probes, routable again, served.
	a.heal()
	c.waitRoutable("a-vllm")
	if r := c.post("/v1/completions", "", completion("m", false)); r.status != http.StatusOK || completionText(t, r.body) != "from m" {
		t.Fatalf("after recovery: %d %s", r.status, r.body)
	}
}

// TestProbedEngineServerClosed: a probed engine's server goes away
// altogether; requests succeed on another probed engine (failing over from
// the closed one while it is still listed) and it is removed.
func TestProbedEngineServerClosed(t *testing.T) {
	a, b := newProbedEngine(t, config.KindVLLM, "m"), newProbedEngine(t, config.KindVLLM, "m")
	c := newCluster(t, a.toml("a-vllm", "m")+b.toml("b-vllm", "m"), nil)
	c.waitRoutable("a-vllm", "b-vllm")
	a.close()
	r := c.post("/v1/completions", "", completion("m", true))
	if r.status != http.StatusOK || completionText(t, r.body) != "from m" || !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
		t.Fatalf("request with a-vllm closed: %d %s", r.status, r.body)
	}
	routed, failovers, _ := c.hooks.snapshot()
	switch strings.Join(routed, ",") {
	case "b-vllm": // the probes removed a-vllm first
	case "a-vllm,b-vllm":
		if len(failovers) != 1 || failovers[0] != "a-vllm:refused" {
			t.Fatalf("failovers %v, want a-vllm:refused", failovers)
		}
	default:
		t.Fatalf("routed %v", routed)
	}
	if n := len(b.received()); n != 1 {
		t.Fatalf("b-vllm got %d requests, want 1", n)
	}
	eventually(t, 5*time.Second, func() bool { _, _, listed := c.worker("a-vllm"); return !listed }, "a-vllm removed")
	before := len(routed)
	if r := c.post("/v1/completions", "", completion("m", false)); r.status != http.StatusOK {
		t.Fatalf("after removal: %d %s", r.status, r.body)
	}
	if routed, _, _ := c.hooks.snapshot(); strings.Join(routed[before:], ",") != "b-vllm" {
		t.Fatalf("after removal routed %v", routed[before:])
	}
}

// TestProbedModelDiscovery: with no model configured, the probed engine's
// model is the first id of its /v1/models, requests for it reach the engine
// under that id, and an engine restarted with another model (a failed probe
// in between) is rediscovered under the new one.
func TestProbedModelDiscovery(t *testing.T) {
	d := newProbedEngine(t, config.KindVLLM, "org/discovered-7b")
	// The engine is given to the gateway without a model.
	withEngine := func(cfg *config.Config) {
		cfg.Gateway.Engines = append(cfg.Gateway.Engines, config.Engine{
			ID: "d-vllm", HTTPAddress: d.addr(), Kind: config.KindVLLM, ProbeInterval: config.D(50 * time.Millisecond),
		})
	}
	c := newCluster(t, "", []clusterOpt{slowRegistry(), withEngine})
	c.waitRoutable("d-vllm")
	if w, _, _ := c.worker("d-vllm"); w.Model != "org/discovered-7b" || w.Source != fleet.SourceProbe {
		t.Fatalf("worker %+v: want the discovered model", w)
	}
	r := c.post("/v1/completions", "", completion("org/discovered-7b", false))
	if r.status != http.StatusOK || completionText(t, r.body) != "from org/discovered-7b" {
		t.Fatalf("request for the discovered model: %d %s", r.status, r.body)
	}
	if got := d.received(); len(got) != 1 || got[0]["model"] != "org/discovered-7b" {
		t.Fatalf("engine received %v", got)
	}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if r := c.get("/v1/models", ""); json.Unmarshal(r.body, &models) != nil || !slices.ContainsFunc(models.Data, func(m struct {
		ID string `json:"id"`
	}) bool {
		return m.ID == "org/discovered-7b"
	}) {
		t.Fatalf("/v1/models does not list the discovered model: %s", r.body)
	}

	// Restarted with another model: one failed probe, then good ones.
	d.failHealth()
	d.awaitProbe()
	d.set(func(e *probedEngine) { e.model = "org/other-13b" })
	d.heal() // the waiting probe fails; the next ones succeed
	eventually(t, 5*time.Second, func() bool { w, routable, _ := c.worker("d-vllm"); return routable && w.Model == "org/other-13b" },
		"d-vllm rediscovered as org/other-13b")
	if r := c.post("/v1/completions", "", completion("org/other-13b", false)); r.status != http.StatusOK || completionText(t, r.body) != "from org/other-13b" {
		t.Fatalf("request for the new model: %d %s", r.status, r.body)
	}
	if r := c.post("/v1/completions", "", completion("org/discovered-7b", false)); r.status != http.StatusNotFound || errorCode(t, r.body) != "model_not_found" {
		t.Fatalf("request for the old model: %d %s", r.status, r.body)
	}
}

// llamaCompletions answers /v1/completions as llama.cpp's server does, with
// the chat shape of logprobs (choices[0].logprobs.content[].logprob), only
// when asked for at least one alternative per token (llama.cpp reads
// "logprobs" as n_probs, and 0 as none), with that many top_logprobs; a
// prompt that says "unsure" gets low logprobs.
func llamaCompletions(w http.ResponseWriter, body map[string]any) {
	lp := -0.2
	if strings.Contains(fmt.Sprint(body["prompt"]), "unsure") {
		lp = -2.5
	}
	nProbs := 0
	switch v := body["logprobs"].(type) {
	case float64:
		nProbs = int(v)
	case bool:
		if v {
			nProbs = 1
		}
	}
	logprobs := "null"
	if nProbs > 0 {
		var toks []string
		for i, tok := range []string{" Paris", ",", " of", " course"} {
			var top []string
			for k := range nProbs {
				top = append(top, fmt.Sprintf(`{"id":%d,"token":"alt%d","bytes":[],"logprob":%v}`, 200+k, k, lp-float64(i)*0.1-float64(k)))
			}
			toks = append(toks, fmt.Sprintf(`{"id":%d,"token":%q,"bytes":[],"logprob":%v,"top_logprobs":[%s]}`, 100+i, tok, lp-float64(i)*0.1, strings.Join(top, ",")))
		}
		logprobs = `{"content":[` + strings.Join(toks, ",") + `]}`
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"cmpl-l","object":"text_completion","model":"small","choices":[{"index":0,"text":" Paris, of course","logprobs":%s,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}}`, logprobs)
}

// TestProbedLlamaCppCascadeStep: a probed llama.cpp engine answering
// /v1/completions with chat-shaped logprobs is a cascade's first step: a
// confident answer is kept (its forced logprobs not returned), an unsure one
// escalated to the probed vLLM engine of the last step.
func TestProbedLlamaCppCascadeStep(t *testing.T) {
	small := newProbedEngine(t, config.KindLlamaCPP, "small")
	small.set(func(e *probedEngine) { e.completions = llamaCompletions })
	big := newProbedEngine(t, config.KindVLLM, "big")
	c := newCluster(t, `
[[gateway.routes]]
model = "auto"
cascade = [{ model = "small", accept_if = "mean_logprob > -1" }, { model = "big" }]
`+small.toml("small-llama", "small")+big.toml("big-vllm", "big"), nil)
	c.waitRoutable("small-llama", "big-vllm")
	if w, _, _ := c.worker("small-llama"); w.Kind != config.KindLlamaCPP || w.KVTotalBlocks != 8192 {
		t.Fatalf("llama.cpp worker %+v: want kind llamacpp and its n_ctx as capacity", w)
	}

	ask := func(prompt string) (string, any) {
		t.Helper()
		r := c.post("/v1/completions", "", map[string]any{"model": "auto", "prompt": prompt, "max_tokens": 4})
		var v struct {
			Choices []struct {
				Text     string `json:"text"`
				Logprobs any    `json:"logprobs"`
			} `json:"choices"`
		}
		if r.status != http.StatusOK || json.Unmarshal(r.body, &v) != nil || len(v.Choices) != 1 {
			t.Fatalf("cascade %q: %d %s", prompt, r.status, r.body)
		}
		return v.Choices[0].Text, v.Choices[0].Logprobs
	}
	text, lp := ask("I am sure: the capital of France is")
	if text != " Paris, of course" || lp != nil {
		t.Fatalf("confident: text %q logprobs %v, want the small answer without the forced logprobs", text, lp)
	}
	if n := len(big.received()); n != 0 {
		t.Fatalf("big asked %d times for a confident answer", n)
	}
	if got := small.received(); len(got) != 1 || got[0]["logprobs"] != float64(1) || got[0]["model"] != "small" {
		t.Fatalf("small step received %v, want logprobs forced to 1 (llama.cpp's least) and model small", got)
	}
	text, _ = ask("I am unsure: the capital of France is")
	if text != "from big" || len(big.received()) != 1 {
		t.Fatalf("unsure: text %q, big asked %d times", text, len(big.received()))
	}
	if got := big.received(); got[0]["model"] != "big" {
		t.Fatalf("big received %v", got[0])
	}
	_, _, cascades := c.hooks.snapshot()
	if strings.Join(cascades, ",") != "auto:0:accepted,auto:0:escalated" {
		t.Fatalf("cascade decisions %v", cascades)
	}
}

// TestCompletionsCascadeOnLlamaCppLogprobs: a /v1/completions cascade whose
// first step is a llama.cpp server (which answers "logprobs": 0 with no
// logprobs at all) asks it for one alternative per token, so a confident
// answer is accepted; the client gets no logprobs when it asked for none,
// and no more alternatives than it asked for.
func TestCompletionsCascadeOnLlamaCppLogprobs(t *testing.T) {
	small := newProbedEngine(t, config.KindLlamaCPP, "small")
	small.set(func(e *probedEngine) { e.completions = llamaCompletions })
	big := newProbedEngine(t, config.KindVLLM, "big")
	c := newCluster(t, `
[[gateway.routes]]
model = "auto"
cascade = [{ model = "small", accept_if = "mean_logprob > -1" }, { model = "big" }]
`+small.toml("small-llama", "small")+big.toml("big-vllm", "big"), nil)
	c.waitRoutable("small-llama", "big-vllm")
	type tok struct {
		Logprob float64           `json:"logprob"`
		Top     []json.RawMessage `json:"top_logprobs"`
	}
	for _, tc := range []struct {
		name     string
		logprobs any // the client's; nil: not sent
		sent     float64
		tops     int // alternatives per token in the answer; -1: no logprobs
	}{
		{"no logprobs", nil, 1, -1},
		{"logprobs 0", 0, 1, 0},
		{"logprobs 2", 2, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(small.received())
			body := map[string]any{"model": "auto", "prompt": "I am sure: the capital of France is", "max_tokens": 4}
			if tc.logprobs != nil {
				body["logprobs"] = tc.logprobs
			}
			r := c.post("/v1/completions", "", body)
			var v struct {
				Choices []struct {
					Text     string `json:"text"`
					Logprobs *struct {
						Content []tok `json:"content"`
					} `json:"logprobs"`
				} `json:"choices"`
			}
			if r.status != http.StatusOK || json.Unmarshal(r.body, &v) != nil || len(v.Choices) != 1 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if v.Choices[0].Text != " Paris, of course" {
				t.Fatalf("answer %q from %s, want the first step's accepted", v.Choices[0].Text, r.body)
			}
			got := small.received()[before:]
			if len(got) != 1 || got[0]["logprobs"] != tc.sent {
				t.Fatalf("llama.cpp received %v, want logprobs %v", got, tc.sent)
			}
			lp := v.Choices[0].Logprobs
			switch {
			case tc.tops < 0 && lp != nil:
				t.Fatalf("logprobs returned unasked: %s", r.body)
			case tc.tops >= 0 && (lp == nil || len(lp.Content) != 4):
				t.Fatalf("want 4 tokens' logprobs: %s", r.body)
			case tc.tops >= 0:
				for i, tk := range lp.Content {
					if len(tk.Top) != tc.tops {
						t.Fatalf("token %d has %d alternatives, want %d: %s", i, len(tk.Top), tc.tops, r.body)
					}
				}
			}
		})
	}
	if n := len(big.received()); n != 0 {
		t.Fatalf("big asked %d times for confident answers", n)
	}
}
