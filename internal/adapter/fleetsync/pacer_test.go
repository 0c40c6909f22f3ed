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
