package router

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/routing/policy"
)

// recorder is a Syncer that writes down what it is told.
type recorder struct {
	events  []string
	applied []PeerApplied
}

func (r *recorder) Picked(model, worker string) {
	r.events = append(r.events, fmt.Sprintf("pick %s %s", model, worker))
}
func (r *recorder) Indexed(model, worker string, hashes []uint64) {
	r.events = append(r.events, fmt.Sprintf("index %s %s %d", model, worker, len(hashes)))
}
func (r *recorder) Released(worker string) { r.events = append(r.events, "release "+worker) }
func (r *recorder) Ejected(worker, model, reason string, until time.Time) {
	r.events = append(r.events, fmt.Sprintf("eject %s %s %s %s", worker, model, reason, until.Sub(now)))
}
func (r *recorder) Lifted(worker string)  { r.events = append(r.events, "lift "+worker) }
func (r *recorder) Tick(tr TickReport)    { r.events = append(r.events, fmt.Sprint("load ", tr.Own)) }
func (r *recorder) Applied(a PeerApplied) { r.applied = append(r.applied, a) }

func syncState(t *testing.T, pol policy.Name, sc SyncConfig, ids ...string) (*State, *recorder) {
	t.Helper()
	rec := &recorder{}
	sc.Syncer = rec
	s := NewState(Config{Policy: pol, Sync: sc, Ejection: testEjection}, nil, 1)
	for _, id := range ids {
		x := caWorker(id)
		x.LastHeartbeat, x.Deadline = now, now.Add(time.Hour)
		s.SetWorker(x)
	}
	return s, rec
}

func picks(n int, worker string) []PeerEvent {
	out := make([]PeerEvent, n)
	for i := range out {
		out[i] = PeerEvent{Kind: PeerPick, Model: "m", Worker: worker}
	}
	return out
}

func TestSyncPeerInFlight(t *testing.T) {
	tests := []struct {
		name    string
		batches []PeerBatch
		at      time.Duration // ExpirePeers at now+at, when > 0
		want    map[string]int
		dropped map[PeerDrop]int
	}{
		{"picks count", []PeerBatch{{Replica: "r2", Events: picks(3, "a")}}, 0, map[string]int{"a": 3, "b": 0}, nil},
		{"releases end them, never below zero", []PeerBatch{{Replica: "r2", Events: append(picks(2, "a"),
			PeerEvent{Kind: PeerRelease, Worker: "a"}, PeerEvent{Kind: PeerRelease, Worker: "a"}, PeerEvent{Kind: PeerRelease, Worker: "a"})}},
			0, map[string]int{"a": 0}, nil},
		{"two replicas add up", []PeerBatch{{Replica: "r2", Events: picks(2, "a")}, {Replica: "r3", Events: picks(1, "a")}}, 0, map[string]int{"a": 3}, nil},
		{"capped per replica and worker", []PeerBatch{{Replica: "r2", Events: picks(6, "a")}, {Replica: "r3", Events: picks(1, "a")}},
			0, map[string]int{"a": 5}, map[PeerDrop]int{{PeerPick, DropCapped}: 2}},
		{"a load report sets the counts", []PeerBatch{{Replica: "r2", Events: append(picks(3, "a"),
			PeerEvent{Kind: PeerLoad, Loads: []WorkerLoad{{"b", 2}, {"zz", 4}, {"c", 99}}})}},
			0, map[string]int{"a": 0, "b": 2, "c": 4}, nil},
		{"unknown worker and other model", []PeerBatch{{Replica: "r2", Events: []PeerEvent{
			{Kind: PeerPick, Model: "m", Worker: "zz"}, {Kind: PeerPick, Model: "other", Worker: "a"}, {Kind: 99}}}},
			0, map[string]int{"a": 0}, map[PeerDrop]int{{PeerPick, DropUnknownWorker}: 1, {PeerPick, DropOtherModel}: 1, {99, DropUnknownKind}: 1}},
		{"too many peers", []PeerBatch{{Replica: "r2", Events: picks(1, "a")}, {Replica: "r3", Events: picks(1, "a")}, {Replica: "r4", Events: picks(1, "b")}},
			0, map[string]int{"a": 2, "b": 0}, map[PeerDrop]int{{PeerPick, DropTooManyPeers}: 1}},
		{"a silent peer expires", []PeerBatch{{Replica: "r2", Events: picks(2, "a")}}, 3 * time.Second, map[string]int{"a": 0}, nil},
		{"a peer heard from lately stays", []PeerBatch{{Replica: "r2", Events: picks(2, "a")}}, time.Second, map[string]int{"a": 2}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{MaxPeers: 2, MaxPeerInFlight: 4, PeerTimeout: 2 * time.Second}, "a", "b", "c")
			dropped := map[PeerDrop]int{}
			for _, b := range tt.batches {
				r := s.ApplyPeer(&b, now)
				for k, n := range r.Dropped {
					dropped[k] += n
				}
			}
			if tt.at > 0 {
				s.ExpirePeers(now.Add(tt.at))
			}
			for id, n := range tt.want {
				if got := s.PeerInFlight(id); got != n {
					t.Errorf("peer in flight on %s = %d, want %d", id, got, n)
				}
			}
			if fmt.Sprint(dropped) != fmt.Sprint(tt.dropped) && (len(dropped) > 0 || len(tt.dropped) > 0) {
				t.Errorf("dropped %v, want %v", dropped, tt.dropped)
			}
		})
	}
}

func TestSyncPeerLoadSteersPicks(t *testing.T) {
	for _, pol := range []policy.Name{policy.NameLeastOutstanding, policy.NameCacheAware} {
		t.Run(string(pol), func(t *testing.T) {
			s, _ := syncState(t, pol, SyncConfig{}, "a", "b")
			s.ApplyPeer(&PeerBatch{Replica: "r2", Events: picks(3, "a")}, now)
			tg, err := s.Pick(&Request{Model: "m", RequestID: "x", Prompt: words("p", 300)}, now)
			if err != nil || tg.Worker.ID != "b" {
				t.Fatalf("pick %s %v, want b (a carries the peer's 3)", tg.Worker.ID, err)
			}
			if v := s.Workers(now); v[0].PeerInFlight != 3 {
				t.Fatalf("view of a: peer_in_flight %d, want 3", v[0].PeerInFlight)
			}
		})
	}
}

func TestSyncPeerLoadAgainstHeartbeat(t *testing.T) {
	// The heartbeat's running count includes the peer's requests: they are
	// not counted twice.
	s, _ := syncState(t, policy.NameCacheAware, SyncConfig{}, "a")
	s.ApplyPeer(&PeerBatch{Replica: "r2", Events: picks(3, "a")}, now)
	hb := caWorker("a")
	hb.Running, hb.LastHeartbeat, hb.Deadline = 5, now.Add(time.Second), now.Add(time.Hour)
	s.SetWorker(hb)
	hb.LastHeartbeat = now.Add(2 * time.Second)
	s.SetWorker(hb)
	if got := slotLoad(s.inflight["a"]); got != 5 {
		t.Fatalf("slot load %d, want 5 (3 of the peer, 2 foreign)", got)
	}
}

func TestSyncPeerLoadCountsAgainstLimits(t *testing.T) {
	s, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{}, "a")
	s.cfg.Admission = AdmissionConfig{Enabled: true, Worker: 2, QueueSize: 4, QueueTimeout: time.Second}
	s.SetWorker(*s.workers["a"])
	s.ApplyPeer(&PeerBatch{Replica: "r2", Events: picks(2, "a")}, now)
	// The engine's report shows them running: they fill the slots.
	hb := *s.workers["a"]
	hb.Running, hb.LastHeartbeat = 2, now.Add(time.Second)
	s.SetWorker(hb)
	ad := s.Admit(&Request{Model: "m"}, "k", nil, now)
	if ad.Queued == nil {
		t.Fatalf("admit %+v, want queued behind the peer's 2 at the limit of 2", ad)
	}
	r := s.ApplyPeer(&PeerBatch{Replica: "r2", Events: []PeerEvent{{Kind: PeerRelease, Worker: "a"}}}, now)
	if !r.Released {
		t.Fatal("a peer release not reported")
	}
	if d := s.Dispatch(now); len(d) != 1 || d[0].Err != nil || d[0].Target.Worker.ID != "a" {
		t.Fatalf("dispatch after the peer's release: %+v", d)
	}
}

// TestSyncPeerClaimsCorroborated: the peers' claims on a worker count in
// routing up to what the engine's last report shows beyond the gateway's
// own requests, plus the peers' picks since (at most the margin), and in
// admission up to the report alone; both at most the worker's limit.
func TestSyncPeerClaimsCorroborated(t *testing.T) {
	tests := []struct {
		name       string
		limit      int
		running    int // the engine's report after the claims; -1: none
		own        int // the gateway's requests on the worker before the report
		claims     []PeerEvent
		after      []PeerEvent // peer events after the report
		load, adm  int
		uncorrobor int
	}{
		{"a load report the engine does not show", 0, 0, 0,
			[]PeerEvent{{Kind: PeerLoad, Loads: []WorkerLoad{{"a", 256}}}}, nil, 0, 0, 256},
		{"borne out by the report", 0, 5, 1,
			[]PeerEvent{{Kind: PeerLoad, Loads: []WorkerLoad{{"a", 10}}}}, nil, 4, 4, 6},
		{"picks since the report count, up to the margin", 0, -1, 0,
			picks(20, "a"), nil, 8, 0, 12},
		{"picks after a report that showed none count anew", 0, 0, 0,
			picks(20, "a"), picks(3, "a"), 3, 0, 20},
		{"at most the worker's limit", 4, 100, 0,
			[]PeerEvent{{Kind: PeerLoad, Loads: []WorkerLoad{{"a", 256}}}}, nil, 4, 4, 252},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{MaxPeerInFlight: 256}, "a")
			if tt.limit > 0 {
				s.cfg.Admission = AdmissionConfig{Enabled: true, Worker: tt.limit, QueueSize: 4, QueueTimeout: time.Second}
				s.SetWorker(*s.workers["a"])
			}
			for range tt.own {
				if _, err := s.Pick(&Request{Model: "m"}, now); err != nil {
					t.Fatal(err)
				}
			}
			s.ApplyPeer(&PeerBatch{Replica: "r2", Events: tt.claims}, now)
			if tt.running >= 0 {
				hb := *s.workers["a"]
				hb.Running, hb.LastHeartbeat = tt.running, now.Add(time.Second)
				s.SetWorker(hb)
			}
			s.ApplyPeer(&PeerBatch{Replica: "r2", Events: tt.after}, now)
			c := s.inflight["a"]
			if got := c.peerLoad(); got != tt.load {
				t.Errorf("peer load in routing %d, want %d", got, tt.load)
			}
			if got := c.peerAdmitted(); got != tt.adm {
				t.Errorf("peer load in admission %d, want %d", got, tt.adm)
			}
			if got := s.Uncorroborated(); got != tt.uncorrobor {
				t.Errorf("uncorroborated %d, want %d", got, tt.uncorrobor)
			}
		})
	}
}

func TestSyncPeerPrefixIndex(t *testing.T) {
	prompt := words("conversation", 2000)
	tests := []struct {
		name       string
		chunkBytes int
		worker     string
		want       string
		dropped    map[PeerDrop]int
	}{
		{"a peer's prompt on b draws its next turn to b", 128, "b", "b", nil},
		{"another chunking's hashes are dropped", 64, "b", "a", map[PeerDrop]int{{PeerIndex, DropChunkBytes}: 1}},
		{"an unknown worker's are dropped", 128, "zz", "a", map[PeerDrop]int{{PeerPick, DropUnknownWorker}: 1, {PeerIndex, DropUnknownWorker}: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := syncState(t, policy.NameCacheAware, SyncConfig{}, "a", "b")
			hs := s.prefix.index.Hashes(nil, prompt)
			r := s.ApplyPeer(&PeerBatch{Replica: "r2", ChunkBytes: tt.chunkBytes, Events: []PeerEvent{
				{Kind: PeerPick, Model: "m", Worker: tt.worker},
				{Kind: PeerIndex, Model: "m", Worker: tt.worker, Hashes: hs},
				{Kind: PeerRelease, Worker: tt.worker},
			}}, now)
			if fmt.Sprint(r.Dropped) != fmt.Sprint(tt.dropped) && (len(r.Dropped) > 0 || len(tt.dropped) > 0) {
				t.Errorf("dropped %v, want %v", r.Dropped, tt.dropped)
			}
			tg, err := s.Pick(&Request{Model: "m", Prompt: prompt + "next turn"}, now)
			if err != nil || tg.Worker.ID != tt.want {
				t.Fatalf("pick %s %v, want %s", tg.Worker.ID, err, tt.want)
			}
		})
	}
}

// A peer's pick for a LoRA adapter counts on the worker that serves it
// (the adapter is not the worker's base model), and its prompt is indexed
// under the base model, where the router looks it up.
func TestSyncPeerPickOfAnAdapter(t *testing.T) {
	s, _ := syncState(t, policy.NameCacheAware, SyncConfig{})
	for _, id := range []string{"a", "b"} {
		x := caWorker(id)
		x.Adapters = []string{"l1"}
		x.LastHeartbeat, x.Deadline = now, now.Add(time.Hour)
		s.SetWorker(x)
	}
	prompt := words("sys", 3000)
	base, ns := indexKey("m", "l1", "")
	r := s.ApplyPeer(&PeerBatch{Replica: "r2", ChunkBytes: 128, Events: []PeerEvent{
		{Kind: PeerPick, Model: "l1", Worker: "b"},
		{Kind: PeerIndex, Model: base, Worker: "b", Hashes: s.prefix.index.HashesIn(nil, ns, prompt)},
		{Kind: PeerPick, Model: "nope", Worker: "b"},
	}}, now)
	if s.PeerInFlight("b") != 1 || r.Applied[PeerPick] != 1 || r.Applied[PeerIndex] != 1 || r.Dropped[PeerDrop{PeerPick, DropOtherModel}] != 1 {
		t.Fatalf("peer in flight on b %d, applied %v, dropped %v", s.PeerInFlight("b"), r.Applied, r.Dropped)
	}
	s.ApplyPeer(&PeerBatch{Replica: "r2", Events: []PeerEvent{{Kind: PeerRelease, Worker: "b"}}}, now)
	if tg, err := s.Pick(&Request{Model: "l1", Prompt: prompt + "next"}, now); err != nil || tg.Worker.ID != "b" || tg.MatchedTokens == 0 {
		t.Fatalf("pick %s matched %d %v, want b by the peer's prompt", tg.Worker.ID, tg.MatchedTokens, err)
	}
}

func TestSyncTellsOwnDecisions(t *testing.T) {
	s, rec := syncState(t, policy.NameCacheAware, SyncConfig{}, "a", "b")
	prompt := words("p", 300) // two whole chunks
	tg, err := s.Pick(&Request{Model: "m", Prompt: prompt}, now)
	if err != nil {
		t.Fatal(err)
	}
	// The prompt is told with the pick, before its answer began.
	answered(s, tg)
	s.Release("a")
	s.Release("a") // one more than acquired: not told
	for range 3 {
		s.AttemptFailed("b", "reset", now)
	}
	// A pick whose answer never began tells its prompt too (peers keep it
	// in their peer share), though the router does not record it.
	if tg, err = s.Pick(&Request{Model: "m", Prompt: words("q", 300)}, now); err != nil || tg.Worker.ID != "a" {
		t.Fatalf("pick %s %v, want a", tg.Worker.ID, err)
	}
	s.Release("a")
	want := []string{"pick m a", "index m a 2", "release a", "eject b m reset 10s", "pick m a", "index m a 2", "release a"}
	if !slices.Equal(rec.events, want) {
		t.Fatalf("told %q, want %q", rec.events, want)
	}
}

func TestSyncPeerEjection(t *testing.T) {
	eject := func(replica, worker string, d time.Duration) *PeerBatch {
		return &PeerBatch{Replica: replica, Events: []PeerEvent{{Kind: PeerEject, Model: "m", Worker: worker, Reason: "refused", For: d}}}
	}
	tests := []struct {
		name    string
		run     func(s *State) PeerApplied // the last ejection's
		ejected bool
		until   time.Duration
		suspect bool
	}{
		{"one peer's word alone: suspect, not ejected", func(s *State) PeerApplied {
			return s.ApplyPeer(eject("r2", "a", 10*time.Second), now)
		}, false, 0, true},
		{"with a failure of the replica's own", func(s *State) PeerApplied {
			s.AttemptFailed("a", "reset", now)
			return s.ApplyPeer(eject("r2", "a", 10*time.Second), now)
		}, true, 10 * time.Second, false},
		{"with a quorum of two peers", func(s *State) PeerApplied {
			s.ApplyPeer(eject("r2", "a", 10*time.Second), now)
			return s.ApplyPeer(eject("r3", "a", 20*time.Second), now)
		}, true, 20 * time.Second, false},
		{"a peer's word twice is one word", func(s *State) PeerApplied {
			s.ApplyPeer(eject("r2", "a", 10*time.Second), now)
			return s.ApplyPeer(eject("r2", "a", 10*time.Second), now)
		}, false, 0, true},
		{"with the fleet listed, only listed replicas make a quorum", func(s *State) PeerApplied {
			s.cfg.Sync.Listed = []string{"r2", "r9"}
			s.ApplyPeer(eject("r2", "a", 10*time.Second), now)
			return s.ApplyPeer(eject("made-up", "a", 10*time.Second), now)
		}, false, 0, true},
		{"two listed replicas do", func(s *State) PeerApplied {
			s.cfg.Sync.Listed = []string{"r2", "r3"}
			s.ApplyPeer(eject("r2", "a", 10*time.Second), now)
			return s.ApplyPeer(eject("r3", "a", 20*time.Second), now)
		}, true, 20 * time.Second, false},
		{"a word past its end counts no more", func(s *State) PeerApplied {
			s.ApplyPeer(eject("r2", "a", 10*time.Second), now)
			return s.ApplyPeer(eject("r3", "a", 10*time.Second), now.Add(10*time.Second))
		}, false, 0, true},
		{"at most the local maximum", func(s *State) PeerApplied {
			s.AttemptFailed("a", "reset", now)
			return s.ApplyPeer(eject("r2", "a", time.Hour), now)
		}, true, 25 * time.Second, false},
		{"within the pool's cap", func(s *State) PeerApplied {
			for range 3 {
				s.AttemptFailed("b", "reset", now)
			}
			s.AttemptFailed("a", "reset", now)
			return s.ApplyPeer(eject("r2", "a", 10*time.Second), now)
		}, false, 0, true},
		{"not another model's worker", func(s *State) PeerApplied {
			s.AttemptFailed("a", "reset", now)
			return s.ApplyPeer(&PeerBatch{Replica: "r2", Events: []PeerEvent{{Kind: PeerEject, Model: "x", Worker: "a", For: 10 * time.Second}}}, now)
		}, false, 0, true},
		{"not with ejection off", func(s *State) PeerApplied {
			s.cfg.Ejection.MaxPercent = 0
			return s.ApplyPeer(eject("r2", "a", 10*time.Second), now)
		}, false, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{}, "a", "b")
			r := tt.run(s)
			if got := s.ejected("a", now); got != tt.ejected {
				t.Fatalf("ejected %v, want %v (%+v)", got, tt.ejected, r)
			}
			if got := s.inflight["a"].suspect; got != tt.suspect {
				t.Fatalf("suspect %v, want %v", got, tt.suspect)
			}
			if tt.ejected {
				if len(r.Ejected) != 1 || r.Ejected[0].Sub(now) != tt.until {
					t.Fatalf("ejection ends %v, want now+%s", r.Ejected, tt.until)
				}
				if tg, err := s.Pick(&Request{Model: "m"}, now); err != nil || tg.Worker.ID != "b" {
					t.Fatalf("pick %s %v, want b", tg.Worker.ID, err)
				}
			}
		})
	}
}

// TestSyncPeerEjectionTrial: a worker a peer alone ejected is suspect: the
// next request there is a trial whose failure ejects it at once, and
// whose success drops the peer's word.
func TestSyncPeerEjectionTrial(t *testing.T) {
	word := &PeerBatch{Replica: "r2", Events: []PeerEvent{{Kind: PeerEject, Model: "m", Worker: "a", Reason: "refused", For: 10 * time.Second}}}
	t.Run("a failure ejects", func(t *testing.T) {
		s, rec := syncState(t, policy.NameLeastOutstanding, SyncConfig{}, "a", "b")
		s.ApplyPeer(word, now)
		e := s.AttemptFailed("a", "reset", now) // 3 in a row eject without the word
		if !e.Ejected || !s.ejected("a", now) || e.Until.Sub(now) != testEjection.Base {
			t.Fatalf("after one failure with the peer's word: %+v, want ejected for one base time", e)
		}
		if !slices.Contains(rec.events, "eject a m reset 10s") {
			t.Fatalf("the ejection was not told to the peers: %q", rec.events)
		}
	})
	t.Run("a success drops the word", func(t *testing.T) {
		s, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{}, "a", "b")
		s.ApplyPeer(word, now)
		s.AttemptSucceeded("a")
		if e := s.AttemptFailed("a", "reset", now); e.Ejected {
			t.Fatal("one failure after a success ejected: the peer's word was kept")
		}
		if r := s.ApplyPeer(&PeerBatch{Replica: "r3", Events: word.Events}, now); len(r.Ejected) != 1 {
			t.Fatal("a second peer's word with a failure of the replica's own did not eject")
		}
	})
	t.Run("a belied peer's word is ignored until the end it claimed", func(t *testing.T) {
		s, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{}, "a", "b")
		s.ApplyPeer(word, now)
		s.AttemptSucceeded("a")
		r := s.ApplyPeer(word, now.Add(9*time.Second))
		if s.inflight["a"].suspect || r.Dropped[PeerDrop{PeerEject, DropNoEvidence}] != 1 {
			t.Fatalf("the same peer's word again: suspect %v, dropped %v; want ignored", s.inflight["a"].suspect, r.Dropped)
		}
		s.ApplyPeer(word, now.Add(10*time.Second))
		if !s.inflight["a"].suspect {
			t.Fatal("the peer's word after the end it claimed was ignored too")
		}
	})
}

func TestSyncSnapshotWarmsAReplica(t *testing.T) {
	src, _ := syncState(t, policy.NameCacheAware, SyncConfig{}, "a", "b")
	prompt := words("sys", 3000)
	src.ApplyPeer(&PeerBatch{Replica: "r3", Events: picks(1, "b")}, now) // b busier: the pick goes to a
	if tg, _ := src.Pick(&Request{Model: "m", Prompt: prompt}, now); tg.Worker.ID != "a" {
		t.Fatalf("source pick %s, want a", tg.Worker.ID)
	} else {
		answered(src, tg)
	}
	for range 3 {
		src.AttemptFailed("b", "reset", now)
	}
	snap := src.MakeSnapshot(1<<16, 1<<20, now)
	if len(snap.Index) != 1 || snap.Index[0].Worker != "a" || len(snap.InFlight) != 1 || len(snap.Ejections) != 1 {
		t.Fatalf("snapshot %+v", snap)
	}
	dst, _ := syncState(t, policy.NameCacheAware, SyncConfig{}, "a", "b", "c")
	dst.ApplySnapshot("r1", snap, now)
	// One peer's ejection is its word, not evidence: b is suspect.
	if dst.PeerInFlight("a") != 1 || dst.ejected("b", now) || !dst.inflight["b"].suspect {
		t.Fatalf("warm view: a peer in flight %d, b ejected %v suspect %v", dst.PeerInFlight("a"), dst.ejected("b", now), dst.inflight["b"].suspect)
	}
	dst.ApplyPeer(&PeerBatch{Replica: "r1", Events: []PeerEvent{{Kind: PeerRelease, Worker: "a"}}}, now)
	if tg, _ := dst.Pick(&Request{Model: "m", Prompt: prompt + "more"}, now); tg.Worker.ID != "a" || tg.MatchedTokens == 0 {
		t.Fatalf("warm pick %s matched %d, want a by the index", tg.Worker.ID, tg.MatchedTokens)
	}
}

func TestSyncOwnLoad(t *testing.T) {
	s, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{}, "a", "b")
	for range 2 {
		if _, err := s.Pick(&Request{Model: "m"}, now); err != nil {
			t.Fatal(err)
		}
	}
	if got := fmt.Sprint(s.OwnLoad()); got != "[{a 1} {b 1}]" {
		t.Fatalf("own load %s", got)
	}
}

func TestSyncSnapshotWaitsForUnknownWorkers(t *testing.T) {
	src, _ := syncState(t, policy.NameCacheAware, SyncConfig{}, "a")
	prompt := words("sys", 3000)
	if tg, err := src.Pick(&Request{Model: "m", Prompt: prompt}, now); err != nil {
		t.Fatal(err)
	} else {
		answered(src, tg)
	}
	snap := src.MakeSnapshot(1<<16, 1<<20, now)
	for _, tt := range []struct {
		name      string
		heartbeat time.Time
		want      bool
	}{
		{"the first heartbeat within peer_timeout applies it", now.Add(time.Second), true},
		{"a later one does not", now.Add(time.Minute), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dst, _ := syncState(t, policy.NameCacheAware, SyncConfig{PeerTimeout: 5 * time.Second})
			dst.ApplySnapshot("r1", snap, now)
			a := caWorker("a")
			a.LastHeartbeat, a.Deadline = tt.heartbeat, tt.heartbeat.Add(time.Hour)
			dst.SetWorker(a)
			if got := dst.indexChunks("a") > 0; got != tt.want {
				t.Fatalf("indexed %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSyncTieSaltSpreadsTies: replicas that see the same equal loads break
// the tie by their own salt, so not all of them send their next request to
// the same worker; each keeps to its own order, and without a salt the tie
// goes to the smallest id as on a single gateway.
func TestSyncTieSaltSpreadsTies(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	first := func(pol policy.Name, salt uint64) string {
		t.Helper()
		s, _ := syncState(t, pol, SyncConfig{TieSalt: salt}, ids...)
		tg, err := s.Pick(&Request{Model: "m", RequestID: "x", Prompt: words("p", 300)}, now)
		if err != nil {
			t.Fatal(err)
		}
		s.Release(tg.Worker.ID)
		again, err := s.Pick(&Request{Model: "m", RequestID: "y", Prompt: words("q", 300)}, now)
		if err != nil || again.Worker.ID != tg.Worker.ID {
			t.Fatalf("salt %d: the same tie went to %s, then %s (%v)", salt, tg.Worker.ID, again.Worker.ID, err)
		}
		return tg.Worker.ID
	}
	for _, pol := range []policy.Name{policy.NameLeastOutstanding, policy.NameCacheAware} {
		t.Run(string(pol), func(t *testing.T) {
			if got := first(pol, 0); got != "a" {
				t.Fatalf("no salt: tie went to %s, want a (the smallest id)", got)
			}
			seen := map[string]bool{}
			for salt := uint64(1); salt <= 16; salt++ {
				seen[first(pol, salt*0x9e3779b97f4a7c15)] = true
			}
			if len(seen) < 3 {
				t.Fatalf("16 salts broke the tie towards only %v, want most of %v", seen, ids)
			}
		})
	}
}

// TestSyncPeerExpiresAtTimeout: a peer heard from at seen is kept at
// seen + PeerTimeout - 1ns and forgotten, with its load, at exactly
// seen + PeerTimeout.
func TestSyncPeerExpiresAtTimeout(t *testing.T) {
	const timeout = 2 * time.Second
	s, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{PeerTimeout: timeout}, "a")
	s.ApplyPeer(&PeerBatch{Replica: "r2", Events: picks(2, "a")}, now)
	if s.ExpirePeers(now.Add(timeout-time.Nanosecond)) || s.PeerInFlight("a") != 2 || len(s.Peers()) != 1 {
		t.Fatalf("a nanosecond before its timeout: peers %v, peer in flight %d", s.Peers(), s.PeerInFlight("a"))
	}
	if !s.ExpirePeers(now.Add(timeout)) || s.PeerInFlight("a") != 0 || len(s.Peers()) != 0 {
		t.Fatalf("at its timeout: peers %v, peer in flight %d, want it forgotten", s.Peers(), s.PeerInFlight("a"))
	}
}

// TestSyncWarmStartIntoWarmIndex: a snapshot applied to a replica whose
// index is warm already imports every chunk the peer exported for a
// worker (up to its capacity): more than one prompt's share, and past
// the chunks the replica holds itself, which end the export's list.
func TestSyncWarmStartIntoWarmIndex(t *testing.T) {
	src, _ := syncState(t, policy.NameCacheAware, SyncConfig{}, "a")
	dst, _ := syncState(t, policy.NameCacheAware, SyncConfig{}, "a")
	shared := words("shared", 3000) // both replicas sent it to a
	for _, s := range []*State{src, dst} {
		tg, err := s.Pick(&Request{Model: "m", Prompt: shared}, now)
		if err != nil {
			t.Fatal(err)
		}
		answered(s, tg)
		s.Release("a")
	}
	share := src.prefix.index.RequestShare("a")
	var prompts []string
	for i := 0; src.indexChunks("a") <= share+src.prefix.index.Chunks(len(shared)); i++ {
		p := words(fmt.Sprintf("only the source's %d", i), 3000)
		prompts = append(prompts, p)
		tg, err := src.Pick(&Request{Model: "m", Prompt: p}, now)
		if err != nil {
			t.Fatal(err)
		}
		answered(src, tg)
		src.Release("a")
	}
	snap := src.MakeSnapshot(1<<20, 1<<20, now)
	if len(snap.Index) != 1 || len(snap.Index[0].Hashes) <= share {
		t.Fatalf("the source exported %d entries, want one of more than %d chunks", len(snap.Index), share)
	}
	before := dst.indexChunks("a")
	dst.ApplySnapshot("r1", snap, now)
	want := before + len(snap.Index[0].Hashes) - dst.prefix.index.Chunks(len(shared))
	if got := dst.indexChunks("a"); got != want {
		t.Fatalf("after the snapshot the warm index holds %d chunks of a, want %d (its own %d and every other one exported)", got, want, before)
	}
	for i, p := range prompts {
		if tg, _ := dst.Pick(&Request{Model: "m", Prompt: p}, now); tg.MatchedTokens == 0 {
			t.Fatalf("prompt %d of the source's not found after the warm start", i)
		}
		dst.Release("a")
	}
}

// TestPendingIndexExpires: a snapshot's entry for a worker that never
// shows up is dropped once its wait is over.
func TestPendingIndexExpires(t *testing.T) {
	src, _ := syncState(t, policy.NameCacheAware, SyncConfig{}, "a")
	tg, err := src.Pick(&Request{Model: "m", Prompt: words("sys", 3000)}, now)
	if err != nil {
		t.Fatal(err)
	}
	answered(src, tg)
	dst, _ := syncState(t, policy.NameCacheAware, SyncConfig{PeerTimeout: 5 * time.Second})
	dst.ApplySnapshot("r1", src.MakeSnapshot(1<<16, 1<<20, now), now)
	dst.ExpirePending(now.Add(5 * time.Second))
	if len(dst.pendingIndex) != 1 {
		t.Fatalf("%d entries wait before their wait is over, want 1", len(dst.pendingIndex))
	}
	dst.ExpirePending(now.Add(5*time.Second + time.Nanosecond))
	if len(dst.pendingIndex) != 0 {
		t.Fatalf("%d entries still wait after their wait, want none", len(dst.pendingIndex))
	}
}

// TestPinnedPickPublished: a pinned pick (a Responses follow-up) is told
// to the peers like any other, so its release does not undercount them.
func TestPinnedPickPublished(t *testing.T) {
	s, rec := syncState(t, policy.NameLeastOutstanding, SyncConfig{}, "a", "b")
	tg, err := s.Pick(&Request{Model: "m", Pin: "b"}, now)
	if err != nil || tg.Worker.ID != "b" {
		t.Fatalf("pinned pick %s %v, want b", tg.Worker.ID, err)
	}
	s.Release("b")
	if want := []string{"pick m b", "release b"}; !slices.Equal(rec.events, want) {
		t.Fatalf("told %q, want %q", rec.events, want)
	}
}

// TestSyncPeerStandingAtMaxPeers: at max_peers a replica not tracked
// takes the place of one of lower standing (listed above known above new;
// the one admitted last goes), or is refused.
func TestSyncPeerStandingAtMaxPeers(t *testing.T) {
	const timeout = 2 * time.Second
	hear := func(s *State, id string, at time.Duration) PeerApplied {
		return s.ApplyPeer(&PeerBatch{Replica: id, Events: picks(1, "a")}, now.Add(at))
	}
	tests := []struct {
		name    string
		run     func(s *State) PeerApplied // the last arrival
		refused bool
		peers   []string
	}{
		{"a new id is refused, the tracked kept", func(s *State) PeerApplied {
			hear(s, "x1", 0)
			hear(s, "x2", time.Millisecond)
			return hear(s, "x3", 2*time.Millisecond)
		}, true, []string{"x1", "x2"}},
		{"a listed id displaces the new one admitted last", func(s *State) PeerApplied {
			hear(s, "x1", 0)
			hear(s, "x2", time.Millisecond)
			return hear(s, "listed", 2*time.Millisecond)
		}, false, []string{"listed", "x1"}},
		{"a known id back within the window displaces a new one", func(s *State) PeerApplied {
			hear(s, "back", 0)
			s.ExpirePeers(now.Add(timeout)) // silent: forgotten, but known
			hear(s, "x1", timeout+time.Millisecond)
			hear(s, "x2", timeout+2*time.Millisecond)
			return hear(s, "back", timeout+3*time.Millisecond)
		}, false, []string{"back", "x1"}},
		{"a known id back after the window is new", func(s *State) PeerApplied {
			hear(s, "back", 0)
			s.ExpirePeers(now.Add(KnownPeerWindow))
			hear(s, "x1", KnownPeerWindow+time.Millisecond)
			hear(s, "x2", KnownPeerWindow+2*time.Millisecond)
			return hear(s, "back", KnownPeerWindow+3*time.Millisecond)
		}, true, []string{"x1", "x2"}},
		{"a known id never displaces a listed one", func(s *State) PeerApplied {
			hear(s, "back", 0)
			s.ExpirePeers(now.Add(timeout))
			hear(s, "listed", timeout)
			hear(s, "listed2", timeout)
			return hear(s, "back", timeout+time.Millisecond)
		}, true, []string{"listed", "listed2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{MaxPeers: 2, PeerTimeout: timeout, Listed: []string{"listed", "listed2"}}, "a")
			r := tt.run(s)
			if r.Refused != tt.refused || r.Joined == tt.refused {
				t.Fatalf("refused %v joined %v, want refused %v", r.Refused, r.Joined, tt.refused)
			}
			if got := s.Peers(); !slices.Equal(got, tt.peers) {
				t.Fatalf("tracked %v, want %v", got, tt.peers)
			}
			if got := s.PeerInFlight("a"); got != len(tt.peers) {
				t.Fatalf("peer in flight on a %d, want one of each tracked replica's (%d): a displaced one's went", got, len(tt.peers))
			}
		})
	}
}

// TestSnapshotFilledInShares: a snapshot's index is copied a share at a
// time (at least one worker's, at most maxHashes unless one worker holds
// more), so the router serves its other messages between the shares.
func TestSnapshotFilledInShares(t *testing.T) {
	s, _ := syncState(t, policy.NameCacheAware, SyncConfig{}, "a", "b", "c")
	for _, id := range []string{"a", "b", "c"} {
		hs := make([]uint64, 100)
		for i := range hs {
			hs[i] = uint64(id[0])<<32 | uint64(i)
		}
		s.ApplyPeer(&PeerBatch{Replica: "r2", ChunkBytes: 128, Events: []PeerEvent{{Kind: PeerIndex, Model: "m", Worker: id, Hashes: hs}}}, now)
	}
	job := s.PlanSnapshot(1<<20, 1<<20, now)
	var steps []int
	for done := false; !done; {
		before := len(job.Snapshot.Index)
		done = s.FillSnapshot(job, 150)
		steps = append(steps, len(job.Snapshot.Index)-before)
	}
	if !slices.Equal(steps, []int{1, 1, 1}) {
		t.Fatalf("workers copied per step %v, want one at a time (100 hashes each, 150 a step)", steps)
	}
	job = s.PlanSnapshot(1<<20, 1<<20, now)
	if !s.FillSnapshot(job, 1000) || len(job.Snapshot.Index) != 3 {
		t.Fatalf("a step of 1000 hashes copied %d workers, want all 3", len(job.Snapshot.Index))
	}
}
