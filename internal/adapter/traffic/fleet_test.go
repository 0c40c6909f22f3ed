package traffic

import (
	"encoding/json"
	"testing"
	"time"
)

// TestSnapshotWithPeers: the fleet's snapshot sums every replica's
// buckets (over JSON, as fleet sync carries them): requests, errors by
// code, failovers, cascade verdicts and the latency histograms, in the
// same buckets; a peer's ring of another width, and its buckets outside
// the window, are left out.
func TestSnapshotWithPeers(t *testing.T) {
	a, ca := newRec(Config{})
	b, cb := newRec(Config{})
	for range 3 {
		a.Request("smol", "", 10*time.Millisecond, 2*time.Millisecond)
	}
	a.Request("smol", "no_capacity", time.Millisecond, 0)
	b.Request("smol", "no_capacity", time.Millisecond, 0)
	b.Request("smol", "upstream_failed", 400*time.Millisecond, 0)
	b.Failover("smol")
	b.Cascade("auto", true)
	ca.add(6 * time.Second)
	cb.add(6 * time.Second)
	b.Request("smol", "", 400*time.Millisecond, 300*time.Millisecond)

	var raw Raw
	js, err := json.Marshal(b.Raw())
	if err != nil || json.Unmarshal(js, &raw) != nil {
		t.Fatalf("raw over JSON: %v %s", err, js)
	}
	other := raw
	other.Width = int64(time.Second)
	snap := a.SnapshotWith([]Raw{raw, other})
	if snap.Replicas != 2 {
		t.Fatalf("replicas %d, want 2 (the peer of another width left out)", snap.Replicas)
	}
	s := model(t, snap, "smol")
	if s.Totals.Requests != 7 || s.Totals.Errors != 3 || s.Totals.ErrorsByCode["no_capacity"] != 2 || s.Totals.ErrorsByCode["upstream_failed"] != 1 || s.Totals.Failovers != 1 {
		t.Fatalf("smol totals %+v, want both replicas' summed", s.Totals)
	}
	n := len(s.Requests)
	if s.Requests[n-2] != 6 || s.Requests[n-1] != 1 {
		t.Fatalf("smol's last buckets %v, want 6 then 1", s.Requests[n-2:])
	}
	if p := s.Totals.LatencyP99; p == nil || *p < 300 {
		t.Fatalf("latency p99 %v, want the peer's 400 ms seen", p)
	}
	if m := model(t, snap, "auto"); m.Totals.CascadeAccepted != 1 {
		t.Fatalf("auto %+v, want the peer's cascade verdict", m.Totals)
	}
	if own := a.Snapshot(); own.Replicas != 1 || model(t, own, "smol").Totals.Requests != 4 {
		t.Fatalf("a's own snapshot: %d replicas, %+v", own.Replicas, model(t, own, "smol").Totals)
	}
	// A bucket from outside the window counts nothing.
	old := Raw{Width: int64(DefaultWidth), Models: []RawModel{{Model: "smol", Buckets: []RawSlot{{Num: a.bucketNum(ca.now()) - DefaultBuckets, Requests: 99}}}}}
	if got := model(t, a.SnapshotWith([]Raw{old}), "smol").Totals.Requests; got != 4 {
		t.Fatalf("a bucket from outside the window counted: %d requests", got)
	}
}
