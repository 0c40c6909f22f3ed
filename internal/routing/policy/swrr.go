package policy

// forgetAfter is the number of consecutive picks a member may be left out
// of before SWRR forgets its counter. Stale members are swept every
// forgetAfter picks, so one is forgotten between forgetAfter and
// 2·forgetAfter picks after it was last passed.
const forgetAfter = 64

// SWRR is smooth weighted round robin, as in nginx, for one pool of
// workers: each pick adds every candidate's weight to its counter, picks
// the largest counter (ties to the smallest ID) and subtracts the total
// weight of the candidates from it. With weights 1 and 3 it yields
// big, big, small, big, repeating: each candidate is picked in proportion to
// its weight over every cycle of total-weight picks, interleaved rather than
// in runs.
//
// A member left out of a pick (excluded after a failure, briefly not
// routable) keeps its counter unchanged, as nginx does for a peer that is
// down; one left out for about forgetAfter picks is forgotten and starts
// again from zero if it returns, so workers that leave do not accumulate.
//
// The zero value is ready to use. An SWRR is not safe for concurrent use.
type SWRR struct {
	byID map[string]*swrrEntry
	// hints[i] is the entry of the candidate passed at index i in the last
	// pick: callers usually pass the same workers in the same order, and
	// checking a hint is cheaper than a map lookup.
	hints []*swrrEntry
	picks uint64
}

type swrrEntry struct {
	id      string
	current int
	seen    uint64 // number of the last pick the member took part in
}

// Pick returns the index of the candidate picked, or -1 when cands is
// empty. A weight <= 0 counts as 1; a repeated ID takes part once, as its
// first entry.
func (s *SWRR) Pick(cands []Candidate) int {
	if len(cands) == 0 {
		return -1
	}
	if s.byID == nil {
		s.byID = make(map[string]*swrrEntry)
	}
	if len(s.hints) < len(cands) {
		s.hints = append(s.hints, make([]*swrrEntry, len(cands)-len(s.hints))...)
	}
	s.picks++
	pick := s.picks
	total, distinct := 0, 0
	best := -1
	var bestE *swrrEntry
	for i := range cands {
		c := &cands[i]
		e := s.hints[i]
		if e == nil || e.id != c.ID {
			if e = s.byID[c.ID]; e == nil {
				e = &swrrEntry{id: c.ID}
				s.byID[c.ID] = e
			}
			s.hints[i] = e
		}
		if e.seen == pick {
			continue
		}
		e.seen = pick
		distinct++
		w := max(c.Weight, 1)
		e.current += w
		total += w
		if bestE == nil || e.current > bestE.current || (e.current == bestE.current && e.id < bestE.id) {
			best, bestE = i, e
		}
	}
	bestE.current -= total
	if len(s.byID) > distinct && pick%forgetAfter == 0 {
		s.forget(pick)
	}
	return best
}

// forget drops the members left out of the last forgetAfter picks.
func (s *SWRR) forget(pick uint64) {
	for id, e := range s.byID {
		if pick-e.seen >= forgetAfter {
			delete(s.byID, id)
		}
	}
	// A hint may point at a dropped entry; the map is the truth again.
	clear(s.hints)
}
