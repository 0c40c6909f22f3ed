package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestSyncMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	s, err := NewSyncMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewSyncMetrics(reg); err == nil {
		t.Fatal("second NewSyncMetrics on the same registry succeeded")
	}
	s.Up(true)
	s.Sent(SyncPick, 3)
	s.Sent("bogus", 1)
	s.SentBytes(100)
	s.Received(SyncRelease, 2)
	s.ReceivedBytes(50)
	s.Dropped(SyncBatch, SyncDropMalformed, 1)
	s.Dropped(SyncPick, "invented", 1)
	s.Lag(-time.Second)
	s.Snapshot(SnapshotApplied, 4096, 3*time.Millisecond)
	s.Snapshot(SnapshotServed, 4096, 0)
	if got := testutil.ToFloat64(s.up); got != 1 {
		t.Fatalf("sync_up %v", got)
	}
	if got := testutil.ToFloat64(s.sent.WithLabelValues(Other)); got != 1 {
		t.Fatalf("an unknown kind counts as other: %v", got)
	}
	if got := testutil.ToFloat64(s.dropped.WithLabelValues(SyncPick, Other)); got != 1 {
		t.Fatalf("an unknown reason counts as other: %v", got)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
	var nilM *SyncMetrics
	nilM.Up(true)
	nilM.Dropped(SyncPick, SyncDropRate, 1)
	nilM.Snapshot(SnapshotNone, 0, time.Second)
	if _, err := NewSyncMetrics(nil); err == nil {
		t.Fatal("NewSyncMetrics(nil) succeeded")
	}
}
