package ring

import (
	"cmp"
	"slices"
	"strconv"
)

// DefaultVirtualNodes is the number of points each member gets on the ring
// unless WithVirtualNodes says otherwise. With 128 points per member the
// share of keys of each member stays within about ±25% of the mean.
const DefaultVirtualNodes = 128

// Option configures a Ring built by New.
type Option func(*Ring)

// WithVirtualNodes sets the number of points per member; n < 1 keeps the
// default.
func WithVirtualNodes(n int) Option {
	return func(r *Ring) {
		if n >= 1 {
			r.vnodes = n
		}
	}
}

// Ring is a consistent hash ring. Member id's virtual node i sits at
// position Hash64String(id + "#" + strconv.Itoa(i)); equal positions are
// ordered by member id, so a ring's layout depends only on its set of
// members, never on the order they were added in.
//
// The zero value is an empty ring with DefaultVirtualNodes points per member.
type Ring struct {
	vnodes int

	// hashes holds the sorted positions of all points; owners[i] is the slot
	// of the member owning hashes[i].
	hashes []uint64
	owners []int32

	// ids maps a slot to its member id ("" for a free slot); index is the
	// inverse. Slots are stable while a member stays on the ring, so Add and
	// Remove never renumber the points of other members.
	ids   []string
	index map[string]int32
	free  []int32

	// sc and hints are scratch space reused by every pick (see view and
	// GetBoundedFunc), so a pick allocates nothing.
	sc    []slotLoad
	hints []int32
}

// New returns an empty ring configured by opts.
func New(opts ...Option) *Ring {
	r := &Ring{vnodes: DefaultVirtualNodes}
	for _, o := range opts {
		o(r)
	}
	return r
}

func (r *Ring) vnodeCount() int {
	if r.vnodes < 1 {
		return DefaultVirtualNodes
	}
	return r.vnodes
}

// point is one virtual node while the ring is being rebuilt.
type point struct {
	hash uint64
	slot int32
}

// Add puts id on the ring. Adding a member already present, or the empty
// id, does nothing.
func (r *Ring) Add(id string) {
	if id == "" {
		return
	}
	if _, ok := r.index[id]; ok {
		return
	}
	if r.index == nil {
		r.index = make(map[string]int32)
	}
	var slot int32
	if n := len(r.free); n > 0 {
		slot = r.free[n-1]
		r.free = r.free[:n-1]
		r.ids[slot] = id
	} else {
		slot = int32(len(r.ids))
		r.ids = append(r.ids, id)
	}
	r.index[id] = slot

	v := r.vnodeCount()
	fresh := make([]point, v)
	buf := make([]byte, 0, len(id)+12)
	buf = append(buf, id...)
	buf = append(buf, '#')
	for i := range fresh {
		fresh[i] = point{hash: Hash64(strconv.AppendInt(buf, int64(i), 10)), slot: slot}
	}
	slices.SortFunc(fresh, func(a, b point) int { return cmp.Compare(a.hash, b.hash) })
	r.merge(fresh)
}

// less orders two points by position, then by member id.
func (r *Ring) less(ha uint64, sa int32, hb uint64, sb int32) bool {
	if ha != hb {
		return ha < hb
	}
	return r.ids[sa] < r.ids[sb]
}

// merge merges the sorted points of one new member into the ring.
func (r *Ring) merge(fresh []point) {
	n := len(r.hashes) + len(fresh)
	hashes := make([]uint64, 0, n)
	owners := make([]int32, 0, n)
	i, j := 0, 0
	for i < len(r.hashes) && j < len(fresh) {
		if r.less(fresh[j].hash, fresh[j].slot, r.hashes[i], r.owners[i]) {
			hashes = append(hashes, fresh[j].hash)
			owners = append(owners, fresh[j].slot)
			j++
		} else {
			hashes = append(hashes, r.hashes[i])
			owners = append(owners, r.owners[i])
			i++
		}
	}
	hashes = append(hashes, r.hashes[i:]...)
	owners = append(owners, r.owners[i:]...)
	for _, p := range fresh[j:] {
		hashes = append(hashes, p.hash)
		owners = append(owners, p.slot)
	}
	r.hashes, r.owners = hashes, owners
}

// Remove takes id off the ring; removing an absent member does nothing.
func (r *Ring) Remove(id string) {
	slot, ok := r.index[id]
	if !ok {
		return
	}
	k := 0
	for i, s := range r.owners {
		if s != slot {
			r.hashes[k] = r.hashes[i]
			r.owners[k] = s
			k++
		}
	}
	r.hashes = r.hashes[:k]
	r.owners = r.owners[:k]
	delete(r.index, id)
	r.ids[slot] = ""
	r.free = append(r.free, slot)
}

// Has reports whether id is on the ring.
func (r *Ring) Has(id string) bool {
	_, ok := r.index[id]
	return ok
}

// Len returns the number of members.
func (r *Ring) Len() int { return len(r.index) }

// Members returns the member ids in ascending order, in a new slice.
func (r *Ring) Members() []string {
	out := make([]string, 0, len(r.index))
	for id := range r.index {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// search returns the index of the first point at or clockwise after
// position h, wrapping to 0 past the last point. The ring must not be empty.
func (r *Ring) search(h uint64) int {
	lo, hi := 0, len(r.hashes)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if r.hashes[mid] < h {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == len(r.hashes) {
		return 0
	}
	return lo
}

// Get returns the owner of key: the member of the first point clockwise
// from Hash64(key). It returns "" when the ring is empty.
func (r *Ring) Get(key []byte) string {
	if len(r.hashes) == 0 {
		return ""
	}
	return r.ids[r.owners[r.search(Hash64(key))]]
}
