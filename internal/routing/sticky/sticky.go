// Package sticky records which worker holds each piece of engine-side
// state a later request refers to (a stored Responses API response, by
// its id), for a bounded time and a bounded number of entries: the oldest
// entry goes first when the map is full, and an entry past its time is
// not found. What other gateway replicas report (fleet sync) is kept in a
// share of its own under the same bounds, so it never pushes out what
// this replica recorded itself, and a lookup prefers the replica's own
// record. It is safe for concurrent use.
package sticky

import (
	"container/list"
	"sync"
	"time"
)

// Defaults for zero Config fields.
const (
	DefaultTTL        = time.Hour
	DefaultMaxEntries = 100_000
)

// MaxIDBytes bounds the id of a peer's entry; a longer one is refused.
const MaxIDBytes = 256

// Config bounds a Map.
type Config struct {
	// TTL is how long an entry lives; a peer's entry lives at most as long.
	TTL time.Duration
	// MaxEntries bounds the replica's own entries, and the peers' apart.
	MaxEntries int
}

// Map is id → worker id, bounded by Config.
type Map struct {
	mu        sync.Mutex
	cfg       Config
	own, peer share
}

// New returns an empty Map bounded by cfg (zero fields take the defaults).
func New(cfg Config) *Map {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	return &Map{cfg: cfg, own: newShare(), peer: newShare()}
}

// TTL is how long an entry lives.
func (m *Map) TTL() time.Duration { return m.cfg.TTL }

// Put records that worker holds id, as of now, for the TTL; a known id
// moves to now.
func (m *Map) Put(id, worker string, now time.Time) {
	if id == "" || worker == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.own.put(id, worker, now.Add(m.cfg.TTL), now, m.cfg.MaxEntries)
}

// PutPeer records, in the peers' share, that another replica saw worker
// store id, for ttl from now (at most the TTL). It reports false, and
// records nothing, for an empty id or worker, an id over MaxIDBytes or a
// ttl that is not positive.
func (m *Map) PutPeer(id, worker string, ttl time.Duration, now time.Time) bool {
	if id == "" || worker == "" || len(id) > MaxIDBytes || ttl <= 0 {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.peer.put(id, worker, now.Add(min(ttl, m.cfg.TTL)), now, m.cfg.MaxEntries)
	return true
}

// Worker returns the worker that holds id, as of now: the replica's own
// record, else a peer's.
func (m *Map) Worker(id string, now time.Time) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.own.get(id, now); e != nil {
		return e.worker, true
	}
	if e := m.peer.get(id, now); e != nil {
		return e.worker, true
	}
	return "", false
}

// Forget drops id from both shares (this replica deleted it).
func (m *Map) Forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.own.forget(id)
	m.peer.forget(id)
}

// ForgetPeer drops id from the peers' share only (a peer deleted it): a
// record of the replica's own stays, and its worker answers for the id.
func (m *Map) ForgetPeer(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.peer.forget(id)
}

// Export calls fn for at most limit live entries as of now, with the time
// each has left: the most recently recorded first, the replica's own
// before the peers' (an id in both once, as its own), leaving out ids over
// MaxIDBytes, which a peer would refuse.
func (m *Map) Export(limit int, now time.Time, fn func(id, worker string, ttl time.Duration)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, s := range []*share{&m.own, &m.peer} {
		for el := s.order.Back(); el != nil && n < limit; el = el.Prev() {
			e := el.Value.(*entry)
			if !e.until.After(now) || len(e.id) > MaxIDBytes || (s == &m.peer && m.own.get(e.id, now) != nil) {
				continue
			}
			fn(e.id, e.worker, e.until.Sub(now))
			n++
		}
	}
}

// Len returns the number of the replica's own entries and of the peers',
// expired ones included until the next call that expires them.
func (m *Map) Len() (own, peer int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.own.order.Len(), m.peer.order.Len()
}

// share is one bounded set of entries, in the order they were recorded.
type share struct {
	byID  map[string]*list.Element
	order *list.List // of *entry, oldest first
}

type entry struct {
	id, worker string
	until      time.Time
}

func newShare() share { return share{byID: map[string]*list.Element{}, order: list.New()} }

// put records id on worker until until, at now, keeping at most limit
// entries (the oldest go).
func (s *share) put(id, worker string, until, now time.Time, limit int) {
	s.expire(now)
	s.forget(id)
	s.byID[id] = s.order.PushBack(&entry{id: id, worker: worker, until: until})
	for s.order.Len() > limit {
		s.remove(s.order.Front())
	}
}

// get returns id's entry unless it is past its time at now.
func (s *share) get(id string, now time.Time) *entry {
	el, ok := s.byID[id]
	if !ok {
		return nil
	}
	e := el.Value.(*entry)
	if !e.until.After(now) {
		s.remove(el)
		return nil
	}
	return e
}

func (s *share) forget(id string) {
	if el, ok := s.byID[id]; ok {
		s.remove(el)
	}
}

// expire drops the oldest entries while they are past their time at now
// (one that is not stops it: a later one past its time is dropped when
// looked up, or by the bound).
func (s *share) expire(now time.Time) {
	for el := s.order.Front(); el != nil && !el.Value.(*entry).until.After(now); el = s.order.Front() {
		s.remove(el)
	}
}

func (s *share) remove(el *list.Element) {
	delete(s.byID, el.Value.(*entry).id)
	s.order.Remove(el)
}
