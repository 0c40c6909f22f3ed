package enginesim

import (
	"context"
	"sync"
	"time"
)

// Clock is the step scheduler's time: when a step starts and how it waits
// out the step's duration. The real clock sleeps; a VirtualClock advances
// at once, so tests and simulations run as fast as the CPU allows and
// never depend on its speed.
type Clock interface {
	Now() time.Time
	// Sleep waits d (or until ctx ends).
	Sleep(ctx context.Context, d time.Duration) error
}

// RealClock is wall-clock time.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// Sleep waits d or until ctx ends.
func (RealClock) Sleep(ctx context.Context, d time.Duration) error { return sleepCtx(ctx, d) }

// VirtualClock is simulated time: Sleep moves it forward at once.
type VirtualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewVirtualClock returns a virtual clock reading start.
func NewVirtualClock(start time.Time) *VirtualClock { return &VirtualClock{now: start} }

// Now returns the virtual time.
func (c *VirtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep advances the virtual time by d without waiting.
func (c *VirtualClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	c.now = c.now.Add(max(d, 0))
	c.mu.Unlock()
	return nil
}
