package router

import (
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// Fleet sync of the Responses API's stored responses: which worker holds
// each stored response, and which API key owns it. The replica that
// relays a response records it (the request actor, in
// internal/routing/sticky) and tells its peers, under the id's digest and
// the owner's tag, never the id or the key; a peer's report goes to that
// peer's share of the record (StoredShare), only for a worker this router
// knows, and a peer's deletion drops only the peers' entry. A replica
// tells a peer it has just heard from its own records (ApplyStored), and
// never a peer's.

// Kinds of peer event about stored responses.
const (
	PeerStored PeerEventKind = iota + 5 // ID (a digest) stored on Worker for Owner, for For
	PeerForget                          // ID (a digest) deleted
)

// MaxSnapshotStored bounds the stored responses one replica tells a peer
// at once.
const MaxSnapshotStored = 1 << 16

// StoredShare is the peers' share of the record of stored responses
// (*sticky.Map). Its methods are called inside the router actor: they
// must not block.
type StoredShare interface {
	// PutPeer records that replica saw worker store the response of
	// digest, owned by owner (a tag), for ttl from now; false: refused (a
	// malformed digest or tag, no time left, a digest another peer holds).
	PutPeer(replica, digest, owner, worker string, ttl time.Duration, now time.Time) bool
	// ForgetPeer drops the peers' entry of digest.
	ForgetPeer(digest string)
}

// StoredRecord is one stored response as a replica tells it: its id's
// digest, its owner's tag, its worker and the time its entry has left.
type StoredRecord struct {
	ID, Owner, Worker string
	For               time.Duration
}

// ApplyStored applies the stored responses replica Replica relayed itself
// (its answer to this replica's asking, when it first heard from it).
type ApplyStored struct {
	Replica string
	Stored  []StoredRecord
}

// DropInvalid: a stored-response event the record refused (a malformed
// digest or tag, no time left, a digest another peer holds).
const DropInvalid = "invalid"

// applyPeerStored applies replica's PeerStored or PeerForget event at now.
func (s *State) applyPeerStored(replica string, ev *PeerEvent, now time.Time, r *PeerApplied) {
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
	case !st.PutPeer(replica, ev.ID, ev.Owner, ev.Worker, ev.For, now):
		r.drop(ev.Kind, DropInvalid)
		return
	}
	r.applied(ev.Kind)
}

// ApplyStored applies at now the stored responses replica relayed itself,
// as its reports of them; those of workers not known yet wait for them
// (replacing what waited of replica's before), for PeerTimeout at most.
func (s *State) ApplyStored(replica string, stored []StoredRecord, now time.Time) PeerApplied {
	r := s.ApplyPeer(&PeerBatch{Replica: replica}, now)
	if r.Refused {
		for range stored {
			r.drop(PeerStored, DropTooManyPeers)
		}
		return r
	}
	s.dropPendingStored(replica)
	wait := now.Add(s.cfg.Sync.peerTimeout())
	for _, e := range stored[:min(len(stored), MaxSnapshotStored)] {
		ev := PeerEvent{Kind: PeerStored, ID: e.ID, Owner: e.Owner, Worker: e.Worker, For: e.For}
		if _, known := s.workers[e.Worker]; known || s.cfg.Sync.Stored == nil || s.pendingStoredN >= MaxSnapshotStored {
			s.applyPeerStored(replica, &ev, now, &r)
			continue
		}
		if s.pendingStored == nil {
			s.pendingStored = map[string][]pendingStored{}
		}
		s.pendingStored[e.Worker] = append(s.pendingStored[e.Worker], pendingStored{replica: replica, rec: e, from: now, until: now.Add(e.For), wait: wait})
		s.pendingStoredN++
	}
	return r
}

// pendingStored is a stored response waiting for its worker's first
// heartbeat: the replica that told it, the record, when it was applied,
// the end of its time and the end of the wait.
type pendingStored struct {
	replica           string
	rec               StoredRecord
	from, until, wait time.Time
}

// dropPendingStored drops what waits of replica's.
func (s *State) dropPendingStored(replica string) {
	s.keepPendingStored(func(e *pendingStored) bool { return e.replica != replica })
}

// keepPendingStored keeps the waiting stored responses keep is true of.
func (s *State) keepPendingStored(keep func(*pendingStored) bool) {
	for id, es := range s.pendingStored {
		kept := es[:0]
		for i := range es {
			if keep(&es[i]) {
				kept = append(kept, es[i])
			}
		}
		s.pendingStoredN -= len(es) - len(kept)
		if len(kept) == 0 {
			delete(s.pendingStored, id)
		} else {
			s.pendingStored[id] = kept
		}
	}
}

// applyPendingStored records the stored responses that waited for worker
// w, as of its heartbeat (of their arrival, for a worker with none),
// unless their wait is over by then.
func (s *State) applyPendingStored(w *fleet.Worker) {
	es, ok := s.pendingStored[w.ID]
	if !ok {
		return
	}
	delete(s.pendingStored, w.ID)
	s.pendingStoredN -= len(es)
	for _, e := range es {
		at := w.LastHeartbeat
		if at.IsZero() {
			at = e.from
		}
		if !at.After(e.wait) {
			s.cfg.Sync.Stored.PutPeer(e.replica, e.rec.ID, e.rec.Owner, w.ID, e.until.Sub(at), at)
		}
	}
}

// expirePendingStored drops the waiting stored responses whose wait is
// over at now.
func (s *State) expirePendingStored(now time.Time) {
	s.keepPendingStored(func(e *pendingStored) bool { return !now.After(e.wait) })
}
