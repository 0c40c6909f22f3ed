package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
)

// TestCacheAwareEndToEnd: under route_policy cache_aware, requests sharing
// a long system prompt, sent one after another, all go to the engine that
// got the first of them, which answers them from its prefix cache; the
// admin workers view shows that engine's share of the prefix index.
func TestCacheAwareEndToEnd(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys(), func(cfg *config.Config) { cfg.Gateway.RoutePolicy = config.PolicyCacheAware }},
		enginesim.Config{ID: "w1", Model: "m"}, enginesim.Config{ID: "w2", Model: "m"}, enginesim.Config{ID: "w3", Model: "m"})
	sys := strings.Repeat("You answer questions about the tlgate gateway, briefly and exactly. ", 40)
	for i := range 8 {
		body := map[string]any{"model": "m", "max_tokens": 2, "messages": []map[string]string{
			{"role": "system", "content": sys}, {"role": "user", "content": fmt.Sprintf("question number %d", i)}}}
		if r := c.post("/v1/chat/completions", "key-plain", body); r.status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	c.hooks.mu.Lock()
	routed := append([]string(nil), c.hooks.routed...)
	c.hooks.mu.Unlock()
	if len(routed) != 8 {
		t.Fatalf("routed %v", routed)
	}
	home := routed[0]
	for i, id := range routed {
		if id != home {
			t.Fatalf("request %d went to %s, the shared prompt is on %s (%v)", i, id, home, routed)
		}
	}
	if s := c.engines[home].Stats(); s.PrefixHits == 0 {
		t.Fatalf("%s: no prefix cache hits (%d queries)", home, s.PrefixQueries)
	}

	r := c.get("/admin/v1/workers", "key-admin")
	var view struct {
		Workers []struct {
			ID     string `json:"id"`
			Chunks *int   `json:"prefix_index_chunks"`
		} `json:"workers"`
	}
	if err := json.Unmarshal(r.body, &view); err != nil || r.status != http.StatusOK || len(view.Workers) != 3 {
		t.Fatalf("workers: %d %s (%v)", r.status, r.body, err)
	}
	for _, w := range view.Workers {
		if w.Chunks == nil {
			t.Fatalf("%s: no prefix_index_chunks in %s", w.ID, r.body)
		}
		if held := *w.Chunks > 0; held != (w.ID == home) {
			t.Errorf("%s holds %d chunks (home %s)", w.ID, *w.Chunks, home)
		}
	}
}

// TestCacheSaltSeparatesPrefixes: vLLM's cache_salt keys the gateway's
// prefix index (and the reference engine's prefix cache): a salted request
// is never a hit on prompts sent unsalted or with another salt, only on
// its own salt's, and an unsalted one never on a salted one's.
func TestCacheSaltSeparatesPrefixes(t *testing.T) {
	var mu sync.Mutex
	var total int // tokens the prefix index matched, over every pick
	c := newClusterDeps(t, "", []clusterOpt{keys(), func(cfg *config.Config) { cfg.Gateway.RoutePolicy = config.PolicyCacheAware }},
		func(d *request.Deps) {
			logged := d.OnRouted
			d.OnRouted = func(ex *request.Exchange, tg router.Target, took time.Duration) {
				logged(ex, tg, took)
				mu.Lock()
				total += tg.MatchedTokens
				mu.Unlock()
			}
		},
		enginesim.Config{ID: "w1", Model: "m"}, enginesim.Config{ID: "w2", Model: "m"})
	sys := strings.Repeat("Every tenant of this gateway shares this long system prompt word for word. ", 30)
	matched := func() int {
		mu.Lock()
		defer mu.Unlock()
		return total
	}
	hits := func() (n uint64) {
		for _, e := range c.engines {
			n += e.Stats().PrefixHits
		}
		return n
	}
	for i, tc := range []struct {
		salt string
		hit  bool
	}{
		{"", false}, {"", true}, // the index holds the unsalted prompt
		{"tenant-a", false}, {"tenant-a", true}, // tenant a's own namespace
		{"tenant-b", false}, // another salt: none of a's
		{"", true}, {"tenant-b", true},
	} {
		body := map[string]any{"model": "m", "max_tokens": 1, "messages": []map[string]string{
			{"role": "system", "content": sys}, {"role": "user", "content": fmt.Sprintf("question %d", i)}}}
		if tc.salt != "" {
			body["cache_salt"] = tc.salt
		}
		m0, h0 := matched(), hits()
		if r := c.post("/v1/chat/completions", "key-plain", body); r.status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
		if m := matched(); (m > m0) != tc.hit {
			t.Fatalf("request %d (salt %q): the index matched %d tokens, want a hit: %v", i, tc.salt, m-m0, tc.hit)
		}
		if h := hits(); (h > h0) != tc.hit {
			t.Fatalf("request %d (salt %q): the engines' prefix cache hit %d tokens, want a hit: %v", i, tc.salt, h-h0, tc.hit)
		}
	}
	// A bad salt is refused, naming it.
	r := c.post("/v1/completions", "key-plain", map[string]any{"model": "m", "prompt": "x", "cache_salt": 7})
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), `"param":"cache_salt"`) {
		t.Fatalf("cache_salt 7: %d %s", r.status, r.body)
	}
}
