package kvsub

// Verdict is what a batch's sequence number says of the stream.
type Verdict int

// The verdicts of Tracker.Next.
const (
	// First: the first batch seen (the view starts with it).
	First Verdict = iota + 1
	// InOrder: the batch after the last one.
	InOrder
	// Gap: batches between the last one and this one are missing.
	Gap
	// Restart: the sequence started again from 0: the engine restarted,
	// and its cache is empty.
	Restart
	// Backwards: the sequence went back, not to 0: the stream cannot be
	// trusted.
	Backwards
)

// String names the verdict in logs.
func (v Verdict) String() string {
	switch v {
	case First:
		return "first"
	case InOrder:
		return "in order"
	case Gap:
		return "gap"
	case Restart:
		return "restart"
	case Backwards:
		return "backwards"
	}
	return "unknown"
}

// Tracker follows one publisher's sequence numbers (vLLM counts its
// batches from 0, one publisher per data-parallel rank).
type Tracker struct {
	started bool
	last    uint64
}

// Last returns the last sequence number seen, and whether there is one.
func (t *Tracker) Last() (uint64, bool) { return t.last, t.started }

// Next judges sequence number seq against the last one and makes it the
// last.
func (t *Tracker) Next(seq uint64) Verdict {
	defer func() { t.started, t.last = true, seq }()
	switch {
	case !t.started:
		return First
	case seq == t.last+1:
		return InOrder
	case seq > t.last+1:
		return Gap
	case seq == 0:
		return Restart
	}
	return Backwards
}

// Reset forgets the sequence (a new connection to another engine).
func (t *Tracker) Reset() { *t = Tracker{} }
