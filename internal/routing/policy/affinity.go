package policy

import "github.com/tlgate/tlgate/internal/routing/ring"

// Affinity picks a candidate for the prefix key by consistent hashing with
// bounded loads (ring.Ring.GetBoundedFunc) with load factor c: the
// candidates are the eligible members, with their Load. It returns the
// index of the pick and ReasonAffinity when it is the key's owner (its
// first candidate clockwise on r), ReasonLoad when the owner was at the cap
// and the pick moved clockwise. It returns (-1, "") when no candidate is on
// r (or r is nil). A repeated ID counts once, as its first entry.
//
// Affinity uses r's scratch space, so it must not run concurrently with
// any other use of r.
func Affinity(r *ring.Ring, key []byte, cands []Candidate, c float64) (idx int, reason string) {
	if r == nil || len(cands) == 0 {
		return -1, ""
	}
	idx, skipped := r.GetBoundedFunc(key, len(cands), func(i int) (string, int) {
		return cands[i].ID, cands[i].Load
	}, c)
	switch {
	case idx < 0:
		return -1, ""
	case skipped:
		return idx, ReasonLoad
	default:
		return idx, ReasonAffinity
	}
}
