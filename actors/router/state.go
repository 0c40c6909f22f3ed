package router

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tlgate/tlgate/internal/routing/cascade"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/kvindex"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/prefixindex"
	"github.com/tlgate/tlgate/internal/routing/ring"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Errors a Route answer can carry.
var (
	// ErrModelNotFound: no route and no worker knows the model.
	ErrModelNotFound = errors.New("model not found")
	// ErrNoCapacity: the model is known but no routable worker is left.
	ErrNoCapacity = errors.New("no routable worker")
)

// Config holds the routing settings.
type Config struct {
	Policy     policy.Name
	LoadFactor float64 // affinity_load_factor c
	// CacheAware weighs the cache_aware policy (zero: the defaults) and
	// PrefixIndex sets its index's chunking.
	CacheAware  policy.CacheAwareConfig
	PrefixIndex prefixindex.Config
	// KVIndex bounds the exact view of the workers that publish KV cache
	// events (exact.go), and Tokenizers maps a base model to the base URL
	// of a tokenizer of it ("": ask one of its workers).
	KVIndex    kvindex.Config
	Tokenizers map[string]string
	// Ejection and Admission are passive health and admission control
	// (ejection.go, admission.go); Observe receives their events.
	Ejection  EjectionConfig
	Admission AdmissionConfig
	Observe   Observer
	// Sync is fleet sync with the other replicas (sync.go).
	Sync SyncConfig
	// NoCapacityRetryAfter is the Retry-After of a no_capacity answer
	// (zero: 1 s): about when a worker that registers or comes back would
	// be routable.
	NoCapacityRetryAfter time.Duration
	// RecentModels is how long a model stays known after its last worker
	// left (zero: DefaultRecentModels; negative: not at all), so that its
	// clients get no_capacity through an outage rather than
	// model_not_found.
	RecentModels time.Duration
}

// Request is what routing needs to know of a client request.
type Request struct {
	Model     string
	RequestID string
	PrefixKey []byte
	Stream    bool
	// Step is the cascade step to route (0 for the first or a non-cascade
	// route). A streamed request on a cascade route always goes to the last
	// step, whatever Step says.
	Step int
	// Exclude lists worker ids that already failed this request.
	Exclude map[string]bool
	// Prompt is the whole rendered prompt (openai.Request.Prompt), which
	// the cache_aware policy looks up in its prefix index.
	Prompt string
	// Hashes, when set, keeps Prompt's chunk hashes across the request's
	// Routes (failover retries, cascade steps) and its dispatch scans in
	// the queue, so that the prefix index hashes the prompt once. The
	// router alone reads and fills it; nil: hashed on every lookup.
	Hashes *prefixindex.PromptHashes
	// Key is the API key's name: the queue's fair shares are per key.
	Key string
	// Ask is what the request and its key say of its priority, TTFT
	// objective and fairness id (priority.go).
	Ask Ask
	// LeastLoaded: the request keeps no KV cache worth routing for
	// (embeddings, rerank, score, tokenize): it goes to the least loaded
	// worker whatever the policy, to the last step of a cascade and to a
	// unified worker of a disaggregated route, and is not recorded in the
	// prefix index.
	LeastLoaded bool
	// AnyRole: any worker of the served model will do, whatever its role
	// (tokenize, detokenize); the least loaded is taken.
	AnyRole bool
	// Pin, when set, is the only worker that may serve the request (it
	// holds state the request refers to): ErrPinnedGone when it is gone,
	// never another worker.
	Pin string
	// CacheSalt is the request's cache_salt, as sent to the engine: the
	// prefix index matches it only against prompts sent with the same
	// salt, and the exact view only against blocks computed with it.
	CacheSalt string
	// Tokens are the prompt's token ids per base model, as the engines of
	// that model tokenize it (exact.go): a cache_aware pick among workers
	// with an exact view asks for them (NeedTokensError) unless NoTokens
	// says they could not be had, or NoAsk that none may be asked.
	// Read-only to the router.
	Tokens   map[string][]uint32
	NoTokens map[string]bool
	NoAsk    bool
	// Partial names the models whose Tokens are a prefix of the prompt's
	// only (a conversation's earlier turn's): the prompt's length is then
	// estimated from its bytes, at least theirs.
	Partial map[string]bool
	// Keys, when set, keeps the tokens' block keys across Routes (like
	// Hashes).
	Keys *TokenKeys
	// KeepPrefill, on a disaggregated route, is the prefill worker that
	// holds the prompt's KV for the request already (its decode failed
	// before the first byte): the pair keeps it while it is routable.
	KeepPrefill string
}

// Target is the router's answer: where an attempt goes.
type Target struct {
	Worker      fleet.Worker
	Prefill     *fleet.Worker // disaggregated routes: the prefill worker
	Route       string        // the public route model the request named
	ServedModel string        // the id the engine answers to
	Reason      string        // policy reason: least_outstanding, weighted, affinity, load
	// PrefillReason and DecodeReason say why a disaggregated pair's
	// workers were picked (pair.go); Reason is PrefillReason then.
	PrefillReason, DecodeReason string
	// Queue and Priority are the admission queue (model) the request went
	// through and its priority there, for the TTFT it reports back
	// (AttemptSucceeded).
	Queue    string
	Priority int
	// CascadeStep and CascadeSteps locate the answered step of a cascade
	// route (0 and 1 for any other route); AcceptIf is the step's rule (empty
	// on the last step).
	CascadeStep  int
	CascadeSteps int
	AcceptIf     string
	Rule         cascade.Accept // AcceptIf parsed (zero on the last step)
	// Cascade is the cascade route's steps (the table's: read only; nil
	// for any other route) and OnEscalationFailure its
	// on_escalation_failure.
	Cascade             []routes.Step
	OnEscalationFailure string
	Epoch               uint64
	// Indexing is what a cache_aware pick records in the prefix index once
	// the attempt's answer begins: the request hands it back with
	// AttemptSucceeded.
	Indexing Indexing
	// MatchedTokens is, for a cache_aware pick, the estimated prompt tokens
	// the worker holds cached (0 for other policies); PromptTokens is the
	// prompt's estimated length in tokens (cache_aware picks only). Both
	// are exact for a pick on an exact view.
	MatchedTokens, PromptTokens int
	// CacheView is how a cache_aware pick saw the worker's cache: "exact"
	// (its KV events) or "approximate" (the prefix index); "" for other
	// policies.
	CacheView string
	// Policy is the route policy that picked Worker, Candidates how many
	// workers it chose among (for traces).
	Policy     string
	Candidates int
	// Skipped are the cascade steps before CascadeStep that had no
	// routable worker, in order.
	Skipped []Skip
}

// Disaggregated reports whether the target is a prefill/decode pair.
func (t Target) Disaggregated() bool { return t.Prefill != nil }

type poolKey struct {
	model string
	role  fleet.Role
}

type pool struct {
	ids  []string        // members, sorted
	ws   []*fleet.Worker // parallel to ids
	ns   []*counter      // parallel to ids: their in-flight counts
	ring *ring.Ring
	swrr policy.SWRR
}

// State is the router's state. It is kept outside the actor instance so
// that a restarted router keeps its route table, epoch and in-flight counts;
// its view of the workers is rebuilt from the registry on every start.
type State struct {
	cfg      Config
	table    *routes.Table
	epoch    uint64
	workers  map[string]*fleet.Worker
	inflight map[string]*counter // per worker id; outlives the worker until released
	pools    map[poolKey]*pool
	cands    []policy.Candidate // scratch, reused per pick
	members  []*fleet.Worker    // scratch, parallel to cands
	ctrs     []*counter         // scratch, parallel to cands
	prefix   *cacheState        // the cache_aware policy's index; nil for others
	exact    *kvindex.Index     // the exact views (cache_aware only)
	needTok  *NeedTokensError   // set by a pick that needs the prompt's tokens

	// dcands is the scratch of a disaggregated pair's decode pick.
	dcands []policy.DecodeCandidate

	// Passive health and admission control (ejection.go, admission.go);
	// votes are the peers' ejections waiting for evidence (sync.go), by
	// worker and replica, belied those an answer belied, until the end
	// they claimed.
	health  map[string]*health
	votes   map[string]map[string]time.Time
	belied  map[string]map[string]time.Time
	learned map[string]learned
	queues  map[string]*modelQueue
	waiters map[uint64]*Waiter
	byFrom  map[string]uint64
	seq     uint64
	// full: the last pick found a pool full (its workers at their limits,
	// or all saturated by their engines' reports: saturated, with why).
	full, saturated bool
	why             string
	// Priorities and objectives (priority.go): how fast each queue drains,
	// the recent TTFT per queue band and per worker.
	drains     map[string]*drain
	bandTTFT   map[bandKey]*ewma
	workerTTFT map[string]*ewma

	// Fleet sync (sync.go): the other replicas' claims, and when each
	// replica heard from lately was last (the known ones).
	peers        map[string]*peerState
	known        map[string]time.Time
	pendingIndex map[string]pendingEntry
	// pendingStored are peers' stored responses waiting for their workers
	// (stored.go), by worker; pendingStoredN counts them.
	pendingStored  map[string][]pendingStored
	pendingStoredN int

	// Models known beyond the table and the workers (known.go): those
	// the configuration names, those of down engines, and when each model
	// a worker left serving was last served.
	configured map[string]bool
	down       []fleet.Down
	lastServed map[string]time.Time
}

// NewState returns a router state with the given table and epoch.
func NewState(cfg Config, table *routes.Table, epoch uint64) *State {
	if table == nil {
		table, _ = routes.NewTable(nil)
	}
	return &State{
		cfg: cfg, table: table, epoch: epoch,
		workers:  map[string]*fleet.Worker{},
		inflight: map[string]*counter{},
		pools:    map[poolKey]*pool{},
		prefix:   newCacheState(cfg),
		exact:    newExact(cfg),
	}
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
			p.ns = slices.Insert(p.ns, i, s.counter(w.ID))
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
	delete(s.health, id)
	delete(s.votes, id)
	delete(s.belied, id)
	if c := s.inflight[id]; c != nil {
		c.until, c.suspect, c.trials = time.Time{}, false, 0
		s.dropIdle(id, c)
	}
}

// ResetWorkers replaces the whole view (after a (re)start).
func (s *State) ResetWorkers(ws []fleet.Worker) {
	s.workers = map[string]*fleet.Worker{}
	s.pools = map[poolKey]*pool{}
	for _, w := range ws {
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

// counter is one worker's in-flight count, shared by the pools that list
// the worker so a pick reads it without a map lookup.
type counter struct {
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
func (c *counter) ejectedAt(now time.Time) bool { return now.Before(c.until) }
func (c *counter) atLimit() bool                { return c.limit > 0 && c.used() >= c.limit }

// used is what counts against the worker's admission limit: the gateway's
// requests on it and the peers' as admission counts them (peerAdmitted).
func (c *counter) used() int { return c.n + c.peerAdmitted() }

// corroborated is the in-flight load the engine's last report shows
// beyond the gateway's own requests: the most of the peers' claims it
// bears out.
func (c *counter) corroborated() int { return max(0, c.reported-c.ownAtReport) }

// peerLoad is the peers' claims as routing counts them: at most what the
// engine's last report corroborates, plus the peers' picks since that
// report (at most margin of them: the engine could not show those yet),
// and at most the worker's limit.
func (c *counter) peerLoad() int {
	n := min(c.peer, c.corroborated()+min(c.peerPicks, c.margin))
	if c.limit > 0 {
		n = min(n, c.limit)
	}
	return n
}

// peerAdmitted is the peers' claims as admission control counts them:
// only what the engine's last report corroborates, so claims the engine
// does not bear out never fill the worker's slots.
func (c *counter) peerAdmitted() int {
	n := min(c.peer, c.corroborated())
	if c.limit > 0 {
		n = min(n, c.limit)
	}
	return n
}

func (s *State) counter(id string) *counter {
	c := s.inflight[id]
	if c == nil {
		c = &counter{tie: tieRank(s.cfg.Sync.TieSalt, id), margin: s.cfg.Sync.claimMargin()}
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
	c := s.counter(id)
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

// SetRoutes installs a new table and epoch.
func (s *State) SetRoutes(t *routes.Table, epoch uint64) { s.table, s.epoch = t, epoch }

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
	t.Cascade, t.OnEscalationFailure = r.Cascade, r.OnEscalationFailure
	// A cascade step with no routable worker is skipped: the request goes
	// on to the next step rather than being refused while a later step
	// could answer. A step whose workers are all at their limit is not
	// skipped: the request waits for it (admission.go).
	step := min(max(req.Step, 0), len(r.Cascade)-1)
	if req.Stream || req.LeastLoaded {
		step = len(r.Cascade) - 1
	}
	fullBefore := s.full
	defer func() { s.full = s.full || fullBefore }()
	var skipped []Skip
	for ; ; step++ {
		t.CascadeStep, t.CascadeSteps, t.AcceptIf = step, len(r.Cascade), r.Cascade[step].AcceptIf
		t.Rule, _ = s.table.Rule(r.Model, step)
		sr, sreq := s.resolveStep(r, step, req)
		s.full = false
		tg, err := s.pickRoute(t, sr, sreq, req.Model, now)
		if err == nil {
			tg.Skipped = skipped
			return tg, nil
		}
		var nc *NoCapacityError
		if step == len(r.Cascade)-1 || s.full || !errors.As(err, &nc) {
			if nc != nil && len(skipped) > 0 {
				nc.Skipped = skipped
			}
			return Target{}, err
		}
		skipped = append(skipped, Skip{Step: step, Model: r.Cascade[step].Model, Why: nc.Why})
	}
}

// resolveStep is the route and the request a cascade step asks: the
// step's model resolved like a request's, down to the last step of a step
// that is a cascade itself (validation forbids cycles; depth bounds it
// anyway).
func (s *State) resolveStep(r routes.Route, step int, req *Request) (routes.Route, *Request) {
	r = s.table.Resolve(r.Cascade[step].Model)
	req = stepRequest(req, r)
	for depth := 0; r.IsCascade() && depth < 8; depth++ {
		r = s.table.Resolve(r.Cascade[len(r.Cascade)-1].Model)
		req = stepRequest(req, r)
	}
	return r, req
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
	if len(r.Backends) > 1 {
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

// stepRequest is req as asked of a cascade step's route r: the step's
// model, r's last step if r is a cascade itself, every other field (the
// prompt, the key, the exclusions) as the client's request had it.
func stepRequest(req *Request, r routes.Route) *Request {
	next := *req
	next.Model, next.Step = r.Model, len(r.Cascade)-1
	return &next
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
// the request is served by another rather than refused.
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
// members of a pool.
func (s *State) candidates(model string, role fleet.Role, req *Request, now time.Time, keep func(*fleet.Worker) bool) (*pool, bool) {
	s.cands, s.members, s.ctrs = s.cands[:0], s.members[:0], s.ctrs[:0]
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
		s.cands, s.members, s.ctrs = s.cands[:0], s.members[:0], s.ctrs[:0]
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
		s.ctrs = append(s.ctrs, c)
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
	p, ok := s.candidates(model, role, req, now, keep)
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

// The states of a worker in the admin API's list (WorkerView.State).
const (
	StateRoutable = "routable"
	StateSuspect  = "suspect"  // routable; its last attempts failed, one request at a time
	StateEjected  = "ejected"  // passive health keeps it out for a while
	StateDraining = "draining" // the engine says it is draining
	StateDrained  = "drained"  // an operator drained its model
	StateStale    = "stale"    // it missed its heartbeats; its eviction is on its way
	StateDown     = "down"     // a probed engine whose probes fail (fleet.Down)
)

// WorkerView is one worker as the admin API lists it.
type WorkerView struct {
	fleet.Worker
	// State says why the worker is or is not routable (State*);
	// LastError and DownSince say why and since when a down engine is.
	State     string    `json:"state"`
	LastError string    `json:"last_error,omitempty"`
	DownSince time.Time `json:"down_since,omitzero"`
	InFlight  int       `json:"in_flight"`
	// Routable: new requests may go to the worker: live, not draining or
	// drained, and not ejected.
	Routable bool `json:"routable"`
	// PeerInFlight is the other replicas' requests in flight on the
	// worker, as fleet sync reports them (0 with sync off).
	PeerInFlight int `json:"peer_in_flight"`
	// PrefixIndexChunks is the worker's share of the cache_aware prefix
	// index, in chunks (0 under other policies).
	PrefixIndexChunks int `json:"prefix_index_chunks"`
	// CacheView is how cache_aware sees the worker's KV cache: "exact"
	// (from its KV events), "stale" (its events were lost or are late:
	// routed on the prefix index until they flow again) or "approximate"
	// (it publishes none: the prefix index). KVBlocks are the blocks its
	// exact view holds, per tier (gpu, cpu, disk, other).
	CacheView string         `json:"cache_view"`
	KVBlocks  map[string]int `json:"kv_blocks,omitempty"`
	// Ejection and admission (ejection.go, admission.go).
	EjectedUntil     time.Time `json:"ejected_until,omitzero"`
	EjectionReason   string    `json:"ejection_reason,omitempty"`
	Ejections        int       `json:"ejections"`
	ConcurrencyLimit int       `json:"concurrency_limit"`
	// ConsecutiveFailures are the worker's attempt failures in a row
	// since its last answer (0 while ejected); while > 0 it is suspect
	// and takes one new request at a time.
	ConsecutiveFailures int `json:"consecutive_failures"`
}

// Workers lists every known worker at now, and every down engine, sorted
// by id.
func (s *State) Workers(now time.Time) []WorkerView {
	out := make([]WorkerView, 0, len(s.workers)+len(s.down))
	for _, w := range s.workers {
		v := WorkerView{Worker: *w, InFlight: s.InFlight(w.ID), PeerInFlight: s.PeerInFlight(w.ID), Routable: w.Routable(now), PrefixIndexChunks: s.indexChunks(w.ID)}
		v.CacheView, v.KVBlocks = s.exactStats(w.ID, now)
		v = s.overloadView(v, now)
		v.State = s.viewState(&v, now)
		out = append(out, v)
	}
	out = append(out, s.downViews()...)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// viewState is the State of a worker's view: its state for any request
// (stateOf), a worker at its concurrency limit being routable, and a
// routable one with failures in a row suspect.
func (s *State) viewState(v *WorkerView, now time.Time) string {
	switch s.stateOf(&v.Worker, &Request{}, now, false) {
	case stateStale:
		return StateStale
	case stateDrained:
		return StateDrained
	case stateDraining:
		return StateDraining
	case stateEjected:
		return StateEjected
	}
	if v.ConsecutiveFailures > 0 {
		return StateSuspect
	}
	return StateRoutable
}

// Ready reports whether at least one worker is routable at now.
func (s *State) Ready(now time.Time) bool {
	for _, w := range s.workers {
		if w.Routable(now) {
			return true
		}
	}
	return false
}

// Models lists route models, aliases, the model ids known workers serve
// (base models and adapters) and every other model known at now (Known).
func (s *State) Models(now time.Time) []string {
	seen := map[string]bool{}
	var out []string
	add := func(m string) {
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	for _, m := range s.table.Models() {
		add(m)
	}
	for _, w := range s.workers {
		for _, m := range w.Models() {
			add(m)
		}
	}
	for _, m := range s.knownElsewhere(now) {
		add(m)
	}
	sort.Strings(out)
	return out
}

// Adapters maps each LoRA adapter a known worker serves to its base model
// (the smallest, should workers disagree).
func (s *State) Adapters() map[string]string {
	out := map[string]string{}
	for _, w := range s.workers {
		for _, a := range w.Adapters {
			if base, ok := out[a]; !ok || w.Model < base {
				out[a] = w.Model
			}
		}
	}
	return out
}
