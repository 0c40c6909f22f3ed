package fleetsync

import "time"

// pacer decides when a replica's pending batch goes out. Batches are
// spaced at least interval apart, without holding back the first event
// after a quiet spell: a batch whose first event comes an interval or more
// after the last batch went out goes at once, one that comes sooner waits
// for the interval's end. Peers then see a lone pick as soon as NATS
// carries it, and a busy replica still publishes at most one batch per
// interval.
//
// Events that only lower what peers count or restate it (releases, load
// reports) are lazy: they wait up to hold for an event that goes sooner
// and ride with it, so a busy replica's releases seldom cost a message of
// their own. A peer sees such an event at most hold late, and until then
// counts the request as still running, which errs towards spreading load.
type pacer struct {
	interval, hold time.Duration
	last           time.Time // when the last batch went out (zero: none yet)
	due            time.Time // when the pending batch goes (zero: none pending)
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

// add takes an event queued at now (lazy: a release or a load report) and
// says when the pending batch goes: reset is false if an earlier send is
// already set (the event rides with it); otherwise the batch goes after d,
// at once if d is 0.
func (p *pacer) add(now time.Time, lazy bool) (d time.Duration, reset bool) {
	d = p.wait(now)
	if lazy {
		d = max(d, p.hold)
	}
	at := now.Add(d)
	if !p.due.IsZero() && !at.Before(p.due) {
		return 0, false
	}
	p.due = at
	return d, true
}

// sent records a batch that went out at now: nothing is pending.
func (p *pacer) sent(now time.Time) { p.last, p.due = now, time.Time{} }
