// Package sticky records which worker holds each piece of engine-side
// state a later request refers to (a stored Responses API response, by
// its id), and which API key it belongs to, for a bounded time and a
// bounded number of entries: the oldest entry goes first when the map is
// full, and an entry past its time is not found.
//
// An entry is kept under the id's digest (Digest), never the id itself,
// with its owner's tag (OwnerTag: a digest of the id and the key's name),
// so what fleet sync tells the other gateway replicas names neither the
// response nor the key: a peer can check a request's key against the tag,
// and learns nothing it could fetch the response with. A lookup with
// another key's name finds nothing, as an unknown id does.
//
// What other replicas report (fleet sync) is kept apart, per replica, so
// it never pushes out what this replica recorded itself, and the peers
// share their bound fairly: when it is full, the replica holding the most
// gives up its oldest entry, so one flooding replica pushes out only its
// own once it holds more than its share. A digest a peer holds is not
// taken over by another peer, and a lookup prefers the replica's own
// record. It is safe for concurrent use.
package sticky

import (
	"crypto/sha256"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Defaults for zero Config fields.
const (
	DefaultTTL        = time.Hour
	DefaultMaxEntries = 100_000
)

// DigestBytes is the length of a Digest and of an OwnerTag.
const DigestBytes = 16

// Digest is the name an entry is kept and shared under: the first
// DigestBytes of the SHA-256 of the id (response ids are random, so the
// digest names the response without letting anyone fetch it).
func Digest(id string) string {
	sum := sha256.Sum256([]byte("tlgate/stored/id\x00" + id))
	return string(sum[:DigestBytes])
}

// OwnerTag is the owner of a response as an entry keeps it: a digest of
// the id and the API key's name. Only who knows both can match it, and the
// tags of two responses of one key are unrelated.
func OwnerTag(id, key string) string {
	sum := sha256.Sum256([]byte("tlgate/stored/owner\x00" + id + "\x00" + key))
	return string(sum[:DigestBytes])
}

// Config bounds a Map.
type Config struct {
	// TTL is how long an entry lives; a peer's entry lives at most as long.
	TTL time.Duration
	// MaxEntries bounds the replica's own entries, and the peers' apart.
	MaxEntries int
}

// Map is response id → worker and owner, bounded by Config.
type Map struct {
	mu   sync.Mutex
	cfg  Config
	own  share
	peer map[string]*share // by replica
	// held is the replica whose share holds each digest of a peer's.
	held map[string]string
	n    int // entries of every peer
	// gone are the digests forgotten (their responses deleted), the most
	// recent MaxEntries: ids are never reused, so no peer stores one again
	// (a peer that forgot another's digest could take it over otherwise).
	gone *simplelru.LRU[string, struct{}]
}

// New returns an empty Map bounded by cfg (zero fields take the defaults).
func New(cfg Config) *Map {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	gone, err := simplelru.NewLRU[string, struct{}](cfg.MaxEntries, nil)
	if err != nil {
		panic(err) // MaxEntries > 0 here
	}
	return &Map{cfg: cfg, own: newShare(cfg.MaxEntries), peer: map[string]*share{}, held: map[string]string{}, gone: gone}
}

// TTL is how long an entry lives.
func (m *Map) TTL() time.Duration { return m.cfg.TTL }

// Put records that worker holds id, owned by the API key named key, as of
// now, for the TTL; a known id moves to now.
func (m *Map) Put(id, worker, key string, now time.Time) {
	if id == "" || worker == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.own.put(Digest(id), OwnerTag(id, key), worker, now.Add(m.cfg.TTL), now)
}

// PutPeer records, in replica's share, that replica saw worker store the
// response of digest, owned by owner (an OwnerTag), for ttl from now (at
// most the TTL). It reports false, and records nothing, for a digest or
// owner that is not DigestBytes long, no worker or replica, a ttl that is
// not positive, or a digest another peer's share holds.
func (m *Map) PutPeer(replica, digest, owner, worker string, ttl time.Duration, now time.Time) bool {
	if replica == "" || len(digest) != DigestBytes || len(owner) != DigestBytes || worker == "" || ttl <= 0 {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if other, ok := m.held[digest]; ok && other != replica && m.peerGet(other, digest, now) != nil {
		return false
	}
	if m.gone.Contains(digest) {
		return false
	}
	s := m.peer[replica]
	if s == nil {
		sh := newShare(m.cfg.MaxEntries) // never reached: the peers' bound is m.n's
		s = &sh
		m.peer[replica] = s
	}
	until := now.Add(min(ttl, m.cfg.TTL))
	if e, ok := s.lru.Get(digest); ok { // Get: the entry becomes the newest
		e.owner, e.worker, e.until = owner, worker, until
		return true
	}
	m.expirePeer(replica, s, now)
	for m.n >= m.cfg.MaxEntries && m.evictFairly(replica) {
	}
	s.lru.Add(digest, &entry{digest: digest, owner: owner, worker: worker, until: until})
	m.peer[replica] = s
	m.held[digest] = replica
	m.n++
	return true
}

// evictFairly removes the oldest entry of the replica holding the most
// (replica, about to add one, counting one more; it goes first on a tie);
// false when no peer holds any.
func (m *Map) evictFairly(replica string) bool {
	most, mostN, mostID := (*share)(nil), 0, ""
	for id, s := range m.peer {
		n := s.Len()
		if id == replica {
			n++
		}
		if s.Len() > 0 && (n > mostN || n == mostN && id == replica) {
			most, mostN, mostID = s, n, id
		}
	}
	if most == nil {
		return false
	}
	m.removePeer(mostID, most, most.oldest())
	return true
}

// peerGet returns replica's entry of digest unless it is past its time at
// now (then it is dropped).
func (m *Map) peerGet(replica, digest string, now time.Time) *entry {
	s := m.peer[replica]
	if s == nil {
		return nil
	}
	return s.get(digest, now, func(e *entry) { m.removedPeer(replica, s, e) })
}

// expirePeer drops the oldest entries of replica's share s while they are
// past their time at now.
func (m *Map) expirePeer(replica string, s *share, now time.Time) {
	s.expire(now, func(e *entry) { m.removedPeer(replica, s, e) })
}

// removePeer removes e from replica's share s, and the share once empty.
func (m *Map) removePeer(replica string, s *share, e *entry) {
	s.remove(e, func(e *entry) { m.removedPeer(replica, s, e) })
}

// removedPeer accounts for e, removed from replica's share s: the share
// goes once empty.
func (m *Map) removedPeer(replica string, s *share, e *entry) {
	m.n--
	delete(m.held, e.digest)
	if s.Len() == 0 {
		delete(m.peer, replica)
	}
}

// Worker returns the worker that holds id, as of now, when the API key
// named key owns it: the replica's own record, else a peer's. Another
// key's response is not found, as an unknown id is not.
func (m *Map) Worker(id, key string, now time.Time) (string, bool) {
	d, owner := Digest(id), OwnerTag(id, key)
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.own.get(d, now, nil)
	if e == nil {
		if replica, ok := m.held[d]; ok {
			e = m.peerGet(replica, d, now)
		}
	}
	if e == nil || e.owner != owner {
		return "", false
	}
	return e.worker, true
}

// Forget drops id from every share (this replica deleted it).
func (m *Map) Forget(id string) {
	d := Digest(id)
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.own.lru.Peek(d); ok {
		m.own.remove(e, nil)
	}
	m.forgetPeer(d)
}

// ForgetPeer drops the peers' entry of digest (a peer deleted the
// response): a record of the replica's own stays, and its worker answers
// for the id.
func (m *Map) ForgetPeer(digest string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgetPeer(digest)
}

func (m *Map) forgetPeer(digest string) {
	m.gone.Add(digest, struct{}{})
	if replica, ok := m.held[digest]; ok {
		if s := m.peer[replica]; s != nil {
			if e, ok := s.lru.Peek(digest); ok {
				m.removePeer(replica, s, e)
			}
		}
	}
}

// ExportOwn calls fn for at most limit of the replica's own live entries
// as of now, the most recently recorded first, with the time each has
// left: what the replica tells its peers. The peers' entries are never
// exported: each replica vouches only for what it relayed. The entries
// are copied under the mutex and fn is called after it is released, so
// lookups (request actors waiting to route a follow-up) never wait on fn.
func (m *Map) ExportOwn(limit int, now time.Time, fn func(digest, owner, worker string, ttl time.Duration)) {
	for _, e := range m.exportedOwn(limit, now) {
		fn(e.digest, e.owner, e.worker, e.until.Sub(now))
	}
}

// exportedOwn is what ExportOwn hands to its fn, copied under the mutex.
func (m *Map) exportedOwn(limit int, now time.Time) []entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]entry, 0, min(max(limit, 0), m.own.Len()))
	m.own.newest(func(e *entry) bool {
		if len(out) >= limit {
			return false
		}
		if e.until.After(now) {
			out = append(out, *e)
		}
		return true
	})
	return out
}

// Len returns the number of the replica's own entries and of the peers',
// expired ones included until the next call that expires them.
func (m *Map) Len() (own, peer int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.own.Len(), m.n
}

// PeerLen returns the number of replica's entries.
func (m *Map) PeerLen(replica string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.peer[replica]; s != nil {
		return s.Len()
	}
	return 0
}

// share is one set of entries, in the order they were recorded (a lookup
// does not reorder them): an LRU of golang-lru's simplelru keyed by
// digest, whose bound, when it has one, drops the oldest. The time an
// entry lives is its own (until, against the caller's now), not the LRU's.
type share struct {
	lru *simplelru.LRU[string, *entry]
}

type entry struct {
	digest, owner, worker string
	until                 time.Time
}

// newShare returns an empty share that keeps at most limit entries.
func newShare(limit int) share {
	lru, err := simplelru.NewLRU[string, *entry](limit, nil)
	if err != nil {
		panic(err) // limit > 0 always: New and PutPeer pass MaxEntries
	}
	return share{lru: lru}
}

// Len is the number of entries, expired ones included.
func (s *share) Len() int { return s.lru.Len() }

// put records digest on worker for owner until until, at now, keeping at
// most the share's limit (the oldest go).
func (s *share) put(digest, owner, worker string, until, now time.Time) {
	s.expire(now, nil)
	s.lru.Remove(digest) // a known digest is recorded anew, as the newest
	s.lru.Add(digest, &entry{digest: digest, owner: owner, worker: worker, until: until})
}

// get returns digest's entry unless it is past its time at now (then it is
// dropped, and removed is called with it when not nil).
func (s *share) get(digest string, now time.Time, removed func(*entry)) *entry {
	e, ok := s.lru.Peek(digest)
	if !ok {
		return nil
	}
	if !e.until.After(now) {
		s.remove(e, removed)
		return nil
	}
	return e
}

// expire drops the oldest entries while they are past their time at now
// (one that is not stops it: a later one past its time is dropped when
// looked up, or by the bound), calling removed with each when not nil.
func (s *share) expire(now time.Time, removed func(*entry)) {
	for {
		_, e, ok := s.lru.GetOldest()
		if !ok || e.until.After(now) {
			return
		}
		s.remove(e, removed)
	}
}

// oldest returns the oldest entry, or nil.
func (s *share) oldest() *entry {
	_, e, _ := s.lru.GetOldest()
	return e
}

// remove drops e, calling removed with it when not nil.
func (s *share) remove(e *entry, removed func(*entry)) {
	if s.lru.Remove(e.digest) && removed != nil {
		removed(e)
	}
}

// newest calls fn for the entries from the newest to the oldest, until fn
// returns false.
func (s *share) newest(fn func(*entry) bool) {
	keys := s.lru.Keys() // oldest first
	for i := len(keys) - 1; i >= 0; i-- {
		if e, ok := s.lru.Peek(keys[i]); ok && !fn(e) {
			return
		}
	}
}
