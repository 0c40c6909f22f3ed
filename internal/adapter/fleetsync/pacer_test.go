package fleetsync

import (
	"testing"
	"time"
)

func TestPacerWait(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		last time.Time // zero: nothing sent yet
		now  time.Time
		want time.Duration
	}{
		{"first batch goes at once", time.Time{}, t0, 0},
		{"after a quiet interval, at once", t0, t0.Add(5 * ms), 0},
		{"exactly an interval later, at once", t0, t0.Add(ms), 0},
		{"within the interval, waits for its end", t0, t0.Add(300 * time.Microsecond), 700 * time.Microsecond},
		{"right after a batch, a whole interval", t0, t0, ms},
		{"clock stepped back, at most an interval", t0, t0.Add(-ms), ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pacer{interval: ms, last: tc.last}
			if got := p.wait(tc.now); got != tc.want {
				t.Fatalf("wait = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPacerAdd drives the pacer through sequences of queued events, each
// step checking when the pending batch goes.
func TestPacerAdd(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	type step struct {
		at        time.Duration // after t0
		lazy      bool
		sent      bool // a batch goes out at at, before the event (no event then)
		wantD     time.Duration
		wantReset bool
	}
	for _, tc := range []struct {
		name  string
		hold  time.Duration
		steps []step
	}{
		{"a lone pick goes at once", 5 * ms, []step{{at: 0, wantD: 0, wantReset: true}}},
		{"a lone release waits the hold", 5 * ms, []step{{at: 0, lazy: true, wantD: 5 * ms, wantReset: true}}},
		{"a pick takes a waiting release along at once", 5 * ms, []step{
			{at: 0, lazy: true, wantD: 5 * ms, wantReset: true},
			{at: 2 * ms, wantD: 0, wantReset: true},
		}},
		{"a release rides with a paced pick", 5 * ms, []step{
			{at: 0, sent: true},
			{at: 200 * time.Microsecond, wantD: 800 * time.Microsecond, wantReset: true},
			{at: 500 * time.Microsecond, lazy: true},
		}},
		{"a pick soon after a batch brings a release forward to the interval's end", 5 * ms, []step{
			{at: 0, sent: true},
			{at: 100 * time.Microsecond, lazy: true, wantD: 5 * ms, wantReset: true},
			{at: 600 * time.Microsecond, wantD: 400 * time.Microsecond, wantReset: true},
		}},
		{"a second release keeps the first's deadline", 5 * ms, []step{
			{at: 0, lazy: true, wantD: 5 * ms, wantReset: true},
			{at: 3 * ms, lazy: true},
		}},
		{"a held release holds the interval too", 500 * time.Microsecond, []step{
			{at: 0, sent: true},
			{at: 100 * time.Microsecond, lazy: true, wantD: 900 * time.Microsecond, wantReset: true},
		}},
		{"without a hold a release goes like a pick", 0, []step{{at: 0, lazy: true, wantD: 0, wantReset: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pacer{interval: ms, hold: tc.hold}
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				if s.sent {
					p.sent(now)
					continue
				}
				d, reset := p.add(now, s.lazy)
				if d != s.wantD || reset != s.wantReset {
					t.Fatalf("step %d: add = %v, %v; want %v, %v", i, d, reset, s.wantD, s.wantReset)
				}
				if reset && d == 0 {
					p.sent(now)
				}
			}
		})
	}
}
