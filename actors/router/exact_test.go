package router

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/kvindex"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

const ebs = 16 // block size of the exact tests

func etoks(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// storedBatch is a batch storing tokens as blocks named base+1, base+2...
func storedBatch(tokens []uint32, base uint64) kvindex.Batch {
	n := len(tokens) / ebs
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = base + uint64(i) + 1
	}
	return kvindex.Batch{Events: []kvindex.Event{{Kind: kvindex.Stored, Hashes: hs, Tokens: tokens[:n*ebs], BlockSize: ebs}}}
}

func exactState(t *testing.T, cfg Config, ids ...string) *State {
	t.Helper()
	cfg.Policy = policy.NameCacheAware
	s := NewState(cfg, nil, 1)
	for _, id := range ids {
		s.SetWorker(caWorker(id))
	}
	return s
}

// events applies m to s as the router does.
func events(t *testing.T, s *State, id string, st kvindex.State, bs ...kvindex.Batch) {
	t.Helper()
	if r := s.ApplyKV(&KVEvents{Worker: id, State: st, Batches: bs}, now); r.Failed != 0 {
		t.Fatalf("applied %+v", r)
	}
}

func TestExactPickAsksForTokens(t *testing.T) {
	s := exactState(t, Config{Tokenizers: map[string]string{"other": "http://tok:1"}}, "a", "b")
	events(t, s, "b", kvindex.Exact)
	req := &Request{Model: "m", RequestID: "r", Prompt: words("p", 400)}
	_, err := s.Pick(req, now)
	var nt *NeedTokensError
	if !errors.As(err, &nt) || !errors.Is(err, ErrNeedTokens) || nt.Base != "m" || nt.Model != "m" || nt.URL != "" || nt.Worker != "127.0.0.1:1" {
		t.Fatalf("pick without tokens: %v %+v", err, nt)
	}
	if s.InFlight("a")+s.InFlight("b") != 0 {
		t.Fatal("a pick that asked for tokens counted a request")
	}
	// A tokenizer configured for the model is named.
	s.cfg.Tokenizers = map[string]string{"m": "http://tok:1"}
	if _, err := s.Pick(req, now); !errors.As(err, &nt) || nt.URL != "http://tok:1" {
		t.Fatalf("configured tokenizer: %v %+v", err, nt)
	}
	// Tokens that could not be had, or a waiter: the prefix index.
	for _, r := range []*Request{{Model: "m", RequestID: "r", NoTokens: map[string]bool{"m": true}}, {Model: "m", RequestID: "r", NoAsk: true}} {
		tg, err := s.Pick(r, now)
		if err != nil || tg.CacheView != "approximate" {
			t.Fatalf("%+v: %+v %v", r, tg, err)
		}
		s.Release(tg.Worker.ID)
	}
	// No usable view among the candidates: nothing is asked.
	events(t, s, "b", kvindex.Stale)
	if tg, err := s.Pick(&Request{Model: "m", RequestID: "r"}, now); err != nil || tg.CacheView != "approximate" {
		t.Fatalf("stale view: %+v %v", tg, err)
	}
}

// TestExactPickFollowsEvents: blocks a worker's events say it holds draw
// the prompt there, whatever the gateway sent; removed ones no longer do.
func TestExactPickFollowsEvents(t *testing.T) {
	s := exactState(t, Config{}, "a", "b", "c")
	for _, id := range []string{"a", "b", "c"} {
		events(t, s, id, kvindex.Exact)
	}
	doc := etoks(0, 64*ebs)
	events(t, s, "c", kvindex.Exact, storedBatch(doc, 0))
	prompt := append(append([]uint32{}, doc...), etoks(9000, 40)...)
	req := func() *Request {
		return &Request{Model: "m", RequestID: "r", Prompt: words("x", 100), Tokens: map[string][]uint32{"m": prompt}, Keys: &TokenKeys{}}
	}
	tg, err := s.Pick(req(), now)
	if err != nil || tg.Worker.ID != "c" || tg.CacheView != "exact" || tg.MatchedTokens != len(doc) || tg.PromptTokens != len(prompt) || tg.Reason != policy.ReasonCache {
		t.Fatalf("pick: %s %s %s matched %d of %d, %v", tg.Worker.ID, tg.CacheView, tg.Reason, tg.MatchedTokens, tg.PromptTokens, err)
	}
	if tg.Indexing.Exact.Expect != true {
		t.Error("the prompt's tail is new to c: its events are expected")
	}
	s.Release("c")
	// c evicts the document's second block: only the first block matches
	// now, and the speculation of the last pick ends with its TTL.
	events(t, s, "c", kvindex.Exact, kvindex.Batch{Events: []kvindex.Event{{Kind: kvindex.Removed, Hashes: []uint64{2}}}})
	later := now.Add(kvindex.DefaultSpeculativeTTL)
	tg, err = s.Pick(req(), later)
	if err != nil || tg.MatchedTokens != ebs {
		t.Fatalf("after the removal: %s matched %d, %v", tg.Worker.ID, tg.MatchedTokens, err)
	}
}

// TestExactSpeculation: a burst of one prefix goes where the first of it
// went, before any event says so, until the TTL.
func TestExactSpeculation(t *testing.T) {
	s := exactState(t, Config{KVIndex: kvindex.Config{SpeculativeTTL: time.Second}}, "a", "b")
	events(t, s, "a", kvindex.Exact)
	events(t, s, "b", kvindex.Exact)
	prompt := etoks(0, 100*ebs)
	req := &Request{Model: "m", RequestID: "r", Tokens: map[string][]uint32{"m": prompt}}
	first, err := s.Pick(req, now)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Pick(req, now.Add(500*time.Millisecond))
	if err != nil || second.Worker.ID != first.Worker.ID || second.MatchedTokens != len(prompt) {
		t.Fatalf("second of the burst: %s matched %d (first on %s), %v", second.Worker.ID, second.MatchedTokens, first.Worker.ID, err)
	}
	s.Release(first.Worker.ID)
	s.Release(second.Worker.ID)
	if tg, _ := s.Pick(req, now.Add(2*time.Second)); tg.MatchedTokens != 0 {
		t.Fatalf("speculation outlived its TTL: matched %d", tg.MatchedTokens)
	}
}

// TestExactMixedFleet: a worker with no events is scored on the prefix
// index, in the request's tokens.
func TestExactMixedFleet(t *testing.T) {
	s := exactState(t, Config{}, "a", "b")
	events(t, s, "b", kvindex.Exact)
	prompt := words("sys", 4000)
	tokens := etoks(0, 1000)
	// a answered the prompt before: the prefix index holds it there.
	tg, err := s.Pick(&Request{Model: "m", RequestID: "r", Prompt: prompt, NoTokens: map[string]bool{"m": true}}, now)
	if err != nil {
		t.Fatal(err)
	}
	s.Release(tg.Worker.ID)
	answered(s, Target{Worker: fleet.Worker{ID: "a"}, Indexing: Indexing{Worker: "a", Model: "m", Hashes: s.prefix.index.Hashes(nil, prompt)}})
	tg, err = s.Pick(&Request{Model: "m", RequestID: "r", Prompt: prompt, Tokens: map[string][]uint32{"m": tokens}}, now)
	if err != nil || tg.Worker.ID != "a" || tg.CacheView != "approximate" || tg.PromptTokens != len(tokens) || tg.MatchedTokens < len(tokens)*9/10 {
		t.Fatalf("pick: %s %s matched %d of %d, %v", tg.Worker.ID, tg.CacheView, tg.MatchedTokens, tg.PromptTokens, err)
	}
}

// TestExactViewStates: late events make a view stale, a batch ends it; a
// restarted worker's view is emptied; admin shows the view.
func TestExactViewStates(t *testing.T) {
	s := exactState(t, Config{KVIndex: kvindex.Config{EventTimeout: time.Second}}, "a")
	events(t, s, "a", kvindex.Exact, storedBatch(etoks(0, 4*ebs), 0))
	ws := s.Workers(now)
	if ws[0].CacheView != "exact" || ws[0].KVBlocks["gpu"] != 4 {
		t.Fatalf("admin view %+v %v", ws[0].CacheView, ws[0].KVBlocks)
	}
	s.Indexed(Indexing{Worker: "a", Exact: ExactIndexing{Expect: true}}, now)
	if s.exact.State("a", now.Add(time.Second)) != kvindex.Stale || s.Workers(now.Add(time.Second))[0].CacheView != "stale" {
		t.Fatal("late events did not make the view stale")
	}
	events(t, s, "a", kvindex.Exact, kvindex.Batch{})
	if !s.exact.Usable("a", now.Add(time.Second)) {
		t.Fatal("a batch did not make the view exact again")
	}
	x := caWorker("a")
	x.StartedAt = now.Add(time.Minute)
	s.SetWorker(x)
	if st, _ := s.exact.Stats("a", now); st.Blocks != 0 {
		t.Fatalf("a restarted worker kept %d blocks", st.Blocks)
	}
	// A bad batch clears the view; the subscription's end forgets it.
	if r := s.ApplyKV(&KVEvents{Worker: "a", State: kvindex.Exact, Batches: []kvindex.Batch{{Rank: -1}}}, now); r.Failed != 1 || s.exact.State("a", now) != kvindex.Stale {
		t.Fatalf("bad batch: %+v %s", r, s.exact.State("a", now))
	}
	s.ApplyKV(&KVEvents{Worker: "a", State: kvindex.None}, now)
	if s.Workers(now)[0].CacheView != "approximate" {
		t.Fatal("an ended subscription still shows a view")
	}
	s.RemoveWorker("a")
}

// TestExactClearKnowsRestarts: a clear at the engine's restart leaves a
// view that knows every block the engine holds, where one after lost
// events does not: an engine seen naming two blocks with one hash has a
// block after a parent resolved in the first only.
func TestExactClearKnowsRestarts(t *testing.T) {
	stored := func(h, parent uint64, from int) kvindex.Event {
		return kvindex.Event{Kind: kvindex.Stored, Hashes: []uint64{h}, Parent: parent, HasParent: parent != 0, Tokens: etoks(from, ebs), BlockSize: ebs}
	}
	unchain := kvindex.Batch{Events: []kvindex.Event{stored(1000, 0, 500), stored(1000, 0, 600)}}
	chain := kvindex.Batch{Events: []kvindex.Event{stored(1, 0, 0), stored(2, 1, ebs)}}
	tests := []struct {
		name      string
		restarted bool
		blocks    int
	}{
		{"events lost", false, 1},
		{"engine restarted", true, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := exactState(t, Config{}, "a")
			events(t, s, "a", kvindex.Exact, unchain)
			if r := s.ApplyKV(&KVEvents{Worker: "a", Clear: true, Restarted: tt.restarted, State: kvindex.Exact, Batches: []kvindex.Batch{chain}}, now); r.Failed != 0 {
				t.Fatalf("applied %+v", r)
			}
			if n := s.exact.Holds("a", kvindex.Keys(nil, "", "", etoks(0, 2*ebs), ebs)); n != tt.blocks {
				t.Errorf("%d blocks held, want %d", n, tt.blocks)
			}
		})
	}
}

// TestExactViewFollowsIncarnations: a worker seen again as another
// incarnation (a new start time), by a change or in a registry snapshot,
// has its exact view cleared; the same incarnation keeps it.
func TestExactViewFollowsIncarnations(t *testing.T) {
	tests := []struct {
		name      string
		snapshot  bool // ResetWorkers, else SetWorker
		restarted bool
		blocks    int
	}{
		{"change, same incarnation", false, false, 4},
		{"change, restarted", false, true, 0},
		{"snapshot, same incarnation", true, false, 4},
		{"snapshot, restarted", true, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := exactState(t, Config{}, "a")
			events(t, s, "a", kvindex.Exact, storedBatch(etoks(0, 4*ebs), 0))
			w := caWorker("a")
			if tt.restarted {
				w.StartedAt = now.Add(time.Minute)
			}
			if tt.snapshot {
				s.ResetWorkers([]fleet.Worker{w})
			} else {
				s.SetWorker(w)
			}
			if st, _ := s.exact.Stats("a", now); st.Blocks != tt.blocks {
				t.Errorf("%d blocks held, want %d", st.Blocks, tt.blocks)
			}
		})
	}
}

// TestExactEventsBeforeAnswerExpectNothing: an engine may publish a
// prompt's blocks before the answer's first byte reaches the gateway;
// once its view holds them all, the answer's start expects no more
// events, and an engine that then stays idle keeps its view exact.
func TestExactEventsBeforeAnswerExpectNothing(t *testing.T) {
	s := exactState(t, Config{KVIndex: kvindex.Config{EventTimeout: time.Second}}, "a")
	events(t, s, "a", kvindex.Exact)
	prompt := etoks(0, 4*ebs)
	tg, err := s.Pick(&Request{Model: "m", RequestID: "r", Prompt: words("x", 100), Tokens: map[string][]uint32{"m": prompt}, Keys: &TokenKeys{}}, now)
	if err != nil || !tg.Indexing.Exact.Expect {
		t.Fatalf("pick on a: %+v %v, want its events expected", tg.Indexing.Exact, err)
	}
	events(t, s, "a", kvindex.Exact, storedBatch(prompt, 0)) // before the first byte
	s.Indexed(tg.Indexing, now.Add(10*time.Millisecond))
	if !s.exact.Usable("a", now.Add(5*time.Second)) {
		t.Fatal("a's view went stale although its events came before the answer began")
	}
	// Events that did not bring the prompt's blocks leave it expected.
	tg, err = s.Pick(&Request{Model: "m", RequestID: "r2", Prompt: words("y", 100), Tokens: map[string][]uint32{"m": etoks(5000, 4*ebs)}, Keys: &TokenKeys{}}, now)
	if err != nil {
		t.Fatal(err)
	}
	s.Indexed(tg.Indexing, now.Add(10*time.Millisecond))
	if s.exact.Usable("a", now.Add(5*time.Second)) {
		t.Fatal("a's view stayed exact although the blocks of an answer it began never came")
	}
}

// TestExactNotRelayedBySync: fleet sync relays the prefix-index records of
// approximate workers only; every replica follows the others' events.
func TestExactNotRelayedBySync(t *testing.T) {
	s, rec := syncState(t, policy.NameCacheAware, SyncConfig{}, "a", "b")
	s.ApplyKV(&KVEvents{Worker: "a", State: kvindex.Exact}, now)
	s.ApplyKV(&KVEvents{Worker: "b", State: kvindex.Exact}, now)
	tokens := etoks(0, 400)
	tg, err := s.Pick(&Request{Model: "m", RequestID: "r", Prompt: words("z", 2000), Tokens: map[string][]uint32{"m": tokens}}, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range rec.events {
		if len(e) > 5 && e[:5] == "index" {
			t.Fatalf("an exact pick on %s was relayed: %v", tg.Worker.ID, rec.events)
		}
	}
	s.ApplyKV(&KVEvents{Worker: "a", State: kvindex.None}, now)
	s.ApplyKV(&KVEvents{Worker: "b", State: kvindex.None}, now)
	rec.events = nil
	if _, err := s.Pick(&Request{Model: "m", RequestID: "r", Prompt: words("z", 2000)}, now); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range rec.events {
		found = found || len(e) > 5 && e[:5] == "index"
	}
	if !found {
		t.Fatalf("an approximate pick was not relayed: %v", rec.events)
	}
}

// exactCascade is cache_aware with a cascade route "auto" (small, then
// big), one worker of each model, their views exact.
func exactCascade(t *testing.T) *State {
	t.Helper()
	table, err := routes.NewTable([]routes.Route{{Model: "auto", Cascade: []routes.Step{{Model: "small", AcceptIf: "mean_logprob > -1"}, {Model: "big"}}}})
	if err != nil {
		t.Fatal(err)
	}
	s := NewState(Config{Policy: policy.NameCacheAware}, table, 1)
	for _, x := range []fleet.Worker{w("s1", "small", fleet.RoleUnified, 0, 0), w("b1", "big", fleet.RoleUnified, 0, 0)} {
		s.SetWorker(x)
		events(t, s, x.ID, kvindex.Exact)
	}
	return s
}

// TestExactCascadeAsksPerModel: each cascade step's model is tokenized by
// its own tokenizer.
func TestExactCascadeAsksPerModel(t *testing.T) {
	s := exactCascade(t)
	req := &Request{Model: "auto", RequestID: "r"}
	var nt *NeedTokensError
	if _, err := s.Pick(req, now); !errors.As(err, &nt) || nt.Base != "small" {
		t.Fatalf("step 0: %v", err)
	}
	req.Tokens = map[string][]uint32{"small": etoks(0, 100)}
	if tg, err := s.Pick(req, now); err != nil || tg.Worker.ID != "s1" || tg.CacheView != "exact" {
		t.Fatalf("step 0 with tokens: %+v %v", tg, err)
	}
	req.Step = 1
	if _, err := s.Pick(req, now); !errors.As(err, &nt) || nt.Base != "big" {
		t.Fatalf("step 1: %v", err)
	}
}

// TestExactSpeculationShared: an exact pick's speculative blocks reach the
// peers, which hold them on the worker until its events come.
func TestExactSpeculationShared(t *testing.T) {
	for _, bt := range []int{16, 8} { // the workers' KV block size, before any event says
		t.Run(fmt.Sprint(bt), func(t *testing.T) { exactSpeculationShared(t, bt) })
	}
}

func exactSpeculationShared(t *testing.T, blockTokens int) {
	s, rec := syncState(t, policy.NameCacheAware, SyncConfig{}, "a", "b")
	peer, _ := syncState(t, policy.NameCacheAware, SyncConfig{}, "a", "b")
	for _, st := range []*State{s, peer} {
		for _, id := range []string{"a", "b"} {
			x := caWorker(id)
			x.KVBlockTokens = blockTokens
			st.SetWorker(x)
			st.ApplyKV(&KVEvents{Worker: id, State: kvindex.Exact}, now)
		}
	}
	spec := &specRecorder{recorder: rec}
	s.cfg.Sync.Syncer = spec
	prompt := etoks(0, 40*ebs)
	tg, err := s.Pick(&Request{Model: "m", RequestID: "r", Tokens: map[string][]uint32{"m": prompt}}, now)
	if err != nil {
		t.Fatal(err)
	}
	if spec.worker != tg.Worker.ID || len(spec.keys) != len(prompt)/blockTokens {
		t.Fatalf("told the peers %s %d keys, picked %s", spec.worker, len(spec.keys), tg.Worker.ID)
	}
	r := peer.ApplyPeer(&PeerBatch{Replica: "r2", Events: []PeerEvent{{Kind: PeerSpeculate, Worker: tg.Worker.ID, Hashes: spec.keys}, {Kind: PeerSpeculate, Worker: "zz", Hashes: spec.keys}}}, now)
	if r.Dropped[PeerDrop{PeerSpeculate, DropUnknownWorker}] != 1 {
		t.Fatalf("applied %+v", r)
	}
	got, err := peer.Pick(&Request{Model: "m", RequestID: "r", Tokens: map[string][]uint32{"m": prompt}}, now.Add(time.Second))
	if err != nil || got.Worker.ID != tg.Worker.ID || got.MatchedTokens != len(prompt) {
		t.Fatalf("the peer's pick: %s matched %d, %v", got.Worker.ID, got.MatchedTokens, err)
	}
}

// specRecorder is a recorder that also hears speculated blocks.
type specRecorder struct {
	*recorder
	worker string
	keys   []uint64
}

func (r *specRecorder) Speculated(worker string, keys []uint64) {
	r.worker, r.keys = worker, append([]uint64(nil), keys...)
}

// TestExactPartialTokens: tokens that are only a prefix of the prompt (a
// conversation's earlier turn's) count the prompt at its estimated length.
func TestExactPartialTokens(t *testing.T) {
	s := exactState(t, Config{}, "a")
	events(t, s, "a", kvindex.Exact)
	req := &Request{Model: "m", RequestID: "r", Prompt: words("p", 4000), Tokens: map[string][]uint32{"m": etoks(0, 100)}}
	tg, err := s.Pick(req, now)
	if err != nil || tg.PromptTokens != 100 {
		t.Fatalf("whole tokens: prompt %d, %v", tg.PromptTokens, err)
	}
	req.Partial = map[string]bool{"m": true}
	if tg, err = s.Pick(req, now); err != nil || tg.PromptTokens != 1000 {
		t.Fatalf("a prefix of the tokens: prompt %d, %v", tg.PromptTokens, err)
	}
}

// TestExactTokenizesBeforeWaiting: a cache_aware request that brings no
// tokens is asked for them before it waits in a full pool's queue (the
// pool full, or a queue already there), not when it is dispatched: a
// waiter sent away to tokenize would lose its place, and every freed slot
// would send the whole queue away.
func TestExactTokenizesBeforeWaiting(t *testing.T) {
	s := exactState(t, Config{Admission: AdmissionConfig{Enabled: true, Worker: 1, QueueSize: 8, QueueTimeout: 30 * time.Second}}, "a", "b")
	events(t, s, "a", kvindex.Exact)
	events(t, s, "b", kvindex.Exact)
	req := func(id string, tokens bool) *Request {
		r := &Request{Model: "m", RequestID: id, Prompt: words(id, 100), Keys: &TokenKeys{}}
		if tokens {
			r.Tokens = map[string][]uint32{"m": etoks(0, 100)}
		}
		return r
	}
	for _, id := range []string{"r1", "r2"} {
		if ad := s.Admit(req(id, true), "k", pid(id), now); ad.Err != nil || ad.Queued != nil {
			t.Fatalf("%s: %+v", id, ad)
		}
	}
	// The pool is full: asked for tokens, not queued.
	if ad := s.Admit(req("r3", false), "k", pid("r3"), now); !errors.Is(ad.Err, ErrNeedTokens) || ad.Queued != nil {
		t.Fatalf("full pool, no tokens: %+v", ad)
	}
	// With them it waits.
	q3 := s.Admit(req("r3", true), "k", pid("r3"), now)
	if q3.Queued == nil {
		t.Fatalf("full pool, tokens: %+v", q3)
	}
	// A queue is there: a request without tokens is asked before it joins,
	// one that may not be asked joins without.
	if ad := s.Admit(req("r4", false), "k", pid("r4"), now); !errors.Is(ad.Err, ErrNeedTokens) || ad.Queued != nil {
		t.Fatalf("queue there, no tokens: %+v", ad)
	}
	noAsk := req("r5", false)
	noAsk.NoAsk = true
	if ad := s.Admit(noAsk, "k", pid("r5"), now); ad.Queued == nil {
		t.Fatalf("queue there, no ask: %+v", ad)
	}
	// A freed slot dispatches the first waiter, with its tokens.
	s.Release("a")
	d := s.Dispatch(now.Add(time.Millisecond))
	if len(d) != 1 || d[0].W != q3.Queued || d[0].Err != nil || d[0].Target.CacheView != "exact" {
		t.Fatalf("dispatch: %+v", d)
	}
}

// TestNoExactKeepsNoViews: with NoExact (the gateway follows no events) a
// cache_aware state keeps no exact view: events apply nothing, and a pick
// neither asks for tokens nor routes on a view.
func TestNoExactKeepsNoViews(t *testing.T) {
	s := exactState(t, Config{NoExact: true}, "a", "b")
	s.ApplyKV(&KVEvents{Worker: "b", State: kvindex.Exact, Batches: []kvindex.Batch{storedBatch(etoks(0, 4*ebs), 0)}}, now)
	tg, err := s.Pick(&Request{Model: "m", RequestID: "r", Prompt: words("p", 400)}, now)
	if err != nil || tg.CacheView != "approximate" {
		t.Fatalf("pick: %+v %v", tg, err)
	}
	for _, w := range s.Workers(now) {
		if w.CacheView != "approximate" || w.KVBlocks != nil {
			t.Fatalf("%s: view %q, blocks %v", w.ID, w.CacheView, w.KVBlocks)
		}
	}
}

// TestTokensToWaitForTheStepPicked: a cascade request that joins its
// queue without a pick is asked for the tokens of the step its pick will
// take: the first for a plain request, the last for a streamed one or one
// accept_if cannot judge.
func TestTokensToWaitForTheStepPicked(t *testing.T) {
	s := exactCascade(t)
	for _, tc := range []struct {
		req  Request
		base string
	}{
		{Request{Model: "auto", RequestID: "r"}, "small"},
		{Request{Model: "auto", RequestID: "r", Stream: true}, "big"},
		{Request{Model: "auto", RequestID: "r", Unjudged: true}, "big"},
	} {
		if nt := s.tokensToWait(&tc.req, now); nt == nil || nt.Base != tc.base {
			t.Errorf("stream %v unjudged %v: asked %+v, want the tokens of %s", tc.req.Stream, tc.req.Unjudged, nt, tc.base)
		}
	}
}

// TestWaiterNotSentAwayToTokenize: a request that waited in the queue
// without tokens (no worker's view was usable when it joined) is routed
// on what it has when it leaves, even though the views are usable by
// then: sent away to tokenize, it would lose its place and the slot it
// waited for would go to a later arrival.
func TestWaiterNotSentAwayToTokenize(t *testing.T) {
	s := exactState(t, Config{Admission: AdmissionConfig{Enabled: true, Worker: 1, QueueSize: 8, QueueTimeout: 30 * time.Second}}, "a", "b")
	req := func(id string) *Request {
		return &Request{Model: "m", RequestID: id, Prompt: words(id, 100), Keys: &TokenKeys{}}
	}
	for _, id := range []string{"r1", "r2"} {
		if ad := s.Admit(req(id), "k", pid(id), now); ad.Err != nil || ad.Queued != nil {
			t.Fatalf("%s: %+v", id, ad)
		}
	}
	r3 := s.Admit(req("r3"), "k", pid("r3"), now) // no view usable yet: waits without tokens
	if r3.Queued == nil {
		t.Fatalf("r3: %+v", r3)
	}
	events(t, s, "a", kvindex.Exact)
	events(t, s, "b", kvindex.Exact)
	with := req("r4")
	with.Tokens = map[string][]uint32{"m": etoks(0, 100)}
	if r4 := s.Admit(with, "k", pid("r4"), now); r4.Queued == nil {
		t.Fatalf("r4: %+v", r4)
	}
	s.Release("a")
	d := s.Dispatch(now.Add(time.Millisecond))
	if len(d) != 1 || d[0].W != r3.Queued || d[0].Err != nil || d[0].Target.Worker.ID != "a" {
		for _, x := range d {
			t.Logf("dispatched %s: %v", x.W.Req.RequestID, x.Err)
		}
		t.Fatalf("%d dispatched, want r3, the head, routed on a", len(d))
	}
}

// TestTokenizeAsksTakeTurns: asking a worker for a prompt's tokens adds
// no load to it, so a burst of picks that need tokens asks the equally
// loaded workers in turn, not the first of them each time; a busier one
// is asked only when no other is usable.
func TestTokenizeAsksTakeTurns(t *testing.T) {
	s := exactState(t, Config{}, "a", "b", "c", "d")
	for i, id := range []string{"a", "b", "c", "d"} {
		x := caWorker(id)
		x.HTTPAddress = fmt.Sprintf("127.0.0.1:%d", 8001+i)
		s.SetWorker(x)
		events(t, s, id, kvindex.Exact)
	}
	busy := s.workers["d"].HTTPAddress
	s.sent("d") // one in flight: not among the least loaded
	asked := map[string]int{}
	for i := range 12 {
		_, err := s.Pick(&Request{Model: "m", RequestID: fmt.Sprint("r", i), Prompt: words(fmt.Sprint("p", i), 400)}, now)
		var nt *NeedTokensError
		if !errors.As(err, &nt) {
			t.Fatalf("pick %d: %v, want a request for tokens", i, err)
		}
		asked[nt.Worker]++
	}
	if len(asked) != 3 || asked[busy] != 0 {
		t.Fatalf("asked %v: want the three idle workers in turn, four times each, and not %s", asked, busy)
	}
	for w, n := range asked {
		if n != 4 {
			t.Fatalf("asked %v: %s %d times, want 4", asked, w, n)
		}
	}
}
