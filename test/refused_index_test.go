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

// TestRefusedPromptNotIndexed: the gateway records a prompt in its prefix
// index only once an engine began to answer it. Four 1 MB prompts that
// every engine refuses (400: more KV than it has) leave a victim's warm
// 40 KB prefix where it was, so the victim's next request is matched on
// its worker again; and one long prompt that is answered takes at most
// cache_aware_max_request_share of a worker's index.
func TestRefusedPromptNotIndexed(t *testing.T) {
	type pick struct {
		worker  string
		matched int
	}
	var mu sync.Mutex
	picks := map[string]pick{} // by client request id
	c := newClusterDeps(t, "", []clusterOpt{keys(), func(cfg *config.Config) {
		cfg.Gateway.RoutePolicy = config.PolicyCacheAware
		cfg.Gateway.MaxBodyBytes = 4 << 20
	}}, func(d *request.Deps) {
		logged := d.OnRouted
		d.OnRouted = func(ex *request.Exchange, tg router.Target, took time.Duration) {
			logged(ex, tg, took)
			mu.Lock()
			picks[ex.ClientRequestID] = pick{tg.Worker.ID, tg.MatchedTokens}
			mu.Unlock()
		}
	}, enginesim.Config{ID: "w1", Model: "m"}, enginesim.Config{ID: "w2", Model: "m"})

	send := func(id, system, user string) reply {
		t.Helper()
		body := map[string]any{"model": "m", "max_tokens": 1, "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": user}}}
		return c.post("/v1/chat/completions", "key-plain", body, "X-Request-Id", id)
	}
	picked := func(id string) pick {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		p, ok := picks[id]
		if !ok {
			t.Fatalf("request %s was not routed", id)
		}
		return p
	}
	chunks := func() (total int) {
		t.Helper()
		r := c.get("/admin/v1/workers", "key-admin")
		var view struct {
			Workers []struct {
				Chunks int `json:"prefix_index_chunks"`
			} `json:"workers"`
		}
		if err := json.Unmarshal(r.body, &view); err != nil || r.status != http.StatusOK {
			t.Fatalf("workers: %d %s (%v)", r.status, r.body, err)
		}
		for _, w := range view.Workers {
			total += w.Chunks
		}
		return total
	}

	victim := strings.Repeat("The victim's long system prompt, the same on every turn of its work. ", 600)[:40_000]
	for i := range 2 {
		if r := send(fmt.Sprint("victim-", i), victim, fmt.Sprint("question ", i)); r.status != http.StatusOK {
			t.Fatalf("victim %d: %d %s", i, r.status, r.body)
		}
	}
	home, warm := picked("victim-0").worker, picked("victim-1")
	if warm.worker != home || warm.matched == 0 {
		t.Fatalf("victim's second request on %s matched %d, want its first's worker %s with its prefix matched", warm.worker, warm.matched, home)
	}
	before := chunks()

	for i := range 4 {
		huge := strings.Repeat(fmt.Sprintf("attacker %d fills the index with a prompt no engine can hold. ", i), 20_000)[:1_000_000]
		r := send(fmt.Sprint("huge-", i), huge, "x")
		if r.status != http.StatusBadRequest {
			t.Fatalf("huge prompt %d: %d %.300s, want the engine's 400", i, r.status, r.body)
		}
	}
	if n := chunks(); n != before {
		t.Fatalf("the index holds %d chunks after four refused prompts, %d before: refused prompts were recorded", n, before)
	}
	if r := send("victim-2", victim, "question 2"); r.status != http.StatusOK {
		t.Fatalf("victim 2: %d %s", r.status, r.body)
	}
	if p := picked("victim-2"); p.worker != home || p.matched != warm.matched {
		t.Fatalf("victim's request after the refused prompts on %s matched %d, want %s matched %d as before them", p.worker, p.matched, home, warm.matched)
	}

	// A long prompt that an engine answers is recorded, up to half (the
	// default share) of a worker's index: 4096 blocks × 16 tokens × 4
	// bytes / 128 bytes = 2048 chunks, 1024 for one prompt.
	long := strings.Repeat("A long but answerable prompt, recorded only in part. ", 4000)[:180_000]
	before = chunks()
	if r := send("long", long, "x"); r.status != http.StatusOK {
		t.Fatalf("long prompt: %d %.300s", r.status, r.body)
	}
	if n := chunks() - before; n != 1024 {
		t.Fatalf("a 180 KB prompt (%d chunks) took %d chunks of the index, want 1024 (half of its worker's 2048)", (len(long)+len("system\n"))/128, n)
	}
}
