package fleetsync

import (
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
)

// TestSnapshotSizedBeforeCopying: the router plans its index to the bytes
// a snapshot may take before copying any hash: the snapshot encodes within
// them, uses most of them, and a worker holding less than an even share
// leaves the rest to the others.
func TestSnapshotSizedBeforeCopying(t *testing.T) {
	now := time.Now()
	st := router.NewState(router.Config{Policy: policy.NameCacheAware}, nil, 1)
	held := map[string]int{"a": 100, "b": 20000, "c": 20000}
	var events []router.PeerEvent
	for id, n := range held {
		st.SetWorker(fleet.Worker{ID: id, Model: "m", Role: fleet.RoleUnified, KVTotalBlocks: 1 << 20, KVBlockTokens: 16,
			LastHeartbeat: now, Deadline: now.Add(time.Hour)})
		for i := 0; i < n; i += 1000 {
			hs := make([]uint64, min(1000, n-i))
			for j := range hs {
				hs[j] = uint64(len(id))<<40 | uint64(id[0])<<32 | uint64(i+j)
			}
			events = append(events, router.PeerEvent{Kind: router.PeerIndex, Model: "m", Worker: id, Hashes: hs})
		}
	}
	st.ApplyPeer(&router.PeerBatch{Replica: "r2", ChunkBytes: 128, Events: events}, now)
	const limit = 64 << 10
	snap := st.MakeSnapshot(1<<20, limit, now)
	data := EncodeSnapshot(nil, strings.Repeat("r", MaxString), snap)
	if len(data) > limit || len(data) < limit*9/10 {
		t.Fatalf("snapshot of %d bytes, want at most %d and most of it", len(data), limit)
	}
	got := map[string]int{}
	for _, e := range snap.Index {
		got[e.Worker] = len(e.Hashes)
	}
	if got["a"] != held["a"] || got["b"] != got["c"] || got["b"] < 3500 {
		t.Fatalf("hashes per worker %v: want a's 100 whole and b and c an even share of the rest", got)
	}
}
