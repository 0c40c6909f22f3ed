package tlctl

import (
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestState(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		w    worker
		want string
	}{
		{"routable", worker{Routable: true}, "routable"},
		{"suspect", worker{Routable: true, ConsecutiveFailures: 2}, "suspect"},
		{"ejected", worker{Routable: true, EjectedUntil: now.Add(time.Second).Format(time.RFC3339Nano)}, "ejected"},
		{"ejection over", worker{Routable: true, EjectedUntil: now.Add(-time.Second).Format(time.RFC3339Nano)}, "routable"},
		{"drained first", worker{Routable: true, Drained: true, ConsecutiveFailures: 1}, "drained"},
		{"draining", worker{Draining: true}, "draining"},
		{"unroutable", worker{ConsecutiveFailures: 1}, "unroutable"},
	}
	for _, tc := range cases {
		if got := state(tc.w, now); got != tc.want {
			t.Errorf("%s: state %q, want %q", tc.name, got, tc.want)
		}
	}
}
