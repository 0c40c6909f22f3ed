package loadgen

import (
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func ds(ms ...int) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, v := range ms {
		out[i] = time.Duration(v) * time.Millisecond
	}
	return out
}

func TestPercentile(t *testing.T) {
	ten := ds(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one sample", ds(7), 99, 7 * time.Millisecond},
		{"median of ten is the fifth", ten, 50, 5 * time.Millisecond},
		{"p90 of ten is the ninth", ten, 90, 9 * time.Millisecond},
		{"p99 of ten is the largest", ten, 99, 10 * time.Millisecond},
		{"p100 is the largest", ten, 100, 10 * time.Millisecond},
		{"a tiny p is the smallest", ten, 0.1, 1 * time.Millisecond},
		{"p99 of a hundred is the 99th", hundred, 99, 99 * time.Millisecond},
		{"p50 of a hundred is the 50th", hundred, 50, 50 * time.Millisecond},
		{"p99.9 of a hundred is the largest", hundred, 99.9, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.sorted, tc.p); got != tc.want {
				t.Errorf("Percentile(%d samples, %v) = %v, want %v", len(tc.sorted), tc.p, got, tc.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	in := ds(9, 1, 5, 3, 7, 2, 8, 4, 6, 10)
	s := Summarize(in)
	want := Summary{Count: 10, Mean: 5500 * time.Microsecond, P50: 5 * time.Millisecond, P90: 9 * time.Millisecond,
		P99: 10 * time.Millisecond, Max: 10 * time.Millisecond}
	if s != want {
		t.Errorf("Summarize = %+v, want %+v", s, want)
	}
	if in[0] != 9*time.Millisecond {
		t.Error("Summarize sorted its input in place")
	}
	if (Summarize(nil) != Summary{}) {
		t.Error("Summarize(nil) is not the zero Summary")
	}
}
