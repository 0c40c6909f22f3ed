package router

import (
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/sticky"
)

// stored is a peer's report that worker stores response id of key alice.
func stored(id, worker string, d time.Duration) PeerEvent {
	return PeerEvent{Kind: PeerStored, ID: sticky.Digest(id), Owner: sticky.OwnerTag(id, "alice"), Worker: worker, For: d}
}

func forget(id string) PeerEvent { return PeerEvent{Kind: PeerForget, ID: sticky.Digest(id)} }

func TestSyncPeerStored(t *testing.T) {
	tests := []struct {
		name    string
		noShare bool
		own     map[string]string // the replica's own records
		events  []PeerEvent
		want    map[string]string // id -> worker found ("" : none)
		dropped map[PeerDrop]int
	}{
		{"a known worker's is recorded", false, nil,
			[]PeerEvent{stored("r1", "a", time.Minute)}, map[string]string{"r1": "a"}, nil},
		{"an unknown worker's is not", false, nil,
			[]PeerEvent{stored("r1", "nobody", time.Minute)}, map[string]string{"r1": ""},
			map[PeerDrop]int{{PeerStored, DropUnknownWorker}: 1}},
		{"a digest of the wrong length is refused", false, nil,
			[]PeerEvent{{Kind: PeerStored, ID: "resp_in_clear", Owner: sticky.OwnerTag("resp_in_clear", "alice"), Worker: "a", For: time.Minute}}, nil,
			map[PeerDrop]int{{PeerStored, DropInvalid}: 1}},
		{"no time left is refused", false, nil,
			[]PeerEvent{stored("r1", "a", 0)}, map[string]string{"r1": ""},
			map[PeerDrop]int{{PeerStored, DropInvalid}: 1}},
		{"a peer's record cannot move the own", false, map[string]string{"r1": "a"},
			[]PeerEvent{stored("r1", "b", time.Minute)}, map[string]string{"r1": "a"}, nil},
		{"a forget drops the peer's record", false, nil,
			[]PeerEvent{stored("r1", "a", time.Minute), forget("r1")}, map[string]string{"r1": ""}, nil},
		{"a forget keeps the own record", false, map[string]string{"r1": "a"},
			[]PeerEvent{forget("r1")}, map[string]string{"r1": "a"}, nil},
		{"without a record both are dropped", true, nil,
			[]PeerEvent{stored("r1", "a", time.Minute), forget("r1")}, nil,
			map[PeerDrop]int{{PeerStored, DropUnknownKind}: 1, {PeerForget, DropUnknownKind}: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := sticky.New(sticky.Config{})
			sc := SyncConfig{Stored: m}
			if tt.noShare {
				sc.Stored = nil
			}
			s, _ := syncState(t, policy.NameLeastOutstanding, sc, "a", "b")
			for id, w := range tt.own {
				m.Put(id, w, "alice", now)
			}
			r := s.ApplyPeer(&PeerBatch{Replica: "r2", Events: tt.events}, now)
			for id, want := range tt.want {
				if got, _ := m.Worker(id, "alice", now.Add(time.Second)); got != want {
					t.Errorf("%s on %q, want %q", id, got, want)
				}
			}
			if len(r.Dropped) != len(tt.dropped) {
				t.Fatalf("dropped %v, want %v", r.Dropped, tt.dropped)
			}
			for d, n := range tt.dropped {
				if r.Dropped[d] != n {
					t.Fatalf("dropped %v, want %v", r.Dropped, tt.dropped)
				}
			}
		})
	}
}

// TestSyncApplyStored: a peer's own records, as it tells them when first
// heard from, are recorded in its share; those of workers not known yet
// wait for their first heartbeat, within peer_timeout.
func TestSyncApplyStored(t *testing.T) {
	recs := []StoredRecord{
		{ID: sticky.Digest("mine"), Owner: sticky.OwnerTag("mine", "alice"), Worker: "a", For: 50 * time.Minute},
		{ID: sticky.Digest("theirs"), Owner: sticky.OwnerTag("theirs", "alice"), Worker: "b", For: 20 * time.Minute},
	}
	for _, tt := range []struct {
		name      string
		heartbeat time.Time // of b, not known when the records arrive
		tick      time.Time // a SyncTick before it, when not zero
		want      string    // theirs's worker after it
	}{
		{"the first heartbeat within peer_timeout applies it", now.Add(time.Second), time.Time{}, "b"},
		{"a later one does not", now.Add(time.Minute), time.Time{}, ""},
		{"a tick after peer_timeout drops it", now.Add(time.Second), now.Add(time.Minute), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := sticky.New(sticky.Config{})
			dst, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{Stored: m, PeerTimeout: 5 * time.Second}, "a")
			r := dst.ApplyStored("r1", recs, now)
			if r.Applied[PeerStored] != 1 || !r.Joined {
				t.Fatalf("applied %v joined %v, want the known worker's one stored response from a new peer", r.Applied, r.Joined)
			}
			if got, _ := m.Worker("mine", "alice", now.Add(49*time.Minute)); got != "a" {
				t.Fatalf("mine on %q, want a for its 50 minutes left", got)
			}
			if got, ok := m.Worker("mine", "bob", now); ok {
				t.Fatalf("mine found for bob on %q", got)
			}
			if !tt.tick.IsZero() {
				dst.ExpirePending(tt.tick)
			}
			b := caWorker("b")
			b.LastHeartbeat, b.Deadline = tt.heartbeat, tt.heartbeat.Add(time.Hour)
			dst.SetWorker(b)
			if got, _ := m.Worker("theirs", "alice", tt.heartbeat); got != tt.want {
				t.Fatalf("theirs on %q, want %q", got, tt.want)
			}
			if tt.want != "" {
				if got, _ := m.Worker("theirs", "alice", now.Add(20*time.Minute)); got != "" {
					t.Fatalf("theirs on %q after its 20 minutes", got)
				}
			}
		})
	}
}

func TestSyncApplyStoredReplacesWaiting(t *testing.T) {
	m := sticky.New(sticky.Config{})
	dst, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{Stored: m}, "a")
	rec := func(id string) []StoredRecord {
		return []StoredRecord{{ID: sticky.Digest(id), Owner: sticky.OwnerTag(id, "alice"), Worker: "b", For: time.Hour}}
	}
	dst.ApplyStored("r1", rec("old"), now)
	dst.ApplyStored("r1", rec("new"), now)
	dst.ApplyStored("r2", rec("other"), now)
	b := caWorker("b")
	b.LastHeartbeat, b.Deadline = now, now.Add(time.Hour)
	dst.SetWorker(b)
	if got, _ := m.Worker("old", "alice", now); got != "" {
		t.Fatalf("old on %q: the replica's first list's waiting entries outlived its second", got)
	}
	for _, id := range []string{"new", "other"} {
		if got, _ := m.Worker(id, "alice", now); got != "b" {
			t.Fatalf("%s on %q, want b", id, got)
		}
	}
}
