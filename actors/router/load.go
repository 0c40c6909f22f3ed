package router

import (
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// workerLoad is one worker's load as the router counts it: the gateway's
// requests in flight on it (n), the other replicas' (peer) and what the
// engine's reports show beyond both (foreign), with what a pick reads of
// the worker beside them; shared by the pools that list the worker so a
// pick reads it without a map lookup.
type workerLoad struct {
	n int
	// foreign is the load the worker carries beyond the gateway's own
	// requests (another replica's, say), in engine slots: the smaller of
	// the last two heartbeats' reported running + queued less n when each
	// arrived, so a report that crossed a request's end in flight does not
	// count a slot for a whole heartbeat interval. lastSample and sampled
	// keep the last heartbeat's.
	foreign, lastSample int
	sampled             bool
	// peer is the other replicas' in-flight requests on the worker, as
	// fleet sync reports them (sync.go); foreign is then what the
	// heartbeats show beyond both. The claims count only as far as the
	// engine's reports bear them out (peerLoad, peerAdmitted): reported is
	// its running + queued at its last heartbeat, ownAtReport the
	// gateway's in flight then, peerPicks the peers' picks told since, and
	// margin the most of those that count (SyncConfig.ClaimMargin).
	peer                             int
	reported, ownAtReport, peerPicks int
	margin                           int

	slot int // the worker's prefix index slot (cache_aware)
	// tie is the worker's policy.Candidate.Tie (tieRank).
	tie uint64
	// limit and until are the worker's admission limit (0: none) and the
	// end of its ejection, copied here so a pick reads no map (admission.go).
	limit int
	until time.Time
	// suspect: the worker's last attempts failed and it is not ejected;
	// trials counts the requests sent to it since, with no attempt outcome
	// on it yet (ejection.go, suspectBusy).
	suspect bool
	trials  int
}

// ejectedAt reports whether the worker is ejected at now; atLimit whether
// it is at its admission limit.
func (c *workerLoad) ejectedAt(now time.Time) bool { return now.Before(c.until) }

func (c *workerLoad) atLimit() bool { return c.limit > 0 && c.used() >= c.limit }

// used is what counts against the worker's admission limit: the gateway's
// requests on it and the peers' as admission counts them (peerAdmitted).
func (c *workerLoad) used() int { return c.n + c.peerAdmitted() }

// corroborated is the in-flight load the engine's last report shows
// beyond the gateway's own requests: the most of the peers' claims it
// bears out.
func (c *workerLoad) corroborated() int { return max(0, c.reported-c.ownAtReport) }

// peerLoad is the peers' claims as routing counts them: at most what the
// engine's last report corroborates, plus the peers' picks since that
// report (at most margin of them: the engine could not show those yet),
// and at most the worker's limit.
func (c *workerLoad) peerLoad() int {
	n := min(c.peer, c.corroborated()+min(c.peerPicks, c.margin))
	if c.limit > 0 {
		n = min(n, c.limit)
	}
	return n
}

// peerAdmitted is the peers' claims as admission control counts them:
// only what the engine's last report corroborates, so claims the engine
// does not bear out never fill the worker's slots.
func (c *workerLoad) peerAdmitted() int {
	n := min(c.peer, c.corroborated())
	if c.limit > 0 {
		n = min(n, c.limit)
	}
	return n
}

func (s *State) load(id string) *workerLoad {
	c := s.inflight[id]
	if c == nil {
		c = &workerLoad{tie: tieRank(s.cfg.Sync.TieSalt, id), margin: s.cfg.Sync.claimMargin()}
		s.inflight[id] = c
	}
	return c
}

// tieRank is the rank of worker id among equals under salt: 0 for salt 0
// (ties then go to the smallest id), else the id's hash seeded by salt.
func tieRank(salt uint64, id string) uint64 {
	if salt == 0 {
		return 0
	}
	d := xxhash.NewWithSeed(salt)
	_, _ = d.WriteString(id)
	return d.Sum64()
}

// sent counts a request routed to worker id: in flight, and a trial when
// the worker is suspect (ejection.go).
func (s *State) sent(id string) {
	c := s.load(id)
	c.n++
	if c.suspect {
		c.trials++
	}
}

// Release ends one in-flight request on worker id. A release for a worker
// that is gone, or one more than was acquired, is harmless.
func (s *State) Release(id string) {
	c := s.inflight[id]
	if c == nil {
		return
	}
	if c.n > 0 {
		c.n--
		if s.syncing() {
			s.cfg.Sync.Syncer.Released(id)
		}
	}
	if c.n == 0 {
		c.trials = 0 // nothing of the gateway's is left in flight there
	}
	s.dropIdle(id, c)
}

// InFlight returns the gateway's in-flight count on worker id.
func (s *State) InFlight(id string) int {
	if c := s.inflight[id]; c != nil {
		return c.n
	}
	return 0
}

// Load is the policies' load: in flight plus the engine's queue depth.
func (s *State) Load(w *fleet.Worker) int { return s.InFlight(w.ID) + w.QueueDepth }
