package fleetsync

import "time"

// pacer spaces a replica's batches at least an interval apart without
// holding back the first event after a quiet spell: a batch whose first
// event comes an interval or more after the last batch went out goes at
// once, one that comes sooner waits for the interval's end. Peers then
// see a lone pick as soon as NATS carries it, and a busy replica still
// publishes at most one batch per interval.
type pacer struct {
	interval time.Duration
	last     time.Time // when the last batch went out (zero: none yet)
}

// wait is how long a batch that gets its first event at now waits before
// it goes out: 0, or what is left of the interval since the last batch
// (never more than the interval).
func (p *pacer) wait(now time.Time) time.Duration {
	if p.last.IsZero() {
		return 0
	}
	return min(p.interval, max(0, p.interval-now.Sub(p.last)))
}

// sent records a batch that went out at now.
func (p *pacer) sent(now time.Time) { p.last = now }
