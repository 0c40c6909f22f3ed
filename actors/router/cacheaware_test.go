package router

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

func caWorker(id string) fleet.Worker {
	x := w(id, "m", fleet.RoleUnified, 0, 0)
	x.KVTotalBlocks, x.KVBlockTokens = 4096, 16
	return x
}

func caState(t testing.TB, ca policy.CacheAwareConfig, ids ...string) *State {
	t.Helper()
	s := NewState(Config{Policy: policy.NameCacheAware, CacheAware: ca}, nil, 1)
	for _, id := range ids {
		s.SetWorker(caWorker(id))
	}
	return s
}

// answered is what the router does when the attempt of pick tg answers
// with a 2xx (AttemptSucceeded with tg's Indexing): its prompt is recorded.
func answered(s *State, tg Target) {
	s.AttemptSucceeded(tg.Worker.ID)
	s.Indexed(tg.Indexing, time.Now())
}

// words returns n bytes of text distinct for every seed.
func words(seed string, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%s-%d ", seed, i)
	}
	return b.String()[:n]
}

func TestCacheAwarePickState(t *testing.T) {
	s := caState(t, policy.DefaultCacheAware(), "a", "b", "c")
	sys := "system\n" + words("sys", 2000) + "\n"
	pick := func(prompt string) Target {
		t.Helper()
		tg, err := s.Pick(&Request{Model: "m", RequestID: "r", Prompt: prompt}, now)
		if err != nil {
			t.Fatal(err)
		}
		return tg
	}
	first := pick(sys + "user\nfirst question\n")
	if first.Worker.ID != "a" || first.Reason != policy.ReasonLoad || first.MatchedTokens != 0 {
		t.Fatalf("cold pick: %s %s matched %d, want a (load) matched 0", first.Worker.ID, first.Reason, first.MatchedTokens)
	}
	// Nothing is recorded before a's answer begins: the same prompt again
	// goes by load, to b.
	if tg := pick(sys + "user\nbefore the answer\n"); tg.Worker.ID != "b" || tg.MatchedTokens != 0 || s.indexChunks("a") != 0 {
		t.Fatalf("before the answer: %s %s matched %d (a holds %d chunks), want b (load) and nothing indexed", tg.Worker.ID, tg.Reason, tg.MatchedTokens, s.indexChunks("a"))
	}
	s.Release("b")
	answered(s, first)
	// a now has one in flight; the shared system prompt still wins.
	second := pick(sys + "user\nanother question\n")
	if second.Worker.ID != "a" || second.Reason != policy.ReasonCache || second.MatchedTokens != 15*128/4 { // the common 2,013 bytes hold 15 chunks
		t.Fatalf("warm pick: %s %s matched %d, want a (cache) matched %d", second.Worker.ID, second.Reason, second.MatchedTokens, 15*128/4)
	}
	views := s.Workers(now)
	if views[0].PrefixIndexChunks == 0 || views[1].PrefixIndexChunks != 0 {
		t.Fatalf("index sizes a %d, b %d", views[0].PrefixIndexChunks, views[1].PrefixIndexChunks)
	}
	// a restarts: its cache is gone, the next pick goes by load.
	s.Release("a")
	s.Release("a")
	restarted := caWorker("a")
	restarted.StartedAt = now.Add(time.Second)
	s.SetWorker(restarted)
	if tg := pick(sys + "user\nthird\n"); tg.Reason != policy.ReasonLoad || tg.MatchedTokens != 0 {
		t.Fatalf("after the restart: %s %s matched %d, want load and nothing matched", tg.Worker.ID, tg.Reason, tg.MatchedTokens)
	}
	s.RemoveWorker("a")
	if _, ok := s.prefix.index.Stats("a"); ok {
		t.Fatal("evicted worker kept in the index")
	}
	// Other policies keep no index.
	lo := state(t, policy.NameLeastOutstanding, nil, caWorker("a"))
	if tg, _ := lo.Pick(&Request{Model: "m", Prompt: sys}, now); tg.MatchedTokens != 0 || lo.Workers(now)[0].PrefixIndexChunks != 0 {
		t.Fatalf("least_outstanding indexed the prompt: %+v", tg)
	}
}

func TestSlotLoad(t *testing.T) {
	s := caState(t, policy.DefaultCacheAware(), "a")
	c := s.inflight["a"]
	if got := slotLoad(c); got != 0 {
		t.Fatalf("idle: %d", got)
	}
	for range 3 {
		_, _ = s.Pick(&Request{Model: "m"}, now)
	}
	if got := slotLoad(c); got != 3 {
		t.Fatalf("3 sent since the heartbeat: %d", got)
	}
	hb := caWorker("a")
	heartbeat := func(running, queued int, at time.Duration) {
		t.Helper()
		hb.Running, hb.QueueDepth, hb.LastHeartbeat = running, queued, now.Add(at)
		s.SetWorker(hb)
	}
	// The heartbeat reports them (2 running, 1 queued) and 4 more from
	// another gateway: believed from the second report on (the first, at
	// registration, said 0).
	heartbeat(6, 1, time.Second)
	if got := slotLoad(c); got != 3 {
		t.Fatalf("after one report of 4 foreign: %d, want 3", got)
	}
	heartbeat(6, 1, 1500*time.Millisecond)
	if got := slotLoad(c); got != 7 {
		t.Fatalf("after two reports of 4 foreign: %d, want 7", got)
	}
	s.Release("a")
	_, _ = s.Pick(&Request{Model: "m"}, now)
	_, _ = s.Pick(&Request{Model: "m"}, now)
	if got := slotLoad(c); got != 8 {
		t.Fatalf("one ended and two sent: %d, want 8", got)
	}
	// A report below the gateway's own count is not believed: the load is
	// the gateway's 4.
	heartbeat(0, 0, 2*time.Second)
	if got := slotLoad(c); got != 4 {
		t.Fatalf("report of 0 with 4 in flight: %d, want 4", got)
	}
	// One report of 2 more than the gateway sent (a request that ended
	// while the report was on its way) does not count; two in a row do.
	heartbeat(6, 0, 3*time.Second)
	if got := slotLoad(c); got != 4 {
		t.Fatalf("one report of 2 foreign: %d, want 4", got)
	}
	heartbeat(5, 1, 4*time.Second)
	if got := slotLoad(c); got != 6 {
		t.Fatalf("two reports of 2 foreign: %d, want 6", got)
	}
	// The same heartbeat seen again (another field changed) samples nothing.
	hb.Running = 20
	s.SetWorker(hb)
	if got := slotLoad(c); got != 6 {
		t.Fatalf("a repeated heartbeat changed the load: %d, want 6", got)
	}
}

// TestCacheAwareFollowsConversation: the turns of one conversation (each
// the previous prompt, its answer and a new user message) stay on the
// worker of its first turn while that worker is under the thresholds (and
// its cached prefix, here about 1,000 tokens, outweighs the load
// differences the interleaving makes), with other conversations
// interleaved and requests overlapping; past the thresholds they move,
// and follow their new worker.
func TestCacheAwareFollowsConversation(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	const convs, turns = 12, 10
	run := func(t *testing.T, s *State, hold int) (home []string, moved int) {
		prompts := make([]string, convs)
		home = make([]string, convs)
		var inflight []string
		for turn := range turns {
			for c := range convs {
				if turn == 0 {
					prompts[c] = "system\n" + words(fmt.Sprintf("conv%d", c), 4000) + "\n"
				}
				prompts[c] += fmt.Sprintf("user\nquestion %d of conversation %d\n", turn, c)
				tg, err := s.Pick(&Request{Model: "m", RequestID: "r", Prompt: prompts[c]}, now)
				if err != nil {
					t.Fatal(err)
				}
				answered(s, tg)
				switch {
				case turn == 0:
					home[c] = tg.Worker.ID
				case tg.Worker.ID != home[c]:
					moved++
					home[c] = tg.Worker.ID
				case tg.Reason != policy.ReasonCache || tg.MatchedTokens < 3900/4:
					t.Fatalf("conversation %d turn %d: reason %s matched %d", c, turn, tg.Reason, tg.MatchedTokens)
				}
				prompts[c] += "assistant\n" + words(fmt.Sprintf("answer%d-%d", c, turn), 120) + "\n"
				inflight = append(inflight, tg.Worker.ID)
				for len(inflight) > hold {
					s.Release(inflight[0])
					inflight = inflight[1:]
				}
			}
		}
		return home, moved
	}
	t.Run("under the thresholds", func(t *testing.T) {
		s := caState(t, policy.DefaultCacheAware(), ids...)
		home, moved := run(t, s, 8)
		if moved != 0 {
			t.Fatalf("%d turns left their conversation's worker", moved)
		}
		per := map[string]int{}
		for _, h := range home {
			per[h]++
		}
		if len(per) != len(ids) {
			t.Fatalf("conversations on %v, want all 4 workers used", per)
		}
	})
	t.Run("past the thresholds", func(t *testing.T) {
		// Background load on a and b pushes them past tight thresholds:
		// their conversations move to c and d, and follow them there.
		s := caState(t, policy.CacheAwareConfig{PrefillWeight: 1, LoadWeight: 0.01, BalanceAbs: 4, BalanceRel: 1.5}, ids...)
		for _, id := range []string{"a", "b"} {
			x := caWorker(id)
			x.Running = 20
			for i := range 2 { // a foreign load shows from its second report
				x.LastHeartbeat = now.Add(time.Duration(i+1) * time.Second)
				s.SetWorker(x)
			}
		}
		home, _ := run(t, s, 0)
		for c, h := range home {
			if h == "a" || h == "b" {
				t.Fatalf("conversation %d stayed on overloaded %s", c, h)
			}
		}
	})
}

// TestCacheAwareDisaggregatedPrefill: on a disaggregated route the prompt
// is prefilled, and cached, on the prefill worker, so cache_aware picks and
// indexes that one; the decode worker goes by load and indexes nothing.
func TestCacheAwareDisaggregatedPrefill(t *testing.T) {
	rs := []routes.Route{{Model: "big-pd", Backends: []routes.Backend{{Model: "big", Weight: 1}}, Targets: []string{"disaggregated"}}}
	table, err := routes.NewTable(rs)
	if err != nil {
		t.Fatal(err)
	}
	s := NewState(Config{Policy: policy.NameCacheAware}, table, 1)
	for _, id := range []string{"d1", "d2", "p1", "p2"} {
		x := caWorker(id)
		x.Model, x.Role = "big", fleet.RoleDecode
		if id[0] == 'p' {
			x.Role = fleet.RolePrefill
		}
		s.SetWorker(x)
	}
	sys := words("system", 4000) + "\n"
	first, err := s.Pick(&Request{Model: "big-pd", RequestID: "1", Prompt: sys + "first"}, now)
	if err != nil || first.Prefill == nil {
		t.Fatalf("first pick: %+v, %v", first, err)
	}
	if first.Indexing.Worker != first.Prefill.ID {
		t.Fatalf("first pick indexes on %q, want its prefill worker %s", first.Indexing.Worker, first.Prefill.ID)
	}
	answered(s, first)
	// The same prefix again, with the first request still in flight: its
	// prefill worker holds the prompt, the other decode worker is idle.
	second, err := s.Pick(&Request{Model: "big-pd", RequestID: "2", Prompt: sys + "second"}, now)
	if err != nil || second.Prefill == nil {
		t.Fatalf("second pick: %+v, %v", second, err)
	}
	if second.Prefill.ID != first.Prefill.ID || second.Reason != policy.ReasonCache || second.MatchedTokens < 900 {
		t.Fatalf("second prefill on %s (%s, matched %d), want %s by cache", second.Prefill.ID, second.Reason, second.MatchedTokens, first.Prefill.ID)
	}
	if second.Worker.ID == first.Worker.ID {
		t.Fatalf("both decodes on %s, want the idle one (decode goes by load)", second.Worker.ID)
	}
	for _, d := range []string{"d1", "d2"} {
		if n := s.indexChunks(d); n != 0 {
			t.Fatalf("decode worker %s indexed %d chunks, want none", d, n)
		}
	}
}
