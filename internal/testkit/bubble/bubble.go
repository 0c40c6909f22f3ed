// Package bubble runs a test in a testing/synctest bubble with a deadline
// in real time. Fake time stands still while any goroutine of the bubble
// can run, so a defect that makes an actor re-arm a timer at "now" forever
// (a check at the exact deadline that never fires) spins without end and
// the test would hang until the package timeout, ten minutes later. With
// Test, it fails after DefaultDeadline instead, naming the cause.
package bubble

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// DefaultDeadline is the real time a bubble may run: far above what the
// tests need on a loaded machine (well under a second of CPU), far below
// the package timeout.
const DefaultDeadline = 10 * time.Second

// spinning names the first test whose bubble outlived its deadline: its
// goroutines still run, so later bubbles of the package fail at once
// rather than each waiting out its own deadline beside it.
var spinning struct {
	sync.Mutex
	name string
}

// Test is synctest.Test with DefaultDeadline.
func Test(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	Within(t, DefaultDeadline, f)
}

// Within is synctest.Test, failing t if the bubble has not ended after d
// of real time.
func Within(t *testing.T, d time.Duration, f func(t *testing.T)) {
	t.Helper()
	spinning.Lock()
	earlier := spinning.name
	spinning.Unlock()
	if earlier != "" {
		t.Fatalf("not started: the synctest bubble of %s still spins", earlier)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		synctest.Test(t, f)
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		spinning.Lock()
		spinning.name = t.Name()
		spinning.Unlock()
		t.Fatalf("the synctest bubble is still running after %v of real time: fake time cannot advance, so some goroutine spins (a timer re-armed at its own deadline, say) or the test waits forever", d)
	}
}
