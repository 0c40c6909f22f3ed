// Package sticky records which worker holds each piece of engine-side
// state a later request refers to (a stored Responses API response, by
// its id), for a bounded time and a bounded number of entries: the oldest
// entry goes first when the map is full, and an entry older than its TTL
// is not found. It is safe for concurrent use.
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

// Config bounds a Map.
type Config struct {
	TTL        time.Duration
	MaxEntries int
}

// Map is id → worker id, bounded by Config.
type Map struct {
	mu    sync.Mutex
	cfg   Config
	byID  map[string]*list.Element
	order *list.List // of *entry, oldest first
}

type entry struct {
	id, worker string
	at         time.Time
}

// New returns an empty Map bounded by cfg (zero fields take the defaults).
func New(cfg Config) *Map {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	return &Map{cfg: cfg, byID: map[string]*list.Element{}, order: list.New()}
}

// Put records that worker holds id, as of now; a known id moves to now.
func (m *Map) Put(id, worker string, now time.Time) {
	if id == "" || worker == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire(now)
	if el, ok := m.byID[id]; ok {
		m.order.Remove(el)
	}
	m.byID[id] = m.order.PushBack(&entry{id: id, worker: worker, at: now})
	for m.order.Len() > m.cfg.MaxEntries {
		m.remove(m.order.Front())
	}
}

// Worker returns the worker that holds id, as of now.
func (m *Map) Worker(id string, now time.Time) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire(now)
	el, ok := m.byID[id]
	if !ok {
		return "", false
	}
	return el.Value.(*entry).worker, true
}

// Forget drops id (the engine deleted it).
func (m *Map) Forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.byID[id]; ok {
		m.remove(el)
	}
}

// Len returns the number of entries, expired ones included until the next
// call that expires them.
func (m *Map) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.order.Len()
}

// expire drops the entries older than the TTL at now. Entries are in the
// order of their time, so it stops at the first young one.
func (m *Map) expire(now time.Time) {
	for el := m.order.Front(); el != nil; el = m.order.Front() {
		if now.Sub(el.Value.(*entry).at) < m.cfg.TTL {
			return
		}
		m.remove(el)
	}
}

func (m *Map) remove(el *list.Element) {
	delete(m.byID, el.Value.(*entry).id)
	m.order.Remove(el)
}
