// Package flowqueue is the order of the admission queue: priority bands,
// fair turns inside a band, and deadlines inside a flow.
//
//   - Bands: every entry has an integer priority; the band of the highest
//     priority is always served first, whatever waits in the others.
//   - Keys: inside a band the API keys with waiting entries take turns,
//     one entry per turn (deficit round robin with a quantum of one). A key
//     that starts waiting takes its turn after the keys already waiting.
//   - Flows: inside a key, its fairness ids (a key's own end users) take
//     turns the same way, so a key that splits its traffic into many flows
//     gains no share over another key.
//   - Deadlines: inside a flow, the entry with the earliest Due leaves
//     first (ties by arrival, Seq).
//
// A Queue is pure data: no goroutine, no clock. It is not safe for
// concurrent use; its owner (the router actor) serializes access.
package flowqueue

import (
	"slices"
	"sort"
	"time"
)

// Item is what the queue orders an entry by.
type Item struct {
	// Priority is the entry's band: higher is served first; negative is
	// sheddable (Queue.ShedBelow).
	Priority int
	// Key is the API key whose turns the entry takes; Flow the fairness id
	// inside the key ("" for the key's own).
	Key, Flow string
	// Due orders entries inside a flow, earliest first: the arrival plus
	// the entry's latency objective (or its queue deadline when it has
	// none).
	Due time.Time
	// Arrived is when the entry joined (Oldest).
	Arrived time.Time
	// Seq breaks ties of Due: the smaller (earlier) first. Unique per
	// entry.
	Seq uint64
}

// before reports whether a leaves its flow before b.
func (a *Item) before(b *Item) bool {
	if !a.Due.Equal(b.Due) {
		return a.Due.Before(b.Due)
	}
	return a.Seq < b.Seq
}

// Entry is one waiting value and its place in the queue.
type Entry[T any] struct {
	Item
	Value T
	f     *flow[T] // nil once the entry left the queue
}

// Queued reports whether the entry is still in its queue.
func (e *Entry[T]) Queued() bool { return e.f != nil }

// turns is a round robin: order holds the members in turn order and next
// the index of the one whose turn it is.
type turns[M comparable] struct {
	order []M
	next  int
}

// join adds m as the last to get a turn: just before the current one.
func (t *turns[M]) join(m M) {
	t.order = slices.Insert(t.order, t.next, m)
	if len(t.order) > 1 {
		t.next++
	}
	if t.next >= len(t.order) {
		t.next = 0
	}
}

// current is the member whose turn it is.
func (t *turns[M]) current() M { return t.order[t.next] }

// pass hands the turn to the next member.
func (t *turns[M]) pass() { t.next = (t.next + 1) % len(t.order) }

// leave takes m out; the turn stays with the member that had it, or goes
// to the one after m when it was m's.
func (t *turns[M]) leave(m M) {
	i := slices.Index(t.order, m)
	if i < 0 {
		return
	}
	t.order = slices.Delete(t.order, i, i+1)
	if i < t.next {
		t.next--
	}
	if t.next >= len(t.order) {
		t.next = 0
	}
}

// flow is one fairness id's entries, in leaving order.
type flow[T any] struct {
	id      string
	k       *key[T]
	entries []*Entry[T]
}

// key is one API key's flows in a band.
type key[T any] struct {
	name  string
	b     *band[T]
	flows map[string]*flow[T]
	turns turns[*flow[T]]
	n     int
}

// band is one priority's keys.
type band[T any] struct {
	prio  int
	keys  map[string]*key[T]
	turns turns[*key[T]]
	n     int
}

// Queue is one model's admission queue. The zero value is not usable: use
// New.
type Queue[T any] struct {
	bands []*band[T] // by descending priority
	n     int
}

// New returns an empty queue.
func New[T any]() *Queue[T] { return &Queue[T]{} }

// Len is the number of waiting entries.
func (q *Queue[T]) Len() int { return q.n }

// band returns the band of priority p, creating it when create is set.
func (q *Queue[T]) band(p int, create bool) *band[T] {
	i := sort.Search(len(q.bands), func(i int) bool { return q.bands[i].prio <= p })
	if i < len(q.bands) && q.bands[i].prio == p {
		return q.bands[i]
	}
	if !create {
		return nil
	}
	b := &band[T]{prio: p, keys: map[string]*key[T]{}}
	q.bands = slices.Insert(q.bands, i, b)
	return b
}

// Push adds an entry for it holding v and returns it.
func (q *Queue[T]) Push(it Item, v T) *Entry[T] {
	b := q.band(it.Priority, true)
	k := b.keys[it.Key]
	if k == nil {
		k = &key[T]{name: it.Key, b: b, flows: map[string]*flow[T]{}}
		b.keys[it.Key] = k
		b.turns.join(k)
	}
	f := k.flows[it.Flow]
	if f == nil {
		f = &flow[T]{id: it.Flow, k: k}
		k.flows[it.Flow] = f
		k.turns.join(f)
	}
	e := &Entry[T]{Item: it, Value: v, f: f}
	i := sort.Search(len(f.entries), func(i int) bool { return e.before(&f.entries[i].Item) })
	f.entries = slices.Insert(f.entries, i, e)
	k.n++
	b.n++
	q.n++
	return e
}

// turnFlow is the flow whose turn it is in the highest band, or nil.
func (q *Queue[T]) turnFlow() *flow[T] {
	if q.n == 0 {
		return nil
	}
	return q.bands[0].turns.current().turns.current()
}

// Peek returns the entry that leaves next, or nil when the queue is empty.
func (q *Queue[T]) Peek() *Entry[T] {
	if f := q.turnFlow(); f != nil {
		return f.entries[0]
	}
	return nil
}

// Turn returns the first n entries, in leaving order, of the flow whose
// turn it is (the flow of Peek): an owner may serve one of them in its
// place (Served), e.g. one whose prompt a worker with room holds.
func (q *Queue[T]) Turn(n int) []*Entry[T] {
	f := q.turnFlow()
	if f == nil {
		return nil
	}
	return f.entries[:min(n, len(f.entries))]
}

// Served takes e out as the entry that left in its flow's turn: the turn
// passes to the next flow of its key and the next key of its band (when
// e's flow and key had it).
func (q *Queue[T]) Served(e *Entry[T]) {
	f := e.f
	if f == nil {
		return
	}
	k := f.k
	b := k.b
	flowTurn := k.turns.current() == f
	keyTurn := b.turns.current() == k
	q.Remove(e)
	if flowTurn && len(f.entries) > 0 && len(k.turns.order) > 0 {
		k.turns.pass()
	}
	if keyTurn && k.n > 0 && len(b.turns.order) > 0 {
		b.turns.pass()
	}
}

// Remove takes e out of the queue wherever it is, passing no turn; it
// reports whether e was there.
func (q *Queue[T]) Remove(e *Entry[T]) bool {
	f := e.f
	if f == nil {
		return false
	}
	i := sort.Search(len(f.entries), func(i int) bool { return !f.entries[i].before(&e.Item) })
	for ; i < len(f.entries) && f.entries[i] != e; i++ {
	}
	if i == len(f.entries) {
		return false
	}
	f.entries = slices.Delete(f.entries, i, i+1)
	e.f = nil
	k := f.k
	b := k.b
	k.n--
	b.n--
	q.n--
	if len(f.entries) == 0 {
		delete(k.flows, f.id)
		k.turns.leave(f)
	}
	if k.n == 0 {
		delete(b.keys, k.name)
		b.turns.leave(k)
	}
	if b.n == 0 {
		q.bands = slices.DeleteFunc(q.bands, func(x *band[T]) bool { return x == b })
	}
	return true
}

// Ahead estimates how many entries leave before e, were nothing else to
// join: every entry of a higher band, and in e's band those the turns
// serve first. Inside e's key, each other flow sends at most one more
// than e's flow has ahead of e; across keys, each other key at most one
// more than e's key sends before e.
func (q *Queue[T]) Ahead(e *Entry[T]) int {
	f := e.f
	if f == nil {
		return 0
	}
	return q.ahead(f.k.b.prio, f.k, f.id, slices.Index(f.entries, e))
}

// AheadOf estimates, like Ahead, how many entries would leave before an
// entry for it were it pushed now (it joins its flow after the entries
// due no later than it).
func (q *Queue[T]) AheadOf(it Item) int {
	var k *key[T]
	inFlow := 0
	if b := q.band(it.Priority, false); b != nil {
		if k = b.keys[it.Key]; k != nil {
			if f := k.flows[it.Flow]; f != nil {
				inFlow = sort.Search(len(f.entries), func(i int) bool { return it.before(&f.entries[i].Item) })
			}
		}
	}
	return q.ahead(it.Priority, k, it.Flow, inFlow)
}

// ahead counts the entries that leave before one of priority p in flow
// of key k (nil: a key with nothing waiting) with inFlow entries before it
// in its flow.
func (q *Queue[T]) ahead(p int, k *key[T], flow string, inFlow int) int {
	n := 0
	for _, b := range q.bands {
		if b.prio > p {
			n += b.n
			continue
		}
		if b.prio < p {
			break
		}
		inKey := inFlow
		if k != nil {
			for _, g := range k.turns.order {
				if g.id != flow {
					inKey += min(len(g.entries), inFlow+1)
				}
			}
		}
		n += inKey
		for _, o := range b.turns.order {
			if o != k {
				n += min(o.n, inKey+1)
			}
		}
	}
	return n
}

// Victim is the entry an arrival it pushes out of a full queue, or nil
// when the arrival is the one to refuse. The lowest band gives way first:
// an arrival of a higher priority pushes out, of the key with the most
// entries there, the last entry (by due time) of its largest flow; one of
// the same priority does so only when its own key has at least two fewer
// entries there than that key (so the queue sheds the heaviest key's
// latest-due entries, and a key never pushes out its own).
func (q *Queue[T]) Victim(it Item) *Entry[T] {
	if q.n == 0 {
		return nil
	}
	low := q.bands[len(q.bands)-1]
	if it.Priority < low.prio {
		return nil
	}
	var heavy *key[T]
	for _, k := range low.turns.order {
		if heavy == nil || k.n > heavy.n {
			heavy = k
		}
	}
	if it.Priority == low.prio {
		own := 0
		if k := low.keys[it.Key]; k != nil {
			own = k.n
		}
		if own+1 >= heavy.n {
			return nil
		}
	}
	var last *flow[T]
	for _, f := range heavy.turns.order {
		if last == nil || len(f.entries) > len(last.entries) {
			last = f
		}
	}
	return last.entries[len(last.entries)-1]
}

// ShedBelow takes out and returns every entry of a sheddable band
// (priority < 0) below priority p, lowest band first.
func (q *Queue[T]) ShedBelow(p int) []*Entry[T] {
	var out []*Entry[T]
	for len(q.bands) > 0 {
		low := q.bands[len(q.bands)-1]
		if low.prio >= 0 || low.prio >= p {
			break
		}
		for _, k := range slices.Clone(low.turns.order) {
			for _, f := range slices.Clone(k.turns.order) {
				for _, e := range slices.Clone(f.entries) {
					q.Remove(e)
					out = append(out, e)
				}
			}
		}
	}
	return out
}

// Oldest returns the earliest Arrived among the entries.
func (q *Queue[T]) Oldest() (time.Time, bool) {
	var t time.Time
	q.Each(func(e *Entry[T]) {
		if t.IsZero() || e.Arrived.Before(t) {
			t = e.Arrived
		}
	})
	return t, !t.IsZero()
}

// Each calls fn for every entry, band by band from the highest, keys and
// flows in turn order.
func (q *Queue[T]) Each(fn func(e *Entry[T])) {
	for _, b := range q.bands {
		for _, k := range b.turns.order {
			for _, f := range k.turns.order {
				for _, e := range f.entries {
					fn(e)
				}
			}
		}
	}
}

// Count is the entries of one key in one band.
type Count struct {
	Priority int
	Key      string
	N        int
}

// Counts lists the entries per band and key, bands from the highest,
// keys by name.
func (q *Queue[T]) Counts() []Count {
	var out []Count
	for _, b := range q.bands {
		start := len(out)
		for name, k := range b.keys {
			out = append(out, Count{Priority: b.prio, Key: name, N: k.n})
		}
		sort.Slice(out[start:], func(i, j int) bool { return out[start+i].Key < out[start+j].Key })
	}
	return out
}

// Bands lists the priorities that have entries, from the highest.
func (q *Queue[T]) Bands() []int {
	out := make([]int, len(q.bands))
	for i, b := range q.bands {
		out[i] = b.prio
	}
	return out
}

// Highest is the priority of the highest band, and false when the queue
// is empty.
func (q *Queue[T]) Highest() (int, bool) {
	if q.n == 0 {
		return 0, false
	}
	return q.bands[0].prio, true
}
