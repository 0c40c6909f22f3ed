package test

import (
	"bytes"
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
	"github.com/tlgate/tlgate/internal/guard/auth"
)

// tenants is a cache_aware gateway with two engines and the keys given,
// that counts the tokens the prefix index matched over every pick and the
// engines' prefix-cache hits: whether a request hit is read from both,
// never from how fast it was answered.
type tenants struct {
	*cluster
	mu      sync.Mutex
	matched int // tokens the prefix index matched, over every pick
	prompt  int // prompt tokens of every pick
}

func newTenants(t testing.TB, keys ...config.APIKey) *tenants {
	t.Helper()
	tn := &tenants{}
	tn.cluster = newClusterDeps(t, "", []clusterOpt{withKeys(keys...), func(cfg *config.Config) { cfg.Gateway.RoutePolicy = config.PolicyCacheAware }},
		func(d *request.Deps) {
			logged := d.OnRouted
			d.OnRouted = func(ex *request.Exchange, tg router.Target, took time.Duration) {
				logged(ex, tg, took)
				tn.mu.Lock()
				tn.matched += tg.MatchedTokens
				tn.prompt += tg.PromptTokens
				tn.mu.Unlock()
			}
		},
		enginesim.Config{ID: "w1", Model: "m"}, enginesim.Config{ID: "w2", Model: "m"})
	return tn
}

// tenantPrompt is a long system prompt every tenant's requests start with.
var tenantPrompt = strings.Repeat("Every tenant of this gateway shares this long system prompt word for word. ", 30)

// tenantChat is a chat body with the shared system prompt, a question of its
// own and, when salt is set, a cache_salt.
func tenantChat(question, salt string) map[string]any {
	body := map[string]any{"model": "m", "max_tokens": 1, "messages": []map[string]string{
		{"role": "system", "content": tenantPrompt}, {"role": "user", "content": question}}}
	if salt != "" {
		body["cache_salt"] = salt
	}
	return body
}

// hits is what the prefix index matched and the engines' prefix caches
// hit so far.
func (tn *tenants) hits() (matched int, engine uint64) {
	tn.mu.Lock()
	matched = tn.matched
	tn.mu.Unlock()
	for _, e := range tn.engines {
		engine += e.Stats().PrefixHits
	}
	return matched, engine
}

// send posts body with key through the gateway and checks whether the
// prefix index and the engines' caches hit.
func (tn *tenants) send(t *testing.T, what, key string, body map[string]any, hit bool) {
	t.Helper()
	m0, e0 := tn.hits()
	if r := tn.post("/v1/chat/completions", key, body); r.status != http.StatusOK {
		t.Fatalf("%s: %d %s", what, r.status, r.body)
	}
	m, e := tn.hits()
	if (m > m0) != hit {
		t.Fatalf("%s: the prefix index matched %d tokens, want a hit: %v", what, m-m0, hit)
	}
	if (e > e0) != hit {
		t.Fatalf("%s: the engines' prefix caches hit %d times, want a hit: %v", what, e-e0, hit)
	}
}

// direct posts body to every engine, past the gateway, and reports
// whether any engine's prefix cache hit.
func (tn *tenants) direct(t *testing.T, body map[string]any) bool {
	t.Helper()
	_, e0 := tn.hits()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	for id, e := range tn.engines {
		resp, err := http.Post("http://"+e.HTTPAddr()+"/v1/chat/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", id, resp.StatusCode)
		}
	}
	_, e := tn.hits()
	return e > e0
}

// saltOf is the salt a replica configured with key derives for the
// client's salt: what every replica of a fleet sends the engines.
func saltOf(t *testing.T, key config.APIKey, client string) string {
	t.Helper()
	kr, err := auth.New([]auth.KeySpec{{Name: key.Name, Secret: key.Key, Scopes: key.Scopes, IsolateCache: key.IsolatesCache()}})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := http.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Authorization", "Bearer "+key.Key)
	k, err := kr.Authenticate(r)
	if err != nil {
		t.Fatal(err)
	}
	return k.CacheSalt(client)
}

// TestCacheSaltBoundToKey: a client's cache_salt is bound to its key. Two
// keys sending the same salt and prompt share nothing (neither the
// gateway's prefix index nor an engine's prefix cache), each hits its own
// entries, and the engines never see the client's salt: a request sent
// to them straight with it hits nothing, one with the salt another
// replica with the same key derives hits.
func TestCacheSaltBoundToKey(t *testing.T) {
	a := config.APIKey{Name: "tenant-a", Key: "key-tenant-a", Scopes: []string{"inference"}}
	b := config.APIKey{Name: "tenant-b", Key: "key-tenant-b", Scopes: []string{"inference"}}
	tn := newTenants(t, a, b)
	const salt = "team-blue"
	tn.send(t, "a's first salted request", a.Key, tenantChat("question 1", salt), false)
	tn.send(t, "a's second", a.Key, tenantChat("question 2", salt), true)
	tn.send(t, "b with a's salt", b.Key, tenantChat("question 3", salt), false)
	tn.send(t, "b again with that salt", b.Key, tenantChat("question 4", salt), true)
	tn.send(t, "a unsalted", a.Key, tenantChat("question 5", ""), false)
	tn.send(t, "b unsalted", b.Key, tenantChat("question 6", ""), true) // unsalted requests share by default

	if tn.direct(t, tenantChat("question 7", salt)) {
		t.Fatal("a request sent straight to the engines with the client's salt hit a tenant's entries: the gateway passed the salt on as sent")
	}
	bound := saltOf(t, a, salt)
	if bound == salt || !strings.HasPrefix(bound, "tl1-") {
		t.Fatalf("a's bound salt %q", bound)
	}
	if !tn.direct(t, tenantChat("question 8", bound)) {
		t.Fatalf("a request with the salt another replica derives for a (%s) missed a's entries", bound)
	}
}

// TestCacheIsolationKey: a key with cache_isolation = "key" salts every
// request of its own: its unsalted prompts share no entry with other keys'
// (in the prefix index or the engines), while keys left shared share
// theirs, as by default.
func TestCacheIsolationKey(t *testing.T) {
	iso := config.APIKey{Name: "isolated", Key: "key-isolated", Scopes: []string{"inference"}, CacheIsolation: config.CacheIsolationKey}
	p1 := config.APIKey{Name: "shared-1", Key: "key-shared-1", Scopes: []string{"inference"}}
	p2 := config.APIKey{Name: "shared-2", Key: "key-shared-2", Scopes: []string{"inference"}, CacheIsolation: config.CacheShared}
	tn := newTenants(t, iso, p1, p2)
	tn.send(t, "isolated key's first request", iso.Key, tenantChat("question 1", ""), false)
	tn.send(t, "its second", iso.Key, tenantChat("question 2", ""), true)
	tn.send(t, "a shared key, same prompt", p1.Key, tenantChat("question 3", ""), false)
	tn.send(t, "another shared key", p2.Key, tenantChat("question 4", ""), true)
	tn.send(t, "the isolated key after them", iso.Key, tenantChat("question 5", ""), true)
	tn.send(t, "the isolated key with a salt of its own", iso.Key, tenantChat("question 6", "s"), false)

	if s := saltOf(t, p1, ""); s != "" {
		t.Fatalf("a shared key derived the salt %q for unsalted requests", s)
	}
	if !tn.direct(t, tenantChat("question 7", saltOf(t, iso, ""))) {
		t.Fatal("a request with the isolated key's salt missed its entries")
	}
	if !tn.direct(t, tenantChat("question 8", "")) {
		t.Fatal("the shared keys' unsalted entries are not in the engines' caches")
	}
}

// BenchmarkCacheIsolationHitRate measures what cache_isolation = "key"
// costs in prefix-cache hits: 8 keys each send 4 chat requests that share
// one long system prompt (about 560 of each prompt's ~570 tokens), the
// keys shared (the default) or isolated. It reports the share of prompt
// tokens the gateway's prefix index matched (index-hit-%) and the engines'
// prefix caches hit (engine-hit-%), over every iteration, each with a
// system prompt of its own (cold caches).
func BenchmarkCacheIsolationHitRate(b *testing.B) {
	const keys, each = 8, 4
	for _, mode := range []string{config.CacheShared, config.CacheIsolationKey} {
		b.Run(mode, func(b *testing.B) {
			var ks []config.APIKey
			for i := range keys {
				ks = append(ks, config.APIKey{Name: fmt.Sprintf("k%d", i), Key: fmt.Sprintf("key-%d", i), Scopes: []string{"inference"}, CacheIsolation: mode})
			}
			tn := newTenants(b, ks...)
			var prompt int
			var queries uint64
			m0, e0 := tn.hits()
			for _, e := range tn.engines {
				queries -= e.Stats().PrefixQueries
			}
			for n := 0; b.Loop(); n++ {
				sys := fmt.Sprintf("Iteration %d. ", n) + tenantPrompt
				for r := range each {
					for _, k := range ks {
						body := map[string]any{"model": "m", "max_tokens": 1, "messages": []map[string]string{
							{"role": "system", "content": sys}, {"role": "user", "content": fmt.Sprintf("%s asks question %d", k.Name, r)}}}
						if rep := tn.post("/v1/chat/completions", k.Key, body); rep.status != http.StatusOK {
							b.Fatalf("%d %s", rep.status, rep.body)
						}
					}
				}
			}
			m, e := tn.hits()
			for _, en := range tn.engines {
				queries += en.Stats().PrefixQueries
			}
			tn.mu.Lock()
			prompt = tn.prompt
			tn.mu.Unlock()
			b.ReportMetric(100*float64(m-m0)/float64(prompt), "index-hit-%")
			b.ReportMetric(100*float64(e-e0)/float64(queries), "engine-hit-%")
		})
	}
}
