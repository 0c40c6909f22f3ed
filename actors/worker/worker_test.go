package worker

import (
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestExpire(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := fleet.Worker{LastHeartbeat: t0, Deadline: t0.Add(6 * time.Second)}
	for _, tc := range []struct {
		after time.Duration
		want  bool
	}{
		{0, false},
		{5999 * time.Millisecond, false},
		{6*time.Second - time.Nanosecond, false},
		{6 * time.Second, true},
		{7 * time.Second, true},
	} {
		if got := Expire(w, t0.Add(tc.after)); got != tc.want {
			t.Errorf("Expire at +%v = %v, want %v", tc.after, got, tc.want)
		}
	}
}
