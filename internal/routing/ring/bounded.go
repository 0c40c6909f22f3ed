package ring

import "math"

// capSlack absorbs the binary rounding of decimal load factors, so that
// c = 1.1 with m+1 = 10 and n = 11 gives the cap 1 that the decimal
// arithmetic gives, not 2.
const capSlack = 1e-9

// Cap returns the bounded-loads capacity ⌈c·(m+1)/n⌉ for n eligible members
// carrying m requests in total: a member is picked only while its load is
// below it. A load factor below 1 (or NaN) counts as 1, which keeps at least
// one member below the cap; +Inf disables the bound (math.MaxInt). Cap
// returns 0 when n < 1.
func Cap(n, m int, c float64) int {
	if n < 1 {
		return 0
	}
	if !(c >= 1) {
		c = 1
	}
	x := math.Ceil(c*(float64(m)+1)/float64(n) - capSlack)
	if x >= math.MaxInt {
		return math.MaxInt
	}
	return int(x)
}

// slotLoad is the per-call view of one member slot: its load, and its
// candidate index plus one (0 when the member is not eligible).
type slotLoad struct {
	load int32
	cand int32
}

// clampLoad maps a load to the range [0, MaxInt32] the scratch space holds.
func clampLoad(l int) int {
	if l < 0 {
		return 0
	}
	if l > math.MaxInt32 {
		return math.MaxInt32
	}
	return l
}

// view returns r.sc resized to one zeroed entry per member slot.
func (r *Ring) view() []slotLoad {
	n := len(r.ids)
	if cap(r.sc) < n {
		r.sc = make([]slotLoad, n, n+n/4)
	}
	r.sc = r.sc[:n]
	clear(r.sc)
	return r.sc
}

// GetBounded picks a member for key by consistent hashing with bounded
// loads. The eligible members are the ring members present in loads (a
// member absent from loads is never returned; ids in loads that are not on
// the ring are ignored); loads gives each one's current load (negative
// counts as 0). With n eligible members carrying m in total, GetBounded
// walks clockwise from Hash64(key) and returns the first eligible member
// whose load is below Cap(n, m, c). skipped reports that this is not the
// owner, the first eligible member on the walk. It returns ("", false) when
// no member is eligible.
func (r *Ring) GetBounded(key []byte, loads map[string]int, c float64) (id string, skipped bool) {
	if len(r.hashes) == 0 || len(loads) == 0 {
		return "", false
	}
	sc := r.view()
	n, m := 0, 0
	if len(loads) <= len(r.index) {
		for mid, l := range loads {
			if s, ok := r.index[mid]; ok {
				l = clampLoad(l)
				sc[s] = slotLoad{load: int32(l), cand: 1}
				n, m = n+1, m+l
			}
		}
	} else {
		for s, mid := range r.ids {
			if mid == "" {
				continue
			}
			if l, ok := loads[mid]; ok {
				l = clampLoad(l)
				sc[s] = slotLoad{load: int32(l), cand: 1}
				n, m = n+1, m+l
			}
		}
	}
	slot, skipped := r.walk(Hash64(key), sc, Cap(n, m, c))
	if slot < 0 {
		return "", false
	}
	return r.ids[slot], skipped
}

// GetBoundedFunc is GetBounded over n candidates given by index: cand(i)
// returns the id and load of candidate i, for i in [0, n). It returns the
// index of the chosen candidate, or -1 when none is on the ring (or n is
// not in [1, math.MaxInt32)). A repeated id counts once, as its first
// candidate. cand is not retained.
//
// It suits callers holding candidates in a slice: it needs no map, and when
// successive calls pass the same ids in the same order (a router rebuilding
// its candidate list from a stable worker list) it resolves them without a
// map lookup, so a pick costs little more than a pass over the candidates.
func (r *Ring) GetBoundedFunc(key []byte, n int, cand func(i int) (id string, load int), c float64) (idx int, skipped bool) {
	if len(r.hashes) == 0 || n <= 0 || n >= math.MaxInt32 {
		return -1, false
	}
	sc := r.view()
	if cap(r.hints) < n {
		r.hints = append(r.hints[:cap(r.hints)], make([]int32, n-cap(r.hints))...)
	}
	hints := r.hints[:n]
	eligible, m := 0, 0
	for i := range n {
		id, l := cand(i)
		// hints[i] is the slot candidate i had at the last call: callers
		// usually pass the same candidates in the same order, and checking a
		// hint is cheaper than a map lookup.
		s := hints[i]
		if s < 0 || int(s) >= len(r.ids) || id == "" || r.ids[s] != id {
			var ok bool
			if s, ok = r.index[id]; !ok {
				s = -1
			}
			hints[i] = s
		}
		if s < 0 || sc[s].cand != 0 {
			continue
		}
		l = clampLoad(l)
		sc[s] = slotLoad{load: int32(l), cand: int32(i + 1)}
		eligible, m = eligible+1, m+l
	}
	slot, skipped := r.walk(Hash64(key), sc, Cap(eligible, m, c))
	if slot < 0 {
		return -1, false
	}
	return int(sc[slot].cand - 1), skipped
}

// walk returns the slot of the first eligible point clockwise from h whose
// load is below limit, and whether an eligible member came before it. It
// returns -1 when no eligible member is below the limit.
func (r *Ring) walk(h uint64, sc []slotLoad, limit int) (slot int32, skipped bool) {
	if limit <= 0 {
		return -1, false
	}
	owner := int32(-1)
	i := r.search(h)
	for range len(r.hashes) {
		s := r.owners[i]
		if e := sc[s]; e.cand != 0 {
			if owner < 0 {
				owner = s
			}
			if int(e.load) < limit {
				return s, s != owner
			}
		}
		if i++; i == len(r.hashes) {
			i = 0
		}
	}
	return -1, false
}
