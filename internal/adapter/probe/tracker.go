package probe

// The thresholds a Tracker uses when Rise or Fall is below 1.
const (
	// DefaultRise is how many consecutive good probes make an engine live.
	DefaultRise = 2
	// DefaultFall is how many consecutive failed probes make a live engine
	// stop being live: heartbeat_miss_limit's default.
	DefaultFall = 3
)

// Tracker is the flap rule for probed engines, a pure state machine fed one
// probe outcome at a time. An engine starts not live; Rise consecutive good
// probes make it live, and once live only Fall consecutive failures make it
// stop (Fall is the gateway's heartbeat_miss_limit), so a single failure or
// a single success never flips it with thresholds above 1. An outcome that
// agrees with the current state resets the streak towards a change.
//
// The zero value uses DefaultRise and DefaultFall. A Tracker is not safe
// for concurrent use.
type Tracker struct {
	Rise int // consecutive good probes to become live; < 1 means DefaultRise
	Fall int // consecutive failed probes to stop being live; < 1 means DefaultFall

	live   bool
	streak int // consecutive outcomes against the current state
}

// Observe records one probe outcome and returns whether the engine is live
// after it and whether that changed with this outcome.
func (t *Tracker) Observe(ok bool) (live, changed bool) {
	if ok == t.live {
		t.streak = 0
		return t.live, false
	}
	t.streak++
	need := t.Fall
	if ok {
		need = t.Rise
	}
	if need < 1 {
		need = DefaultFall
		if ok {
			need = DefaultRise
		}
	}
	if t.streak < need {
		return t.live, false
	}
	t.live, t.streak = ok, 0
	return t.live, true
}

// Live reports whether the engine is live after the outcomes observed so far.
func (t *Tracker) Live() bool { return t.live }
