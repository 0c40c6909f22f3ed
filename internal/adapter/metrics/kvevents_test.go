package metrics

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestKVMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	k, err := NewKVMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewKVMetrics(reg); err == nil {
		t.Fatal("second NewKVMetrics on the same registry succeeded")
	}
	k.Received("w1", 5, false)
	k.Received("w1", 2, true)
	k.Gap("w1", 3, true)
	k.Gap("w1", 3, false)
	k.Replayed("w1", 4, nil)
	k.Replayed("w1", 0, errors.New("refused"))
	k.Problem("w1", "flood")
	k.Problem("w1", "invented")
	k.Connected("w1", true)
	k.Applied("w1", 10, 2, 1, 3, 0)
	k.SetViews([]KVView{{Worker: "w1", View: "exact", Blocks: map[string]int{"gpu": 7, "cpu": 2}}, {Worker: "w2", View: "stale"}})
	k.Pick("r", ViewExact)
	k.Pick("r", ViewApproximate)
	k.Pick("r", "")
	k.Pick("r", ViewAgreed)
	k.Agreement("m", true)
	k.Agreement("m", false)
	k.Agreement("m", true)
	k.Tokenized(TokenizeOK, 3*time.Millisecond)
	k.Tokenized("bogus", time.Millisecond)
	k.TokenCache("prefix")
	if got := testutil.ToFloat64(k.events.WithLabelValues("w1")); got != 7 {
		t.Fatalf("events %v", got)
	}
	if got := testutil.ToFloat64(k.problems.WithLabelValues("w1", Other)); got != 1 {
		t.Fatalf("an unknown problem counts as other: %v", got)
	}
	if got := testutil.ToFloat64(k.picks.WithLabelValues("r", ViewAgreed)); got != 1 {
		t.Fatalf("agreed picks %v", got)
	}
	if a, d := testutil.ToFloat64(k.agreement.WithLabelValues(CheckAgreed)), testutil.ToFloat64(k.agreement.WithLabelValues(CheckDisagreed)); a != 2 || d != 1 {
		t.Fatalf("agreement checks %v agreed, %v disagreed; want 2, 1", a, d)
	}
	if got := testutil.ToFloat64(k.stale); got != 1 {
		t.Fatalf("stale workers %v", got)
	}
	if got := testutil.ToFloat64(k.index.WithLabelValues("w1", "gpu")); got != 7 {
		t.Fatalf("gpu blocks %v", got)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	k.Forget("w1")
	if n := testutil.CollectAndCount(k.batches); n != 0 {
		t.Fatalf("%d batch series left after Forget", n)
	}
	var nilK *KVMetrics
	nilK.Received("w", 1, false)
	nilK.SetViews(nil)
	nilK.Forget("w")
}
