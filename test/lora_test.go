package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
)

// TestLoRAAdapterRouting: two heartbeating workers of one base model with
// different LoRA adapters, and a probed vLLM-like engine with a third; a
// request for each adapter lands on the worker that has it loaded
// (completions, chat and embeddings alike), the base model on any; an
// unknown adapter is model_not_found; adapters loaded and unloaded at run
// time are followed (by heartbeat and by probe); /v1/models lists each
// adapter with its base as parent, and the admin API shows them.
func TestLoRAAdapterRouting(t *testing.T) {
	probed, err := enginesim.Start(context.Background(), enginesim.Config{ID: "p1", Model: "base", Adapters: []string{"probed-lora"}, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(probed.Kill)
	c := newCluster(t, fmt.Sprintf(`
[[gateway.engines]]
id = "p1"
http_address = %q
kind = "vllm"
probe_interval = "50ms"
`, probed.HTTPAddr()), []clusterOpt{withKeys(config.APIKey{Name: "alice", Key: "key-alice", Scopes: []string{"inference", "debug"}})},
		enginesim.Config{ID: "w1", Model: "base", Adapters: []string{"sql-lora"}},
		enginesim.Config{ID: "w2", Model: "base", Adapters: []string{"chat-lora"}})
	c.waitRoutable("p1")

	ask := func(model, path string) reply {
		t.Helper()
		var body map[string]any
		switch path {
		case "/v1/completions":
			body = map[string]any{"model": model, "prompt": "SELECT", "max_tokens": 2}
		case "/v1/chat/completions":
			body = map[string]any{"model": model, "messages": []any{map[string]any{"role": "user", "content": "hi"}}, "max_tokens": 2}
		default:
			body = map[string]any{"model": model, "input": "hello"}
		}
		return c.post(path, "key-alice", body)
	}
	for _, tc := range []struct{ model, worker string }{
		{"sql-lora", "w1"}, {"chat-lora", "w2"}, {"probed-lora", "p1"},
	} {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/v1/embeddings"} {
			for range 3 {
				r := ask(tc.model, path)
				if r.status != http.StatusOK || r.header.Get("X-TL-Route") != tc.worker || gjson.GetBytes(r.body, "model").Str != tc.model {
					t.Fatalf("%s %s: %d on %q: %s; want 200 from %s", tc.model, path, r.status, r.header.Get("X-TL-Route"), r.body, tc.worker)
				}
			}
		}
	}
	for _, path := range []string{"/v1/completions", "/v1/embeddings"} {
		if r := ask("base", path); r.status != http.StatusOK || !slices.Contains([]string{"w1", "w2", "p1"}, r.header.Get("X-TL-Route")) {
			t.Fatalf("base %s: %d on %q: %s", path, r.status, r.header.Get("X-TL-Route"), r.body)
		}
	}
	r := ask("nope-lora", "/v1/completions")
	if r.status != http.StatusNotFound || gjson.GetBytes(r.body, "error.code").Str != "model_not_found" {
		t.Fatalf("unknown adapter: %d %s", r.status, r.body)
	}

	// /v1/models: each adapter with its parent; the admin API lists them.
	models := c.get("/v1/models", "key-alice")
	parents := map[string]string{}
	for _, m := range gjson.GetBytes(models.body, "data").Array() {
		parents[m.Get("id").Str] = m.Get("parent").Str
	}
	want := map[string]string{"base": "", "sql-lora": "base", "chat-lora": "base", "probed-lora": "base"}
	for id, p := range want {
		if got, ok := parents[id]; !ok || got != p {
			t.Fatalf("/v1/models: %s has parent %q (listed %v), want %q:\n%s", id, got, ok, p, models.body)
		}
	}
	if m := c.get("/v1/models/sql-lora", "key-alice"); m.status != http.StatusOK || gjson.GetBytes(m.body, "parent").Str != "base" {
		t.Fatalf("/v1/models/sql-lora: %d %s", m.status, m.body)
	}
	for _, w := range c.workers() {
		if want := map[string][]string{"w1": {"sql-lora"}, "w2": {"chat-lora"}, "p1": {"probed-lora"}}[w.ID]; !slices.Equal(w.Adapters, want) {
			t.Fatalf("%s adapters %v, want %v", w.ID, w.Adapters, want)
		}
	}

	// Loaded and unloaded at run time: followed by heartbeat and by probe.
	if err := c.engines["w2"].LoadAdapter("sql-lora"); err != nil {
		t.Fatal(err)
	}
	c.engines["w1"].UnloadAdapter("sql-lora")
	resp, err := http.Post("http://"+probed.HTTPAddr()+"/v1/unload_lora_adapter", "application/json", jsonBody(map[string]any{"lora_name": "probed-lora"}))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = http.Post("http://"+probed.HTTPAddr()+"/v1/load_lora_adapter", "application/json", jsonBody(map[string]any{"lora_name": "new-lora", "lora_path": "/x"}))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("load_lora_adapter: %v %v", resp, err)
	}
	resp.Body.Close()
	eventually(t, 10*time.Second, func() bool {
		a, b := ask("sql-lora", "/v1/completions"), ask("new-lora", "/v1/completions")
		return a.header.Get("X-TL-Route") == "w2" && b.header.Get("X-TL-Route") == "p1"
	}, "sql-lora on w2 and new-lora on p1")
	eventually(t, 10*time.Second, func() bool { return ask("probed-lora", "/v1/completions").status == http.StatusNotFound },
		"probed-lora unloaded")
}

// jsonBody encodes v as a request body.
func jsonBody(v any) *bytes.Reader {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return bytes.NewReader(b)
}
