package router

import (
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/sticky"
)

func stored(id, worker string, d time.Duration) PeerEvent {
	return PeerEvent{Kind: PeerStored, ID: id, Worker: worker, For: d}
}

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
		{"an over-long id is refused", false, nil,
			[]PeerEvent{stored(strings.Repeat("x", sticky.MaxIDBytes+1), "a", time.Minute)}, nil,
			map[PeerDrop]int{{PeerStored, DropInvalid}: 1}},
		{"no time left is refused", false, nil,
			[]PeerEvent{stored("r1", "a", 0)}, map[string]string{"r1": ""},
			map[PeerDrop]int{{PeerStored, DropInvalid}: 1}},
		{"a peer's record cannot move the own", false, map[string]string{"r1": "a"},
			[]PeerEvent{stored("r1", "b", time.Minute)}, map[string]string{"r1": "a"}, nil},
		{"a forget drops the peer's record", false, nil,
			[]PeerEvent{stored("r1", "a", time.Minute), {Kind: PeerForget, ID: "r1"}}, map[string]string{"r1": ""}, nil},
		{"a forget keeps the own record", false, map[string]string{"r1": "a"},
			[]PeerEvent{{Kind: PeerForget, ID: "r1"}}, map[string]string{"r1": "a"}, nil},
		{"without a record both are dropped", true, nil,
			[]PeerEvent{stored("r1", "a", time.Minute), {Kind: PeerForget, ID: "r1"}}, nil,
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
				m.Put(id, w, now)
			}
			r := s.ApplyPeer(&PeerBatch{Replica: "r2", Events: tt.events}, now)
			for id, want := range tt.want {
				if got, _ := m.Worker(id, now.Add(time.Second)); got != want {
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

func TestSyncSnapshotCarriesStored(t *testing.T) {
	srcMap := sticky.New(sticky.Config{})
	src, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{Stored: srcMap}, "a", "b")
	srcMap.Put("mine", "a", now.Add(-10*time.Minute))
	src.ApplyPeer(&PeerBatch{Replica: "r3", Events: []PeerEvent{stored("theirs", "b", 20*time.Minute)}}, now)
	snap := src.MakeSnapshot(16, 1<<20, now)
	srcMap.Export(MaxSnapshotStored, now, func(id, worker string, ttl time.Duration) { // as the Syncer adds them
		snap.Stored = append(snap.Stored, SnapshotStored{ID: id, Worker: worker, For: ttl})
	})
	want := []SnapshotStored{{"mine", "a", 50 * time.Minute}, {"theirs", "b", 20 * time.Minute}}
	if len(snap.Stored) != 2 || snap.Stored[0] != want[0] || snap.Stored[1] != want[1] {
		t.Fatalf("snapshot's stored %+v, want %+v", snap.Stored, want)
	}

	for _, tt := range []struct {
		name      string
		heartbeat time.Time // of b, not known when the snapshot arrives
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
			r := dst.ApplySnapshot("r1", snap, now)
			if r.Applied[PeerStored] != 1 {
				t.Fatalf("applied %v, want the known worker's one stored response", r.Applied)
			}
			if got, _ := m.Worker("mine", now.Add(49*time.Minute)); got != "a" {
				t.Fatalf("mine on %q, want a for its 50 minutes left", got)
			}
			if got, _ := m.Worker("mine", now.Add(50*time.Minute)); got != "" {
				t.Fatalf("mine on %q after its 50 minutes", got)
			}
			if !tt.tick.IsZero() {
				dst.expirePendingStored(tt.tick)
			}
			b := caWorker("b")
			b.LastHeartbeat, b.Deadline = tt.heartbeat, tt.heartbeat.Add(time.Hour)
			dst.SetWorker(b)
			if got, _ := m.Worker("theirs", tt.heartbeat); got != tt.want {
				t.Fatalf("theirs on %q, want %q", got, tt.want)
			}
			if tt.want != "" {
				if got, _ := m.Worker("theirs", now.Add(20*time.Minute)); got != "" {
					t.Fatalf("theirs on %q after its 20 minutes", got)
				}
			}
		})
	}
}

func TestSyncSnapshotReplacesWaitingStored(t *testing.T) {
	m := sticky.New(sticky.Config{})
	dst, _ := syncState(t, policy.NameLeastOutstanding, SyncConfig{Stored: m}, "a")
	dst.ApplySnapshot("r1", &Snapshot{Stored: []SnapshotStored{{"old", "b", time.Hour}}}, now)
	dst.ApplySnapshot("r1", &Snapshot{Stored: []SnapshotStored{{"new", "b", time.Hour}}}, now)
	b := caWorker("b")
	b.LastHeartbeat, b.Deadline = now, now.Add(time.Hour)
	dst.SetWorker(b)
	if got, _ := m.Worker("old", now); got != "" {
		t.Fatalf("old on %q: the first snapshot's waiting entries outlived the second", got)
	}
	if got, _ := m.Worker("new", now); got != "b" {
		t.Fatalf("new on %q, want b", got)
	}
}
