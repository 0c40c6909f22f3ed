package policy

// Reasons a disaggregated pair's decode worker is picked with.
const (
	// ReasonDecodeLoad: the fewest running sequences among the decode
	// workers with KV to spare (ties: the most free KV blocks).
	ReasonDecodeLoad = "decode_load"
	// ReasonDecodeKV: a decode worker running fewer sequences had next to
	// no free KV (it would queue or preempt), so the pick went by free KV.
	ReasonDecodeKV = "decode_kv"
)

// ReasonKept is a prefill worker kept for a retried decode: it holds the
// prompt's KV blocks for the request already.
const ReasonKept = "kept"

// DecodeCandidate is a decode worker as DecodeByLoad sees it.
type DecodeCandidate struct {
	Candidate
	// Running is its sequences: the gateway's in flight there, the other
	// replicas' and what its reports show beyond both (running and
	// queued).
	Running int
	// FreeKV and TotalKV are its reported KV blocks (TotalKV 0: unknown,
	// taken as having room).
	FreeKV, TotalKV int
}

// FullKV is the share of its KV blocks below which a decode worker counts
// as full: every sequence it decodes grows its KV, so one with less free
// queues new work or preempts running sequences.
const FullKV = 0.05

// full reports whether c's free KV is below FullKV of its total.
func (c *DecodeCandidate) full() bool {
	return c.TotalKV > 0 && float64(c.FreeKV) < FullKV*float64(c.TotalKV)
}

// DecodeByLoad picks the decode worker of a disaggregated pair: the one
// running the fewest sequences (decode time per token grows with the
// batch), ties to the most free KV blocks, then Tie and ID; workers whose
// KV is full (FullKV) only when every one is, then by free KV first. It
// returns the index and the reason, or -1 with no candidate.
func DecodeByLoad(cs []DecodeCandidate) (int, string) {
	best, anyRoom := -1, false
	for i := range cs {
		if !cs[i].full() {
			anyRoom = true
			break
		}
	}
	for i := range cs {
		c := &cs[i]
		if anyRoom && c.full() {
			continue
		}
		if best < 0 || decodeLess(c, &cs[best], !anyRoom) {
			best = i
		}
	}
	if best < 0 {
		return -1, ""
	}
	reason := ReasonDecodeLoad
	for i := range cs {
		if cs[i].full() && cs[i].Running < cs[best].Running {
			reason = ReasonDecodeKV
		}
	}
	return best, reason
}

// decodeLess orders decode candidates: fewer running sequences, then more
// free KV (the other way round when byKV), then Tie, then ID.
func decodeLess(a, b *DecodeCandidate, byKV bool) bool {
	if byKV && a.FreeKV != b.FreeKV {
		return a.FreeKV > b.FreeKV
	}
	if a.Running != b.Running {
		return a.Running < b.Running
	}
	if a.FreeKV != b.FreeKV {
		return a.FreeKV > b.FreeKV
	}
	if a.Tie != b.Tie {
		return a.Tie < b.Tie
	}
	return a.ID < b.ID
}
