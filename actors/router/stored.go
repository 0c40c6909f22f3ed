package router

import (
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// Fleet sync of the Responses API's stored responses: which worker holds
// each stored response id. The replica that relays a response records it
// (the request actor, in internal/routing/sticky) and tells its peers; a
// peer's report goes to the record's peers' share (StoredShare), only for
// a worker this router knows, and a peer's deletion drops only that
// share's entry. A warm-start snapshot carries the live entries.

// Kinds of peer event about stored responses.
const (
	PeerStored PeerEventKind = iota + 5 // ID stored on Worker, for For
	PeerForget                          // ID deleted
)

// MaxSnapshotStored bounds the stored responses in a snapshot.
const MaxSnapshotStored = 1 << 16

// StoredShare is the peers' share of the record of stored responses
// (*sticky.Map). Its methods are called inside the router actor: they
// must not block.
type StoredShare interface {
	// PutPeer records that a peer saw worker store id, for ttl from now;
	// false: refused (an empty or over-long id, no time left).
	PutPeer(id, worker string, ttl time.Duration, now time.Time) bool
	// ForgetPeer drops a peer's entry for id.
	ForgetPeer(id string)
	// Export calls fn for at most limit live entries, newest first.
	Export(limit int, now time.Time, fn func(id, worker string, ttl time.Duration))
}

// SnapshotStored is a live stored response: its id, its worker and the
// time its entry has left.
type SnapshotStored struct {
	ID, Worker string
	For        time.Duration
}

// DropInvalid: a stored-response event the record refused (an empty or
// over-long id, no time left).
const DropInvalid = "invalid"

// applyPeerStored applies a peer's PeerStored or PeerForget event at now.
func (s *State) applyPeerStored(ev *PeerEvent, now time.Time, r *PeerApplied) {
	st := s.cfg.Sync.Stored
	switch {
	case st == nil:
		r.drop(ev.Kind, DropUnknownKind)
		return
	case ev.Kind == PeerForget:
		st.ForgetPeer(ev.ID)
	case s.workers[ev.Worker] == nil:
		r.drop(ev.Kind, DropUnknownWorker)
		return
	case !st.PutPeer(ev.ID, ev.Worker, ev.For, now):
		r.drop(ev.Kind, DropInvalid)
		return
	}
	r.applied(ev.Kind)
}

// pendingStored is a snapshot's stored response waiting for its worker's
// first heartbeat: its id, when the snapshot was applied, the end of its
// time and the end of the wait.
type pendingStored struct {
	id                string
	from, until, wait time.Time
}

// applySnapshotStored applies a snapshot's stored responses at now, as
// peer events; those of workers not known yet wait for them (the previous
// snapshot's waiting ones are dropped), for PeerTimeout at most.
func (s *State) applySnapshotStored(stored []SnapshotStored, now time.Time, r *PeerApplied) {
	clear(s.pendingStored)
	wait := now.Add(s.cfg.Sync.peerTimeout())
	for _, e := range stored[:min(len(stored), MaxSnapshotStored)] {
		if _, known := s.workers[e.Worker]; known || s.cfg.Sync.Stored == nil {
			s.applyPeerStored(&PeerEvent{Kind: PeerStored, ID: e.ID, Worker: e.Worker, For: e.For}, now, r)
			continue
		}
		if s.pendingStored == nil {
			s.pendingStored = map[string][]pendingStored{}
		}
		s.pendingStored[e.Worker] = append(s.pendingStored[e.Worker], pendingStored{id: e.ID, from: now, until: now.Add(e.For), wait: wait})
	}
}

// applyPendingStored records the snapshot's stored responses that waited
// for worker w, as of its heartbeat (of the snapshot, for a worker with
// none), unless their wait is over by then.
func (s *State) applyPendingStored(w *fleet.Worker) {
	es, ok := s.pendingStored[w.ID]
	if !ok {
		return
	}
	delete(s.pendingStored, w.ID)
	for _, e := range es {
		at := w.LastHeartbeat
		if at.IsZero() {
			at = e.from
		}
		if !at.After(e.wait) {
			s.cfg.Sync.Stored.PutPeer(e.id, w.ID, e.until.Sub(at), at)
		}
	}
}

// expirePendingStored drops the waiting stored responses whose wait is
// over at now.
func (s *State) expirePendingStored(now time.Time) {
	for id, es := range s.pendingStored {
		if len(es) > 0 && now.After(es[0].wait) {
			delete(s.pendingStored, id)
		}
	}
}
