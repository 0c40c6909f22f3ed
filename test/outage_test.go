package test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// wantNoCapacity checks that r is 503 no_capacity with a Retry-After.
func wantNoCapacity(t *testing.T, what string, r reply) {
	t.Helper()
	if r.status != http.StatusServiceUnavailable || errorCode(t, r.body) != "no_capacity" {
		t.Fatalf("%s: %d %s, want 503 no_capacity", what, r.status, r.body)
	}
	if ra := r.header.Get("Retry-After"); ra == "" || ra == "0" {
		t.Fatalf("%s: 503 no_capacity with Retry-After %q", what, ra)
	}
}

// TestOutageOfConfiguredModelIs503: a model whose engine entry's engine
// never came up is no_capacity; the only engine of a model configured
// by an engine entry stops; from its first failed request, through its
// removal by the probes and on, every request for the model is 503
// no_capacity with Retry-After, never 404 model_not_found, and the model
// stays listed. A model a heartbeating engine served is answered so too
// after that engine is evicted (recent_model_window).
func TestOutageOfConfiguredModelIs503(t *testing.T) {
	a := newProbedEngine(t, config.KindVLLM, "llama")
	cold := `
[[gateway.engines]]
id = "cold-1"
http_address = "127.0.0.1:1"
model = "cold"
kind = "vllm"
probe_interval = "50ms"
`
	c := newCluster(t, a.toml("llama-1", "llama")+cold, nil, enginesim.Config{ID: "hb-1", Model: "hbmodel"})
	c.waitRoutable("llama-1")
	// Configured, never up: known all the same.
	wantNoCapacity(t, "the model of an engine down from the start", c.post("/v1/completions", "", completion("cold", false)))
	if r := c.post("/v1/completions", "", completion("llama", false)); r.status != http.StatusOK {
		t.Fatalf("before the outage: %d %s", r.status, r.body)
	}

	a.close()
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; ; n++ {
		wantNoCapacity(t, "llama during its outage", c.post("/v1/completions", "", completion("llama", n%2 == 1)))
		if _, _, listed := c.worker("llama-1"); !listed {
			break // removed by its probes
		}
		if time.Now().After(deadline) {
			t.Fatal("llama-1 was not removed by its probes within 10 s")
		}
	}
	for i := range 5 {
		wantNoCapacity(t, "llama once its engine was removed", c.post("/v1/completions", "", completion("llama", i%2 == 1)))
	}
	if r := c.get("/v1/models/llama", ""); r.status != http.StatusOK {
		t.Fatalf("GET /v1/models/llama during the outage: %d %s", r.status, r.body)
	}
	if r := c.get("/v1/models", ""); !strings.Contains(string(r.body), `"llama"`) {
		t.Fatalf("GET /v1/models during the outage does not list llama: %s", r.body)
	}

	c.engines["hb-1"].Kill()
	eventually(t, 10*time.Second, func() bool { _, _, listed := c.worker("hb-1"); return !listed }, "hb-1 evicted")
	wantNoCapacity(t, "a model served until its engine was evicted", c.post("/v1/completions", "", completion("hbmodel", false)))
	if r := c.post("/v1/completions", "", completion("never-served", false)); r.status != http.StatusNotFound {
		t.Fatalf("a model never configured nor served: %d %s, want 404", r.status, r.body)
	}
}

// TestNoCapacityHasRetryAfter: every 503 no_capacity carries Retry-After:
// when no worker of a known model is routable, and when every attempt
// failed before the first byte (an engine that refuses connections),
// streamed or not, on the OpenAI and the Anthropic paths.
func TestNoCapacityHasRetryAfter(t *testing.T) {
	c := newCluster(t, `
[[gateway.routes]]
model = "empty"
backends = [{ model = "nobody", weight = 1 }]
`, nil)
	f := c.addFake("f1", "m", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "unused", http.StatusInternalServerError) })
	f.srv.CloseClientConnections()
	f.srv.Listener.Close() // the engine refuses connections; it still heartbeats
	for _, stream := range []bool{false, true} {
		wantNoCapacity(t, "a route with no worker", c.post("/v1/completions", "", completion("empty", stream)))
	}
	wantNoCapacity(t, "every attempt refused", c.post("/v1/completions", "", completion("m", false)))
	wantNoCapacity(t, "every attempt refused, streamed", c.post("/v1/completions", "", completion("m", true)))
	r := c.postRaw("/v1/messages", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("Messages with no capacity: %d %s (Retry-After %q), want 503 with Retry-After", r.status, r.body, r.header.Get("Retry-After"))
	}
}

// TestDownEngineListed: configured engines that are down from the start
// (nothing listens at their address) and one that serves another model
// than its entry says are listed by GET /admin/v1/workers and tlctl as
// down, with their last error, never routable, and logged; two ids at one
// address are logged. The wrong engine, once it serves its model, is a
// worker like any other.
func TestDownEngineListed(t *testing.T) {
	logs := &syncBuffer{}
	wrong := newProbedEngine(t, config.KindVLLM, "llama")
	entries := wrong.toml("wrong-1", "qwen") + `
[[gateway.engines]]
id = "down-1"
http_address = "127.0.0.1:1"
model = "gone"
kind = "vllm"
probe_interval = "50ms"

[[gateway.engines]]
id = "down-2"
http_address = "127.0.0.1:1"
kind = "vllm"
probe_interval = "50ms"
`
	c := newClusterGateway(t, entries, []clusterOpt{keys()}, nil, func(o *gateway.Options) { o.Logger = zerolog.New(logs) })
	type worker struct {
		ID        string `json:"id"`
		Model     string `json:"model"`
		State     string `json:"state"`
		Routable  bool   `json:"routable"`
		LastError string `json:"last_error"`
		DownSince string `json:"down_since"`
	}
	list := func() map[string]worker {
		r := c.get("/admin/v1/workers", "key-admin")
		var body struct{ Workers []worker }
		if r.status != http.StatusOK || json.Unmarshal(r.body, &body) != nil {
			t.Fatalf("GET /admin/v1/workers: %d %s", r.status, r.body)
		}
		out := map[string]worker{}
		for _, w := range body.Workers {
			out[w.ID] = w
		}
		return out
	}
	eventually(t, 10*time.Second, func() bool {
		ws := list()
		return ws["down-1"].State == "down" && ws["down-2"].State == "down" && ws["wrong-1"].State == "down"
	}, "the three engines listed down")
	for range 5 { // never routable, however often probed
		ws := list()
		for _, id := range []string{"down-1", "down-2", "wrong-1"} {
			w := ws[id]
			if w.State != "down" || w.Routable || w.LastError == "" || w.DownSince == "" {
				t.Fatalf("%s listed %+v, want down, not routable, with its last error and since when", id, w)
			}
		}
		if ws["down-1"].Model != "gone" || !strings.Contains(ws["down-1"].LastError, "refused") {
			t.Fatalf("down-1 listed %+v, want model gone and a refused connection", ws["down-1"])
		}
		if e := ws["wrong-1"].LastError; ws["wrong-1"].Model != "qwen" || !strings.Contains(e, `not the configured model "qwen"`) || !strings.Contains(e, `"llama"`) {
			t.Fatalf("wrong-1 listed %+v, want model qwen and an error naming what it serves", ws["wrong-1"])
		}
		time.Sleep(50 * time.Millisecond) // a probe interval
	}
	r := c.post("/v1/completions", "key-plain", completion("qwen", false))
	wantNoCapacity(t, "the model of an engine serving another", r)
	if !strings.Contains(string(r.body), "1 unified worker is down") {
		t.Fatalf("no_capacity for qwen: %s, want it to say its worker is down", r.body)
	}

	env := map[string]string{"TLGATE_URL": c.url, "TLGATE_KEY": "key-admin"}
	code, out, errOut := c.tlctl(env, "workers")
	if code != 0 || strings.Count(out, " down ") < 3 || !strings.Contains(out, "wrong-1 is down (since") || !strings.Contains(out, `not the configured model "qwen"`) {
		t.Fatalf("tlctl workers: %d\n%s%s", code, out, errOut)
	}
	eventually(t, 5*time.Second, func() bool {
		text := logs.String()
		for _, id := range []string{"down-1", "down-2", "wrong-1"} {
			if !strings.Contains(text, `"engine":"`+id+`"`) || !strings.Contains(text, "probe: engine down") {
				return false
			}
		}
		return strings.Contains(text, "several engine ids at one address") && strings.Contains(text, `"http_address":"127.0.0.1:1"`)
	}, "the down engines and the shared address logged")

	wrong.set(func(e *probedEngine) { e.model = "qwen" })
	c.waitRoutable("wrong-1")
	if w := list()["wrong-1"]; w.State != "routable" || w.LastError != "" {
		t.Fatalf("wrong-1 once it serves qwen: %+v", w)
	}
	if r := c.post("/v1/completions", "key-plain", completion("qwen", false)); r.status != http.StatusOK {
		t.Fatalf("qwen once served: %d %s", r.status, r.body)
	}
}
