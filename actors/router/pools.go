package router

import (
	"slices"
	"sort"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/ring"
)

type poolKey struct {
	model string
	role  fleet.Role
}

type pool struct {
	ids  []string        // members, sorted
	ws   []*fleet.Worker // parallel to ids
	ns   []*workerLoad   // parallel to ids: their in-flight counts
	ring *ring.Ring
	swrr policy.SWRR
}

// SetWorker records a worker's new snapshot. It is a member of one pool
// for every model id it serves: its base model and each adapter.
func (s *State) SetWorker(w fleet.Worker) {
	s.observeWorker(w)
	if old, ok := s.workers[w.ID]; ok && (old.Role != w.Role || !slices.Equal(old.Models(), w.Models())) {
		s.leavePool(old)
	}
	cp := w
	s.workers[w.ID] = &cp
	s.observe(&cp) // admission.go, ejection.go
	for _, m := range cp.Models() {
		p := s.pool(poolKey{m, w.Role})
		i := sort.SearchStrings(p.ids, w.ID)
		if i == len(p.ids) || p.ids[i] != w.ID {
			p.ids = slices.Insert(p.ids, i, w.ID)
			p.ws = slices.Insert(p.ws, i, &cp)
			p.ns = slices.Insert(p.ns, i, s.load(w.ID))
			p.ring.Add(w.ID)
		} else {
			p.ws[i] = &cp
		}
	}
	if len(s.pendingIndex) > 0 {
		s.applyPending(&cp)
	}
	if len(s.pendingStored) > 0 {
		s.applyPendingStored(&cp)
	}
}

// RemoveWorker forgets a worker (evicted, or no longer in the probe
// list), its passive-health record with it: a worker that comes back under
// the same id is a new process as far as the gateway knows, and starts
// with a clean record. Its in-flight count is kept until its requests
// release it, so it is not credited with releases of requests it never
// had.
func (s *State) RemoveWorker(id string) {
	if w, ok := s.workers[id]; ok {
		s.served(w)
		s.leavePool(w)
		delete(s.workers, id)
		delete(s.learned, id)
	}
	s.forgetWorker(id)
	delete(s.workerTTFT, id)
	delete(s.health, id)
	delete(s.votes, id)
	delete(s.belied, id)
	if c := s.inflight[id]; c != nil {
		c.until, c.suspect, c.trials = time.Time{}, false, 0
		s.dropIdle(id, c)
	}
}

// ResetWorkers replaces the whole view (after a (re)start); a worker the
// router knew as another incarnation has its exact view cleared.
func (s *State) ResetWorkers(ws []fleet.Worker) {
	old := s.workers
	s.workers = map[string]*fleet.Worker{}
	s.pools = map[poolKey]*pool{}
	for _, w := range ws {
		if o, ok := old[w.ID]; ok {
			s.followIncarnation(o, w)
		}
		s.SetWorker(w)
	}
	s.retainWorkers()
}

// leavePool takes w out of the pools of every model id it serves.
func (s *State) leavePool(w *fleet.Worker) {
	for _, m := range w.Models() {
		k := poolKey{m, w.Role}
		p, ok := s.pools[k]
		if !ok {
			continue
		}
		i := sort.SearchStrings(p.ids, w.ID)
		if i < len(p.ids) && p.ids[i] == w.ID {
			p.ids = slices.Delete(p.ids, i, i+1)
			p.ws = slices.Delete(p.ws, i, i+1)
			p.ns = slices.Delete(p.ns, i, i+1)
			p.ring.Remove(w.ID)
		}
		if len(p.ids) == 0 {
			delete(s.pools, k)
		}
	}
}

func (s *State) pool(k poolKey) *pool {
	p, ok := s.pools[k]
	if !ok {
		p = &pool{ring: ring.New()}
		s.pools[k] = p
	}
	return p
}
