package router

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/prefixindex"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Fleet sync: the router tells a Syncer what it decided (picks, releases,
// ejections, and on SyncTick its own in-flight counts), and applies what
// other replicas report (SyncBatch) as if it had decided it, within
// bounds. A peer's requests count as peer in-flight load on their workers
// (workerLoad.peer), capped per replica and worker and forgotten when the
// peer falls silent for PeerTimeout; its prompts go to the prefix index's
// peer share, which never evicts what the router recorded itself; its
// ejections eject here too, within the pool's cap and for at most the
// local ejection's maximum.

// Defaults of SyncConfig.
const (
	DefaultSyncMaxPeers        = 32
	DefaultSyncMaxPeerInFlight = 256
	DefaultSyncPeerTimeout     = 5 * time.Second
	DefaultSyncClaimMargin     = 8
	DefaultSyncEjectionQuorum  = 2
	// KnownPeerWindow is how long a replica heard from is remembered as
	// known: back within it, it displaces a replica that was new when it
	// was admitted (see SyncConfig.MaxPeers).
	KnownPeerWindow = 10 * time.Minute
)

// SyncConfig bounds what other replicas' reports may do here. Zero fields
// take the defaults.
type SyncConfig struct {
	// Syncer receives this replica's decisions; nil turns sync off (the
	// router then neither tells nor applies anything).
	Syncer Syncer
	// MaxPeers is how many other replicas are tracked at once. When that
	// many are, a replica not tracked takes the place of one of lower
	// standing, or its reports are dropped (PeerApplied.Refused) until one
	// falls silent: a replica Listed stands above one that is not, and a
	// known one (heard from within KnownPeerWindow) above one that was new
	// when it was admitted; among several of lower standing the one
	// admitted last goes.
	MaxPeers int
	// Listed are the replica ids expected in the fleet ([gateway.sync]
	// peers): always given a place.
	Listed []string
	// MaxPeerInFlight caps the in-flight requests one replica may claim on
	// one worker.
	MaxPeerInFlight int
	// EjectionQuorum is how many peers' ejections of a worker, in force,
	// eject it here without evidence of this replica's own (zero: 2); with
	// Listed, only listed replicas count. One peer's word alone does not:
	// it makes the worker suspect (one request at a time), and the first
	// failure of this replica's own there ejects it at once, the first
	// answer drops the peers' word (and ignores theirs about the worker
	// until the end they claimed).
	EjectionQuorum int
	// ClaimMargin is how many of the peers' picks told since a worker's
	// last report count beyond what the report bears out: the peers'
	// claims on a worker count in routing up to the engine's running +
	// queued at its last heartbeat less the gateway's own requests then,
	// plus at most ClaimMargin picks since, and in admission control up to
	// the report alone (uncorroborated claims never fill a slot); both at
	// most the worker's limit. Negative: none count.
	ClaimMargin int
	// PeerTimeout forgets a replica's in-flight requests when nothing was
	// heard from it for that long (its load reports come every second or so).
	PeerTimeout time.Duration
	// Stored is the peers' share of the record of stored responses
	// (stored.go); nil: peers' stored responses are dropped.
	Stored StoredShare
	// TieSalt, when not 0, breaks ties between workers a policy finds
	// equal by a hash of the salt and the worker id before the id. Each
	// replica draws its own: replicas that share one view of the loads
	// would otherwise all send their next requests to the same worker
	// (the smallest id) until the others' picks reach them.
	TieSalt uint64
}

func (c SyncConfig) maxPeers() int {
	if c.MaxPeers > 0 {
		return c.MaxPeers
	}
	return DefaultSyncMaxPeers
}

func (c SyncConfig) maxInFlight() int {
	if c.MaxPeerInFlight > 0 {
		return c.MaxPeerInFlight
	}
	return DefaultSyncMaxPeerInFlight
}

func (c SyncConfig) ejectionQuorum() int {
	if c.EjectionQuorum > 0 {
		return c.EjectionQuorum
	}
	return DefaultSyncEjectionQuorum
}

func (c SyncConfig) claimMargin() int {
	switch {
	case c.ClaimMargin > 0:
		return c.ClaimMargin
	case c.ClaimMargin < 0:
		return 0
	}
	return DefaultSyncClaimMargin
}

func (c SyncConfig) peerTimeout() time.Duration {
	if c.PeerTimeout > 0 {
		return c.PeerTimeout
	}
	return DefaultSyncPeerTimeout
}

// Syncer is told what this replica decides. Its methods run inside the
// router actor: they must not block (queue, or drop) and must copy what
// they keep (hashes is the router's scratch).
type Syncer interface {
	// Picked: a request was sent to worker of model (the served id).
	Picked(model, worker string)
	// Indexed: a request with a prompt of these prefix-index chunk hashes
	// (cache_aware) was sent to worker, of base model model. Peers are told
	// at the pick, not when the answer begins as the router's own index
	// is: the prefill hides the sync lag, so a peer's next request with
	// the same prefix finds it; and peers keep it in their peer share,
	// which never evicts what they learnt themselves, so a prompt the
	// engines refuse can push out only other peers' reports, at most a
	// request's share of them.
	Indexed(model, worker string, hashes []uint64)
	// Released: one of this replica's requests on worker ended.
	Released(worker string)
	// Ejected: worker of model was ejected until until after reason.
	Ejected(worker, model, reason string, until time.Time)
	// Lifted: an operator lifted worker's ejection through this replica
	// (LiftEjection): the peers lift it too.
	Lifted(worker string)
	// Tick: this replica's in-flight requests per worker and what it
	// tracks of its peers, answering SyncTick.
	Tick(r TickReport)
	// Applied: what a peer's batch (SyncInbox) or ApplySnapshot did.
	Applied(r PeerApplied)
}

// TickReport is what the router tells the Syncer on SyncTick.
type TickReport struct {
	// Own is this replica's in-flight count per worker (all of them: a
	// worker not listed has none).
	Own []WorkerLoad
	// Peers is how many other replicas are tracked.
	Peers int
	// Uncorroborated is the peers' claims in flight that routing does not
	// count, summed over the workers: beyond what the engines' reports
	// bear out (workerLoad.peerLoad).
	Uncorroborated int
}

// WorkerLoad is one worker's in-flight count.
type WorkerLoad struct {
	Worker string
	N      int
}

// PeerEventKind says what a peer event reports.
type PeerEventKind uint8

// Kinds of peer event.
const (
	PeerPick    PeerEventKind = iota + 1 // a request sent: +1 in flight (Hashes, if any, indexed)
	PeerRelease                          // a request ended: -1 in flight
	PeerLoad                             // the replica's whole in-flight count (Loads)
	PeerEject                            // Worker ejected for For, after Reason
)

// PeerIndex is a prompt sent to Worker: its Hashes are indexed there, in
// the peer share (the request's in-flight count comes with its PeerPick).
// PeerLift is an operator's lifting of Worker's ejection.
const (
	PeerIndex PeerEventKind = 7
	PeerLift  PeerEventKind = 8
)

// String is the kind's name in metrics.
func (k PeerEventKind) String() string {
	switch k {
	case PeerPick:
		return "pick"
	case PeerRelease:
		return "release"
	case PeerLoad:
		return "load"
	case PeerEject:
		return "eject"
	case PeerStored:
		return "stored"
	case PeerForget:
		return "forget"
	case PeerIndex:
		return "index"
	case PeerLift:
		return "lift"
	case PeerSpeculate:
		return "speculate"
	}
	return "unknown"
}

// PeerEvent is one thing another replica reports.
type PeerEvent struct {
	Kind   PeerEventKind
	Model  string // PeerPick, PeerEject: the served model; PeerIndex: the base model
	Worker string
	Hashes []uint64     // PeerIndex (and PeerPick)
	Loads  []WorkerLoad // PeerLoad
	Reason string       // PeerEject
	For    time.Duration
	ID     string // PeerStored, PeerForget: the stored response's id's digest (sticky.Digest)
	Owner  string // PeerStored: its owner's tag (sticky.OwnerTag)
}

// PeerBatch is a decoded batch of another replica's events.
type PeerBatch struct {
	Replica string
	// Sent is when the sender sent it, by its clock (for the sync lag).
	Sent time.Time
	// ChunkBytes is the sender's prefix-index chunk size: its hashes are
	// used only when it matches ours.
	ChunkBytes int
	Events     []PeerEvent
}

// SyncInbox tells the router that peers' batches wait: Take returns them
// (coalesced per peer, in the order they came) and empties the inbox. The
// router applies each and reports what it did to the Syncer's Applied.
type SyncInbox struct{ Take func() []PeerBatch }

// SyncTick forgets silent peers and has the router tell the Syncer its own
// in-flight counts (Syncer.Tick).
type SyncTick struct{}

// SyncSnapshot asks for the router's view for a peer's warm start; the
// router responds with *Snapshot. MaxChunks bounds each worker's hashes,
// MaxBytes the encoded snapshot (the index is sized to fit before any hash
// is copied). The router builds it a share at a time between its other
// messages.
type SyncSnapshot struct{ MaxChunks, MaxBytes int }

// Snapshot is the view a starting replica warms up with: the prefix index,
// the answering replica's in-flight counts and the ejections in force
// (its stored responses come apart: ApplyStored).
type Snapshot struct {
	ChunkBytes int
	Index      []SnapshotEntry
	InFlight   []WorkerLoad
	Ejections  []SnapshotEjection
}

// SnapshotEntry is one worker's indexed chunk hashes, most recent first.
type SnapshotEntry struct {
	Model, Worker string
	Hashes        []uint64
}

// SnapshotEjection is an ejection in force, with the time it has left.
type SnapshotEjection struct {
	Worker, Model, Reason string
	For                   time.Duration
}

// ApplySnapshot applies the snapshot of replica Replica.
type ApplySnapshot struct {
	Replica  string
	Snapshot *Snapshot
}

// Reasons a peer event is dropped (PeerApplied.Dropped).
const (
	DropUnknownWorker = "unknown_worker"
	DropOtherModel    = "other_model"
	DropTooManyPeers  = "too_many_peers"
	DropCapped        = "capped"
	DropChunkBytes    = "chunk_bytes"
	DropUnknownKind   = "unknown_kind"
	DropEjectionOff   = "ejection_refused"
	// DropNoEvidence: a peer's ejection of a worker this replica has seen
	// no failure of, fewer than EjectionQuorum peers reporting it: the
	// worker is suspect here, not ejected.
	DropNoEvidence = "no_evidence"
	// DropUnlisted: a lift of an ejection from a replica the listed fleet
	// ([gateway.sync] peers) does not name.
	DropUnlisted = "unlisted"
)

// PeerDrop counts one dropped peer event.
type PeerDrop struct {
	Kind   PeerEventKind
	Reason string
}

// PeerApplied is what applying a peer's batch did.
type PeerApplied struct {
	Replica string
	Sent    time.Time // the batch's
	Applied map[PeerEventKind]int
	Dropped map[PeerDrop]int
	// Ejected lists the ejections applied, for their end timers.
	Ejected []time.Time
	// Released: some peer load went down, so waiters may be served.
	Released bool
	// Joined: the replica was not tracked before this batch. Refused: it
	// was not, and MaxPeers others of no lower standing are (its events
	// are dropped, DropTooManyPeers).
	Joined, Refused bool
}

func (r *PeerApplied) applied(k PeerEventKind) {
	if r.Applied == nil {
		r.Applied = map[PeerEventKind]int{}
	}
	r.Applied[k]++
}

func (r *PeerApplied) drop(k PeerEventKind, reason string) {
	if r.Dropped == nil {
		r.Dropped = map[PeerDrop]int{}
	}
	r.Dropped[PeerDrop{k, reason}]++
}

// peerState is one other replica's claims: its in-flight count per worker,
// when it was last heard from and its standing (peerRank) when admitted.
type peerState struct {
	seen, admitted time.Time
	rank           int
	n              map[string]int
}

// Standings of a replica at max_peers (SyncConfig.MaxPeers).
const (
	rankNew = iota
	rankKnown
	rankListed
)

// syncing reports whether fleet sync is on.
func (s *State) syncing() bool { return s.cfg.Sync.Syncer != nil }

// syncPicked tells the Syncer of a request sent to worker of model.
func (s *State) syncPicked(model, worker string) {
	if s.syncing() {
		s.cfg.Sync.Syncer.Picked(model, worker)
	}
}

// ApplyPeer applies a peer's batch at now.
func (s *State) ApplyPeer(b *PeerBatch, now time.Time) PeerApplied {
	r := PeerApplied{Replica: b.Replica, Sent: b.Sent}
	p, joined := s.peer(b.Replica, now)
	if p == nil {
		r.Refused = true
		for _, ev := range b.Events {
			r.drop(ev.Kind, DropTooManyPeers)
		}
		return r
	}
	r.Joined = joined
	hashesOK := s.prefix != nil && b.ChunkBytes == s.prefix.index.Config().ChunkBytes
	limit := s.cfg.Sync.maxInFlight()
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case PeerPick:
			w, ok := s.workers[ev.Worker]
			switch {
			case !ok:
				r.drop(ev.Kind, DropUnknownWorker)
				continue
			case !w.Serves(ev.Model):
				r.drop(ev.Kind, DropOtherModel)
				continue
			}
			if p.n[ev.Worker] >= limit {
				r.drop(ev.Kind, DropCapped)
			} else {
				s.setPeer(p, ev.Worker, p.n[ev.Worker]+1)
				s.load(ev.Worker).peerPicks++
			}
			if len(ev.Hashes) > 0 && !s.applyPeerHashes(ev, hashesOK, &r) {
				continue
			}
			r.applied(ev.Kind)
		case PeerIndex:
			if s.applyPeerHashes(ev, hashesOK, &r) {
				r.applied(ev.Kind)
			}
		case PeerRelease:
			if n := p.n[ev.Worker]; n > 0 {
				s.setPeer(p, ev.Worker, n-1)
				r.Released = true
			}
			r.applied(ev.Kind)
		case PeerLoad:
			if s.applyLoad(p, ev.Loads, limit) {
				r.Released = true
			}
			r.applied(ev.Kind)
		case PeerEject:
			until, reason := s.applyPeerEjection(b.Replica, ev.Worker, ev.Model, ev.Reason, ev.For, now)
			if reason != "" {
				r.drop(ev.Kind, reason)
				continue
			}
			r.Ejected = append(r.Ejected, until)
			r.applied(ev.Kind)
		case PeerLift:
			if _, ok := s.workers[ev.Worker]; !ok {
				r.drop(ev.Kind, DropUnknownWorker)
				continue
			}
			if !s.inFleet(b.Replica) {
				// With the fleet listed, an ejection takes a quorum of
				// listed replicas; undoing this replica's own evidence
				// takes one of them at least.
				r.drop(ev.Kind, DropUnlisted)
				continue
			}
			if s.LiftEjection(ev.Worker, now) {
				r.Released = true
			}
			r.applied(ev.Kind)
		case PeerStored, PeerForget:
			s.applyPeerStored(b.Replica, ev, now, &r)
		case PeerSpeculate:
			s.applyPeerSpeculate(ev, now, &r)
		default:
			r.drop(ev.Kind, DropUnknownKind)
		}
	}
	return r
}

// applyPeerHashes records a peer's prompt (ev.Hashes on ev.Worker of base
// model ev.Model) in the prefix index's peer share; hashesOK: its chunking
// is the router's. It reports whether it did, counting the drop if not.
func (s *State) applyPeerHashes(ev *PeerEvent, hashesOK bool, r *PeerApplied) bool {
	switch {
	case s.prefix == nil:
		return true // nothing is indexed here: nothing to refuse
	case !hashesOK:
		r.drop(ev.Kind, DropChunkBytes)
		return false
	}
	if err := s.prefix.index.RecordPeer(ev.Model, ev.Worker, ev.Hashes); err != nil {
		r.drop(ev.Kind, dropReason(err))
		return false
	}
	return true
}

func dropReason(err error) string {
	if errors.Is(err, prefixindex.ErrOtherModel) {
		return DropOtherModel
	}
	return DropUnknownWorker
}

// peer returns the state of replica id, heard from at now, and whether it
// was admitted now; nil when it is new and MaxPeers others of no lower
// standing are tracked (see SyncConfig.MaxPeers).
func (s *State) peer(id string, now time.Time) (p *peerState, joined bool) {
	if p = s.peers[id]; p != nil {
		p.seen = now
		s.remember(id, now)
		return p, false
	}
	rank := s.peerRank(id, now)
	if len(s.peers) >= s.cfg.Sync.maxPeers() {
		victim := s.displaced(rank)
		if victim == "" {
			return nil, false
		}
		s.dropPeer(victim)
	}
	if s.peers == nil {
		s.peers = map[string]*peerState{}
	}
	p = &peerState{seen: now, admitted: now, rank: rank, n: map[string]int{}}
	s.peers[id] = p
	s.remember(id, now)
	return p, true
}

// peerRank is the standing of replica id, not tracked, at now.
func (s *State) peerRank(id string, now time.Time) int {
	switch seen, ok := s.known[id]; {
	case slices.Contains(s.cfg.Sync.Listed, id):
		return rankListed
	case ok && now.Sub(seen) < KnownPeerWindow:
		return rankKnown
	}
	return rankNew
}

// displaced is the tracked replica a replica of standing rank takes the
// place of: the one admitted last among those of the lowest standing
// below rank; "" when none stands below it.
func (s *State) displaced(rank int) string {
	victim := ""
	for id, p := range s.peers {
		if p.rank >= rank {
			continue
		}
		if v := s.peers[victim]; victim == "" || p.rank < v.rank || p.rank == v.rank && (p.admitted.After(v.admitted) || p.admitted.Equal(v.admitted) && id > victim) {
			victim = id
		}
	}
	return victim
}

// dropPeer forgets tracked replica id and its in-flight counts; it
// reports whether any count went.
func (s *State) dropPeer(id string) (released bool) {
	p := s.peers[id]
	if p == nil {
		return false
	}
	for w := range p.n {
		s.setPeer(p, w, 0)
		released = true
	}
	delete(s.peers, id)
	for _, v := range s.votes {
		delete(v, id)
	}
	for _, b := range s.belied {
		delete(b, id)
	}
	return released
}

// maxKnown bounds the replicas remembered as known, in multiples of
// MaxPeers.
const maxKnown = 4

// remember notes that replica id was heard from at now, within the bound
// of remembered replicas (the least recently heard from goes first).
func (s *State) remember(id string, now time.Time) {
	if s.known == nil {
		s.known = map[string]time.Time{}
	}
	if _, ok := s.known[id]; !ok && len(s.known) >= maxKnown*s.cfg.Sync.maxPeers() {
		oldest := ""
		for k, t := range s.known {
			if oldest == "" || t.Before(s.known[oldest]) {
				oldest = k
			}
		}
		delete(s.known, oldest)
	}
	s.known[id] = now
}

// applyLoad sets a peer's in-flight counts to its report: the listed
// workers the router knows (capped), every other one to 0. It reports
// whether any count went down.
func (s *State) applyLoad(p *peerState, loads []WorkerLoad, limit int) (down bool) {
	want := make(map[string]int, len(loads))
	for _, l := range loads {
		if _, ok := s.workers[l.Worker]; ok && l.N > 0 {
			want[l.Worker] = min(l.N, limit)
		}
	}
	for id, n := range p.n {
		if want[id] < n {
			down = true
		}
		if _, ok := want[id]; !ok {
			s.setPeer(p, id, 0)
		}
	}
	for id, n := range want {
		s.setPeer(p, id, n)
	}
	return down
}

// setPeer sets peer p's count on worker id to n, keeping the worker's
// load's sum.
func (s *State) setPeer(p *peerState, id string, n int) {
	c := s.load(id)
	c.peer += n - p.n[id]
	if n > 0 {
		p.n[id] = n
	} else {
		delete(p.n, id)
	}
	s.dropIdle(id, c)
}

// dropIdle deletes the load of a worker that is gone and has nothing in
// flight, the gateway's or its peers'.
func (s *State) dropIdle(id string, c *workerLoad) {
	if _, live := s.workers[id]; c.n <= 0 && c.peer <= 0 && !live {
		delete(s.inflight, id)
	}
}

// ExpirePeers forgets the replicas not heard from for PeerTimeout at now,
// with their in-flight counts (and the replicas remembered as known past
// KnownPeerWindow); it reports whether it forgot any load.
func (s *State) ExpirePeers(now time.Time) (released bool) {
	to := s.cfg.Sync.peerTimeout()
	for id, p := range s.peers {
		if now.Sub(p.seen) < to {
			continue
		}
		if s.dropPeer(id) {
			released = true
		}
	}
	for id, seen := range s.known {
		if now.Sub(seen) >= KnownPeerWindow {
			delete(s.known, id)
		}
	}
	return released
}

// Uncorroborated is the peers' claims in flight that routing does not
// count, summed over the workers (TickReport.Uncorroborated).
func (s *State) Uncorroborated() int {
	n := 0
	for _, c := range s.inflight {
		n += c.peer - c.peerLoad()
	}
	return n
}

// PeerInFlight is the other replicas' in-flight count on worker id: what
// they claim, of which routing counts what the engine bears out.
func (s *State) PeerInFlight(id string) int {
	if c := s.inflight[id]; c != nil {
		return c.peer
	}
	return 0
}

// Peers lists the replicas heard from, sorted.
func (s *State) Peers() []string {
	out := make([]string, 0, len(s.peers))
	for id := range s.peers {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// OwnLoad lists the gateway's own in-flight count per worker (those with
// any), sorted by worker.
func (s *State) OwnLoad() []WorkerLoad {
	var out []WorkerLoad
	for id, c := range s.inflight {
		if c.n > 0 {
			out = append(out, WorkerLoad{Worker: id, N: c.n})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Worker < out[j].Worker })
	return out
}

// applyPeerEjection takes replica's word that worker id (of model) is to
// be ejected for d at now. Only a known worker of that model, when
// ejection is on here and it is not ejected already, and only with
// evidence: a failure of this replica's own on it since its last answer,
// or EjectionQuorum peers' ejections of it in force (this one's
// included); then within its pool's cap and for at most the local
// ejection's maximum. Without evidence the word is kept (until its end)
// and the worker made suspect: the next request there is a trial, whose
// failure ejects it at once (AttemptFailed) and whose success drops the
// word (AttemptSucceeded). It returns the ejection's end, or the reason
// it was not applied.
func (s *State) applyPeerEjection(replica, id, model, reason string, d time.Duration, now time.Time) (time.Time, string) {
	ec := s.cfg.Ejection
	w, ok := s.workers[id]
	switch {
	case !ok:
		return time.Time{}, DropUnknownWorker
	case w.Model != model:
		return time.Time{}, DropOtherModel
	case ec.MaxPercent <= 0 || d <= 0 || s.ejected(id, now):
		return time.Time{}, DropEjectionOff
	}
	if ec.Max > 0 {
		d = min(d, ec.Max)
	} else {
		d = min(d, max(ec.Base, time.Second))
	}
	if until, ok := s.belied[id][replica]; ok && now.Before(until) {
		return time.Time{}, DropNoEvidence // an answer belied its word already
	}
	s.vote(id, replica, now.Add(d))
	if h := s.health[id]; (h == nil || h.fails == 0) && s.liveVotes(id, now, true) < s.cfg.Sync.ejectionQuorum() {
		s.load(id).suspect = true
		return time.Time{}, DropNoEvidence
	}
	if !s.ejectionRoom(w, now) {
		return time.Time{}, DropEjectionOff
	}
	if s.health == nil {
		s.health = map[string]*health{}
	}
	h := s.health[id]
	if h == nil {
		h = &health{addr: w.HTTPAddress, started: w.StartedAt}
		s.health[id] = h
	}
	h.fails, h.reason, h.until = 0, reason, now.Add(d)
	c := s.load(id)
	c.until, c.suspect = h.until, false
	delete(s.votes, id)
	return h.until, ""
}

// vote keeps replica's word that worker id is to be ejected until until.
func (s *State) vote(id, replica string, until time.Time) {
	if s.votes == nil {
		s.votes = map[string]map[string]time.Time{}
	}
	v := s.votes[id]
	if v == nil {
		v = map[string]time.Time{}
		s.votes[id] = v
	}
	v[replica] = until
}

// inFleet reports whether replica's word counts where a listed fleet's
// does (quorums, lifts): every replica's when SyncConfig.Listed is empty,
// else a listed one's.
func (s *State) inFleet(replica string) bool {
	return len(s.cfg.Sync.Listed) == 0 || slices.Contains(s.cfg.Sync.Listed, replica)
}

// liveVotes counts the tracked peers whose word that worker id is to be
// ejected is in force at now (dropping the others); for a quorum, when
// SyncConfig.Listed names the fleet, only listed replicas count.
func (s *State) liveVotes(id string, now time.Time, quorum bool) int {
	v := s.votes[id]
	n := 0
	for replica, until := range v {
		if _, tracked := s.peers[replica]; !tracked || !now.Before(until) {
			delete(v, replica)
			continue
		}
		if !quorum || s.inFleet(replica) {
			n++
		}
	}
	if len(v) == 0 {
		delete(s.votes, id)
	}
	return n
}

// belie drops the peers' word that worker id is to be ejected: an attempt
// on it answered. Each of those peers' words about it is ignored until the
// end it claimed, so a peer that keeps saying so costs one trial per
// ejection it claims, not one per message.
func (s *State) belie(id string) {
	v := s.votes[id]
	if len(v) == 0 {
		return
	}
	if s.belied == nil {
		s.belied = map[string]map[string]time.Time{}
	}
	b := s.belied[id]
	if b == nil {
		b = map[string]time.Time{}
		s.belied[id] = b
	}
	for replica, until := range v {
		b[replica] = until
	}
	delete(s.votes, id)
}

// LiftEjection ends worker id's ejection at now (an operator's word,
// through this replica or a peer): its passive-health record starts
// afresh, and the peers' word waiting for evidence is dropped. It reports
// whether the worker was ejected.
func (s *State) LiftEjection(id string, now time.Time) (was bool) {
	was = s.ejected(id, now)
	delete(s.health, id)
	if c := s.inflight[id]; c != nil {
		c.until, c.suspect, c.trials = time.Time{}, false, 0
	}
	delete(s.votes, id)
	return was
}

// MakeSnapshot is the router's view at now for a peer's warm start, whole
// (PlanSnapshot, then FillSnapshot until done).
func (s *State) MakeSnapshot(maxChunks, maxBytes int, now time.Time) *Snapshot {
	job := s.PlanSnapshot(maxChunks, maxBytes, now)
	for !s.FillSnapshot(job, math.MaxInt) {
	}
	return job.Snapshot
}

// SnapshotJob is a snapshot being built: its in-flight counts and
// ejections taken, its index planned (how many hashes of which worker),
// FillSnapshot copying the hashes a share at a time.
type SnapshotJob struct {
	Snapshot *Snapshot
	plan     []planned
	next     int
}

type planned struct {
	worker string
	n      int
}

// snapshotOverhead is what a snapshot's header and each list entry take
// in the wire format at most, besides their strings and hashes.
const (
	snapshotHeaderBytes = 2 + 2*binary.MaxVarintLen64 + 4*binary.MaxVarintLen32 + routes.MaxIDLen // magic, version, chunk bytes, counts, replica id
	snapshotEntryBytes  = 4 * binary.MaxVarintLen32                                               // string lengths, counts, a value
)

// PlanSnapshot starts the router's view at now for a peer's warm start:
// its own in-flight counts and the ejections in force, taken now, and a
// plan of the index hashes to copy: the bytes maxBytes leaves after the
// rest, shared evenly among the workers holding chunks (one holding fewer
// leaves its share to the others), at most maxChunks per worker. Nothing
// of the index is copied yet.
func (s *State) PlanSnapshot(maxChunks, maxBytes int, now time.Time) *SnapshotJob {
	snap := &Snapshot{InFlight: s.OwnLoad()}
	for _, e := range s.EjectedAt(now) {
		snap.Ejections = append(snap.Ejections, SnapshotEjection{Worker: e.ID, Model: e.Model, Reason: e.Reason, For: e.Until.Sub(now)})
	}
	job := &SnapshotJob{Snapshot: snap}
	if s.prefix == nil || maxChunks <= 0 {
		return job
	}
	snap.ChunkBytes = s.prefix.index.Config().ChunkBytes
	budget := maxBytes - snapshotHeaderBytes
	for _, l := range snap.InFlight {
		budget -= len(l.Worker) + snapshotEntryBytes
	}
	for _, e := range snap.Ejections {
		budget -= len(e.Worker) + len(e.Model) + len(e.Reason) + snapshotEntryBytes
	}
	var sizes []planned
	s.prefix.index.Sizes(func(model, id string, chunks int) {
		budget -= len(model) + len(id) + snapshotEntryBytes
		sizes = append(sizes, planned{id, min(chunks, maxChunks)})
	})
	sort.Slice(sizes, func(i, j int) bool {
		return sizes[i].n < sizes[j].n || sizes[i].n == sizes[j].n && sizes[i].worker < sizes[j].worker
	})
	hashes := max(0, budget/8)
	for i, p := range sizes {
		p.n = min(p.n, hashes/(len(sizes)-i))
		hashes -= p.n
		if p.n > 0 {
			job.plan = append(job.plan, p)
		}
	}
	sort.Slice(job.plan, func(i, j int) bool { return job.plan[i].worker < job.plan[j].worker })
	return job
}

// FillSnapshot copies the planned hashes of the next workers of job, at
// least one worker's and no more than maxHashes unless one worker has
// more; it reports whether the job is done. A worker forgotten since the
// plan is left out.
func (s *State) FillSnapshot(job *SnapshotJob, maxHashes int) (done bool) {
	copied := 0
	for job.next < len(job.plan) && (copied == 0 || copied+job.plan[job.next].n <= maxHashes) {
		p := job.plan[job.next]
		job.next++
		model, hs := s.prefix.index.AppendWorker(nil, p.worker, p.n)
		if len(hs) > 0 {
			job.Snapshot.Index = append(job.Snapshot.Index, SnapshotEntry{Model: model, Worker: p.worker, Hashes: hs})
			copied += len(hs)
		}
	}
	return job.next >= len(job.plan)
}

// ApplySnapshot applies replica's snapshot at now: its index as its
// peers' share of each worker (every chunk, up to the worker's capacity,
// whatever the index holds already: prefixindex.ImportPeer), its in-flight
// counts as its load report, its ejections as its ejections. The index entries of workers not known
// yet (a starting replica hears the engines' first heartbeats within an
// interval) wait for them, for PeerTimeout at most (ExpirePending drops
// them after).
func (s *State) ApplySnapshot(replica string, snap *Snapshot, now time.Time) PeerApplied {
	b := PeerBatch{Replica: replica, ChunkBytes: snap.ChunkBytes}
	b.Events = append(b.Events, PeerEvent{Kind: PeerLoad, Loads: snap.InFlight})
	for _, e := range snap.Ejections {
		b.Events = append(b.Events, PeerEvent{Kind: PeerEject, Worker: e.Worker, Model: e.Model, Reason: e.Reason, For: e.For})
	}
	r := s.ApplyPeer(&b, now)
	if r.Refused {
		return r
	}
	if s.prefix == nil || len(snap.Index) == 0 {
		return r
	}
	if snap.ChunkBytes != s.prefix.index.Config().ChunkBytes {
		r.drop(PeerPick, DropChunkBytes)
		return r
	}
	until := now.Add(s.cfg.Sync.peerTimeout())
	for _, e := range snap.Index {
		if _, ok := s.workers[e.Worker]; !ok {
			if s.pendingIndex == nil {
				s.pendingIndex = map[string]pendingEntry{}
			}
			if len(s.pendingIndex) < maxPending {
				s.pendingIndex[e.Worker] = pendingEntry{model: e.Model, hashes: e.Hashes, until: until}
			}
			continue
		}
		if err := s.prefix.index.ImportPeer(e.Model, e.Worker, e.Hashes); err != nil {
			r.drop(PeerPick, dropReason(err))
			continue
		}
		r.applied(PeerPick)
	}
	return r
}

// maxPending bounds the snapshot entries waiting for their workers.
const maxPending = 4096

// pendingEntry is a snapshot's index entry waiting for its worker's first
// heartbeat.
type pendingEntry struct {
	model  string
	hashes []uint64
	until  time.Time
}

// applyPending records the snapshot entry that waited for worker w, if
// one did and its wait is not over by w's heartbeat.
func (s *State) applyPending(w *fleet.Worker) {
	e, ok := s.pendingIndex[w.ID]
	if !ok {
		return
	}
	delete(s.pendingIndex, w.ID)
	if s.prefix != nil && (w.LastHeartbeat.IsZero() || w.LastHeartbeat.Before(e.until)) {
		_ = s.prefix.index.ImportPeer(e.model, w.ID, e.hashes)
	}
}

// ExpirePending drops the snapshot's index entries and stored responses
// still waiting for their workers whose wait is over at now.
func (s *State) ExpirePending(now time.Time) {
	for id, e := range s.pendingIndex {
		if now.After(e.until) {
			delete(s.pendingIndex, id)
		}
	}
	s.expirePendingStored(now)
}
