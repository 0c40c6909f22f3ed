package router

import (
	"fmt"
	"testing"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/prefixindex"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// TestRequestHashesPromptOnce: a request that carries Hashes has its
// prompt hashed once for its first pick, a failover retry and the next
// cascade step, and the picks are those of the same request without it:
// the same workers, with the same prefix matched.
func TestRequestHashesPromptOnce(t *testing.T) {
	prompt := words("system", 4000)
	newState := func() *State {
		kv := func(x fleet.Worker) fleet.Worker {
			x.KVTotalBlocks, x.KVBlockTokens = 4096, 16
			return x
		}
		s := state(t, policy.NameCacheAware,
			[]routes.Route{{Model: "auto", Cascade: []routes.Step{{Model: "smol", AcceptIf: "mean_logprob > -1"}, {Model: "big"}}}},
			kv(w("s1", "smol", fleet.RoleUnified, 0, 0)), kv(w("s2", "smol", fleet.RoleUnified, 0, 0)), kv(w("b1", "big", fleet.RoleUnified, 0, 0)))
		// s1 holds the prompt's first half, b1 all of it.
		for _, warm := range []struct {
			model, prompt, worker string
		}{{"smol", prompt[:2000], "s1"}, {"big", prompt, "b1"}} {
			tg, err := s.Pick(&Request{Model: warm.model, RequestID: "warm", Prompt: warm.prompt}, now)
			if err != nil || tg.Worker.ID != warm.worker {
				t.Fatalf("warming %s: %+v %v", warm.worker, tg, err)
			}
			answered(s, tg)
			s.Release(tg.Worker.ID)
		}
		return s
	}
	memo := &prefixindex.PromptHashes{}
	with, without := newState(), newState()
	steps := []struct {
		name    string
		exclude map[string]bool
		step    int
		worker  string
	}{
		{"first pick", nil, 0, "s1"},
		{"failover", map[string]bool{"s1": true}, 0, "s2"},
		{"next cascade step", map[string]bool{"s1": true, "s2": true}, 1, "b1"},
	}
	for _, st := range steps {
		var got [2]string
		for i, s := range []*State{with, without} {
			req := &Request{Model: "auto", RequestID: "r", Prompt: prompt, Exclude: st.exclude, Step: st.step}
			if s == with {
				req.Hashes = memo
			}
			tg, err := s.Pick(req, now)
			if err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			got[i] = fmt.Sprintf("%s matched %d of %d", tg.Worker.ID, tg.MatchedTokens, tg.PromptTokens)
			if tg.Worker.ID != st.worker || tg.MatchedTokens == 0 && st.worker != "s2" {
				t.Fatalf("%s: %s, want %s with a prefix matched (but on s2)", st.name, got[i], st.worker)
			}
		}
		if got[0] != got[1] {
			t.Fatalf("%s: with Hashes %s, without %s", st.name, got[0], got[1])
		}
	}
	if n := memo.Runs(); n != 1 {
		t.Fatalf("the prompt was hashed %d times for %d picks, want once", n, len(steps))
	}
}

// TestWaitersHashPromptOnce: waiters that carry Hashes have their prompts
// hashed once, however many dispatch scans weigh them (warmWaiter) and
// when one is picked.
func TestWaitersHashPromptOnce(t *testing.T) {
	s := warmAdmitState(t, 8)
	sysA, sysB := words("alpha", 2000)+"\n", words("beta", 2000)+"\n"
	for _, p := range []string{sysA + "first", sysB + "second"} { // a and b busy
		if ad := s.Admit(&Request{Model: "m", Prompt: p}, "k", nil, now); ad.Queued != nil {
			t.Fatal("queued with a worker free")
		}
	}
	var memos []*prefixindex.PromptHashes
	for i := range 4 {
		m := &prefixindex.PromptHashes{}
		memos = append(memos, m)
		if s.Admit(&Request{Model: "m", Prompt: fmt.Sprint(sysB, "waiter ", i), Hashes: m}, "k", nil, now).Queued == nil {
			t.Fatal("not queued")
		}
	}
	for range 3 { // each dispatch weighs every waiter left and picks one
		s.Release("a")
		if d := s.Dispatch(now); len(d) != 1 {
			t.Fatalf("dispatch: %+v", d)
		}
	}
	for i, m := range memos {
		if m.Runs() != 1 {
			t.Errorf("waiter %d's prompt hashed %d times, want once", i, m.Runs())
		}
	}
}
