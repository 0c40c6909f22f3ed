package router

import (
	"fmt"
	"sort"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Pick routes req at now and counts the pick (and its prefill worker) as in
// flight. It is a pure function of the state, the request and the clock,
// apart from advancing the weighted policy's counters.
func (s *State) Pick(req *Request, now time.Time) (Target, error) {
	s.needTok = nil
	if req.Pin != "" {
		return s.pickPinned(req, now)
	}
	r, ok := s.table.Lookup(req.Model)
	if !ok {
		if !s.Known(req.Model, now) {
			return Target{}, fmt.Errorf("router: %q: %w", req.Model, ErrModelNotFound)
		}
		r = routes.Route{Model: req.Model}
	}
	t := Target{Route: r.Model, CascadeSteps: 1, Epoch: s.epoch}
	if !r.IsCascade() {
		return s.pickRoute(t, r, req, req.Model, now)
	}
	return s.pickCascade(t, r, req, now)
}

// pickRoute picks workers for route r (not a cascade) into t; asked names
// the model the client asked for, for errors.
func (s *State) pickRoute(t Target, r routes.Route, req *Request, asked string, now time.Time) (Target, error) {
	first := routes.PickBackend(r, req.RequestID)
	if s.pickServed(&t, r, first, req, now) {
		return t, nil
	}
	if nt := s.needTok; nt != nil {
		return Target{}, nt
	}
	// The drawn backend's workers all at their limit: the request waits
	// for them (admission.go) rather than spill onto another backend, so
	// a canary keeps its share under load.
	if len(r.Backends) > 1 && !(s.full && s.cfg.Admission.Enabled) {
		for _, served := range fallbacks(r, first) {
			if s.pickServed(&t, r, served, req, now) {
				return t, nil
			}
			if nt := s.needTok; nt != nil {
				return Target{}, nt
			}
		}
	}
	nc := &NoCapacityError{Model: asked}
	// A request that finds every worker at its limit waits in the queue
	// when admission control is on; the reason is only worked out for an
	// answer.
	if !s.full || !s.cfg.Admission.Enabled {
		nc.Why = s.whyNoCapacity(r, req, now)
	}
	return Target{}, nc
}

// pickServed picks workers serving served for route r and counts them in
// flight; it reports whether it found any.
func (s *State) pickServed(t *Target, r routes.Route, served string, req *Request, now time.Time) bool {
	t.Indexing = Indexing{}
	var err error
	switch {
	case req.AnyRole:
		err = s.pickAnyRole(t, served, req, now)
	case r.IsDisaggregated() && !req.LeastLoaded:
		err = s.pickPair(t, served, req, now)
	default:
		err = s.pickOne(t, served, fleet.RoleUnified, req, now)
	}
	if err != nil {
		return false
	}
	t.ServedModel = served
	s.sent(t.Worker.ID)
	if t.Prefill != nil {
		s.sent(t.Prefill.ID)
	}
	if s.syncing() {
		s.syncPicked(served, t.Worker.ID)
		if t.Prefill != nil {
			s.syncPicked(served, t.Prefill.ID)
		}
		s.syncIndexing(t.Indexing, now)
	}
	return true
}

// fallbacks are a canary route's backends other than the drawn one, by
// descending weight: when the drawn backend has no routable worker left
// (not when its workers are full) the request is served by another
// rather than refused.
func fallbacks(r routes.Route, first string) []string {
	rest := make([]routes.Backend, 0, len(r.Backends))
	for _, b := range r.Backends {
		if b.Model != first {
			rest = append(rest, b)
		}
	}
	sort.SliceStable(rest, func(i, j int) bool { return rest[i].Weight > rest[j].Weight })
	out := make([]string, len(rest))
	for i, b := range rest {
		out[i] = b.Model
	}
	return out
}

// candidates fills the scratch slices with the routable, non-excluded
// members of a pool, for a pick by policy pol ("" for one by load alone).
func (s *State) candidates(pol policy.Name, model string, role fleet.Role, req *Request, now time.Time, keep func(*fleet.Worker) bool) (*pool, bool) {
	s.cands, s.members, s.loads = s.cands[:0], s.members[:0], s.loads[:0]
	p, ok := s.pools[poolKey{model, role}]
	if !ok {
		return nil, false
	}
	// A suspect worker with a trial in flight is passed over, unless no
	// other worker is left (suspicion never refuses a request).
	if passed := s.collect(p, req, now, keep, false); len(s.cands) == 0 && passed > 0 {
		s.collect(p, req, now, keep, true)
	}
	// With admission control on, a pool that is full as a whole takes no
	// request: it waits in its model's queue (admission.go).
	if s.cfg.Admission.Enabled && s.poolFull(now) {
		s.full = true
		if pol == policy.NameCacheAware {
			s.tokenizeBeforeWait(model, req, now)
		}
		s.cands, s.members, s.loads = s.cands[:0], s.members[:0], s.loads[:0]
	}
	return p, len(s.cands) > 0
}

// collect appends to the scratch slices the members of p that a pick may
// go to; busy suspects (suspectBusy) only withSuspects. It returns how many
// busy suspects it passed over.
func (s *State) collect(p *pool, req *Request, now time.Time, keep func(*fleet.Worker) bool, withSuspects bool) (passed int) {
	for i, w := range p.ws {
		c := p.ns[i]
		if !w.Routable(now) || len(req.Exclude) > 0 && req.Exclude[w.ID] || keep != nil && !keep(w) || s.held(c, now) {
			continue
		}
		if !withSuspects && suspectBusy(c) {
			passed++
			continue
		}
		s.cands = append(s.cands, policy.Candidate{ID: w.ID, Load: c.n + c.peerLoad() + w.QueueDepth, Weight: w.KVTotalBlocks, Tie: c.tie})
		s.members = append(s.members, w)
		s.loads = append(s.loads, c)
	}
	return passed
}

func (s *State) pickOne(t *Target, model string, role fleet.Role, req *Request, now time.Time) error {
	pol := s.cfg.Policy
	if req.LeastLoaded {
		pol = policy.NameLeastOutstanding
	}
	return s.pickOneBy(pol, t, model, role, req, now, nil)
}

// pickAnyRole picks the least loaded worker serving model, whatever its
// role (ties to the unified, then the prefill worker).
func (s *State) pickAnyRole(t *Target, model string, req *Request, now time.Time) error {
	found, best := false, Target{}
	bestLoad := 0
	for _, role := range []fleet.Role{fleet.RoleUnified, fleet.RolePrefill, fleet.RoleDecode} {
		c := *t
		if err := s.pickOneBy(policy.NameLeastOutstanding, &c, model, role, req, now, nil); err != nil {
			continue
		}
		if load := s.Load(&c.Worker); !found || load < bestLoad {
			found, best, bestLoad = true, c, load
		}
	}
	if !found {
		return ErrNoCapacity
	}
	*t = best
	return nil
}

// pickOneBy picks a worker of the pool (model, role) by policy pol,
// among those keep accepts (nil: all).
func (s *State) pickOneBy(pol policy.Name, t *Target, model string, role fleet.Role, req *Request, now time.Time, keep func(*fleet.Worker) bool) error {
	p, ok := s.candidates(pol, model, role, req, now, keep)
	if !ok {
		return ErrNoCapacity
	}
	var i int
	switch pol {
	case policy.NameWeighted:
		i, t.Reason = p.swrr.Pick(s.cands), policy.ReasonWeighted
	case policy.NameAffinity:
		i, t.Reason = policy.Affinity(p.ring, req.PrefixKey, s.cands, s.cfg.LoadFactor)
	case policy.NameCacheAware:
		i, t.Reason = s.pickCacheAware(t, model, req, now)
	default:
		i, t.Reason = policy.LeastOutstanding(s.cands), policy.ReasonLeastOutstanding
	}
	if i < 0 {
		return ErrNoCapacity
	}
	t.Worker = *s.members[i]
	t.Policy, t.Candidates = string(pol), len(s.cands)
	return nil
}
