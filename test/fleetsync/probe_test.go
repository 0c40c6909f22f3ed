package fleetsync

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// TestDrillTenantProbe reruns the attack's probe of one tenant's prompts
// by another: three cache_aware replicas with fleet sync on (one token for
// the fleet), three engines, two API keys. Whether a request hit a cache is
// read from the engines' prefix-cache counters, never from how fast it was
// answered. Alice sends a long prompt with her cache_salt through gw-0;
// her own follow-ups with that salt, through gw-1 and gw-2, go to the
// engine that holds it and hit (so the drill can see a hit), while Bob's
// same prompt, with Alice's salt or with none, through any replica, hits
// nothing: the salt the engines and the prefix index see is derived from
// the key.
func TestDrillTenantProbe(t *testing.T) {
	f := newTweakedFleet(t, cluster.StartNATS(t), "cache_aware", 3, engineConfigs(3, 0), withTenants)
	alice, bob := f.as(aliceKey), f.as(bobKey)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	secret := strings.Repeat("Alice's unreleased quarterly figures, line by line. ", 40)
	chat := func(salt string) string {
		body := map[string]any{"model": model, "max_tokens": 1, "messages": []map[string]string{{"role": "user", "content": secret}}}
		if salt != "" {
			body["cache_salt"] = salt
		}
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	hits := func() (n uint64) {
		for _, e := range f.Engines {
			n += e.Stats().PrefixHits
		}
		return n
	}
	// send posts body through replica i and returns the worker that
	// answered and the prompt tokens the engines' caches hit.
	send := func(who *cluster.Fleet, i int, body string) (string, uint64) {
		t.Helper()
		before := hits()
		r := who.Do(ctx, http.MethodPost, f.Replicas[i].URL+"/v1/chat/completions", body)
		if r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("gw-%d: %d %v %s", i, r.Status, r.Err, r.Body)
		}
		return r.Route(), hits() - before
	}

	const salt = "alice-team"
	holder, hit := send(alice, 0, chat(salt))
	if hit != 0 {
		t.Fatalf("alice's first request hit %d cached tokens on fresh engines", hit)
	}
	chunks := f.Worker(0, holder).PrefixIndexChunks
	for i := 1; i < len(f.Replicas); i++ {
		f.WaitWorker(i, holder, func(w router.WorkerView) bool { return w.PrefixIndexChunks >= chunks },
			"alice's prompt, synced from gw-0")
	}
	for i := 1; i < len(f.Replicas); i++ {
		if w, hit := send(alice, i, chat(salt)); w != holder || hit == 0 {
			t.Fatalf("alice again through gw-%d: answered by %s with %d cached tokens, want %s and a hit", i, w, hit, holder)
		}
	}
	probes := []struct {
		replica int
		salt    string
	}{{1, salt}, {2, ""}}
	for _, p := range probes {
		if w, hit := send(bob, p.replica, chat(p.salt)); hit != 0 {
			t.Fatalf("bob's probe through gw-%d with cache_salt %q: %s hit %d of alice's cached tokens", p.replica, p.salt, w, hit)
		}
	}
	t.Logf("tenant probe: alice's prompt (salt %q) cached on %s and hit through every replica; bob's same prompt with her salt and with none hit no cached token", salt, holder)
}
