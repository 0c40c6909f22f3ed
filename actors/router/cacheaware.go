package router

import (
	"slices"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/kvindex"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/prefixindex"
)

// cacheState is the cache_aware policy's part of the router state: the
// prefix index of what each worker was sent, and scratch for a pick.
type cacheState struct {
	cfg     policy.CacheAwareConfig
	index   *prefixindex.Index
	prefill []int // parallel to State.cands
	exact   exactScore
	// indexOnly is what each candidate would prefill by the prefix index
	// alone, for an agreement check (agreement.go); parallel to State.cands.
	indexOnly []int
}

// newCacheState returns the cache-aware state of cfg, or nil when the
// policy is another (nothing is indexed then).
func newCacheState(cfg Config) *cacheState {
	if cfg.Policy != policy.NameCacheAware {
		return nil
	}
	ca := cfg.CacheAware
	if ca == (policy.CacheAwareConfig{}) {
		ca = policy.DefaultCacheAware()
	}
	return &cacheState{cfg: ca, index: prefixindex.New(cfg.PrefixIndex)}
}

// newExact returns the exact views of cfg: the cache_aware policy's only,
// unless cfg.NoExact.
func newExact(cfg Config) *kvindex.Index {
	if cfg.Policy != policy.NameCacheAware || cfg.NoExact {
		return nil
	}
	return kvindex.New(cfg.KVIndex)
}

// observeWorker runs before SetWorker stores w: a new heartbeat samples the
// worker's foreign load, and the index follows the worker (a restart or
// rebuilt KV forgets what it held).
func (s *State) observeWorker(w fleet.Worker) {
	c := s.load(w.ID)
	if old, ok := s.workers[w.ID]; !ok || !old.LastHeartbeat.Equal(w.LastHeartbeat) {
		c.reported, c.ownAtReport, c.peerPicks = w.Running+w.QueueDepth, c.n, 0
		sample := w.Running + w.QueueDepth - c.n - c.peerLoad()
		c.foreign = sample
		if c.sampled {
			c.foreign = min(sample, c.lastSample)
		}
		c.lastSample, c.sampled = sample, true
	}
	if old, ok := s.workers[w.ID]; ok {
		s.followIncarnation(old, w)
	}
	if s.prefix == nil {
		return
	}
	s.prefix.index.Observe(w)
	c.slot, _ = s.prefix.index.Slot(w.ID)
}

// followIncarnation clears w's exact view when old, the worker as the
// router knew it, was another incarnation: its cache is empty now. The
// view may hold events of the new one already, so it is not known whole
// (kvindex.Index.Clear).
func (s *State) followIncarnation(old *fleet.Worker, w fleet.Worker) {
	if s.exact != nil && !old.StartedAt.Equal(w.StartedAt) {
		s.exact.Clear(w.ID)
	}
}

// forgetWorker drops an evicted worker's index entries and exact view.
func (s *State) forgetWorker(id string) {
	if s.prefix != nil {
		s.prefix.index.Forget(id)
	}
	if s.exact != nil {
		s.exact.Forget(id)
	}
}

// retainWorkers drops the index entries of workers no longer known (after
// a reset of the view).
func (s *State) retainWorkers() {
	if s.prefix != nil {
		s.prefix.index.Retain(func(id string) bool { _, ok := s.workers[id]; return ok })
	}
}

// slotLoad is a worker's load in engine slots: the gateway's own requests
// in flight there, plus the foreign load its heartbeats report (what it
// reported running and queued beyond the gateway's count when the report
// arrived, the smaller of the last two reports, never below 0). With the
// gateway the only sender this is its in-flight count, exact between
// heartbeats; another replica's load shows from its second heartbeat.
//
// Fleet sync's peer in-flight counts too (as far as the engine bears it
// out: peerLoad), and is left out of the heartbeats' foreign load, which
// is then only what neither the gateway nor its peers sent.
func slotLoad(c *workerLoad) int {
	return c.n + c.peerLoad() + max(0, c.foreign)
}

// pickCacheAware picks among s.cands by policy.CacheAware. A candidate
// whose exact view (its KV events) is usable is scored on the request's
// tokens; the others on the prefix index, in the same tokens (the
// estimates scaled to the tokens' count). A request that brings no tokens
// while a candidate's view is usable is asked for them (s.needTok) unless
// it may not be. The prompt is not recorded yet: t.Indexing says what to
// record once the pick's answer begins (Indexed). It returns the pick's
// index and reason.
func (s *State) pickCacheAware(t *Target, model string, req *Request, now time.Time) (int, string) {
	ca := s.prefix
	if ca == nil || len(s.cands) == 0 {
		return -1, ""
	}
	base, ns := indexKey(s.members[0].Model, model, req.CacheSalt)
	lora := ""
	if model != base {
		lora = model
	}
	anyExact := s.markUsable(now)
	tokens, haveTokens := tokensOf(req, base)
	agreed := false
	if anyExact && !haveTokens && !req.NoAsk && !req.NoTokens[base] {
		if agreed = s.skipTokens(base, req); !agreed {
			s.needTok = s.needTokens(base, model)
			return -1, ""
		}
	}
	q := ca.index.LookupHashed(base, ns, req.Prompt, req.Hashes)
	est := ca.index.Tokens(q.PromptBytes())
	prompt, scale := est, 1.0
	if haveTokens {
		prompt = len(tokens)
		if req.Partial[base] {
			prompt = max(prompt, est)
		}
		if est > 0 {
			scale = float64(prompt) / float64(est)
		}
	}
	chunk := ca.index.Config().ChunkBytes
	ca.prefill, ca.indexOnly = ca.prefill[:0], ca.indexOnly[:0]
	for i := range s.cands {
		c := s.loads[i]
		s.cands[i].Load = slotLoad(c)
		// indexed: the prompt's tokens the prefix index believes cached
		// there (a slot is its base model's).
		indexed := 0
		if s.members[i].Model == base {
			indexed = ca.index.Tokens(q.ChunksAt(c.slot) * chunk)
		}
		held := int(float64(indexed) * scale)
		if haveTokens && ca.exact.usable[i] {
			h, _, _ := s.exactHeld(i, req, base, lora, req.CacheSalt, tokens, now)
			held = int(h)
		}
		ca.prefill = append(ca.prefill, prompt-min(prompt, held))
		ca.indexOnly = append(ca.indexOnly, est-min(est, indexed))
	}
	i, reason := policy.CacheAware(s.cands, ca.prefill, ca.cfg)
	if i < 0 {
		return -1, ""
	}
	if haveTokens && anyExact && !req.Partial[base] {
		s.checkAgreement(base, req, i, prompt, est)
	}
	hs := q.Hashes() // the request's memo's: stable until its next Route
	if req.Hashes == nil {
		hs = slices.Clone(hs) // the index's scratch
	}
	t.Indexing = Indexing{Worker: s.cands[i].ID, Model: base, Hashes: hs}
	t.MatchedTokens, t.PromptTokens = prompt-ca.prefill[i], prompt
	t.CacheView = kvindex.None.CacheView()
	if agreed {
		t.CacheView = ViewAgreed
	}
	if haveTokens {
		// The pick's blocks are held speculatively until its events come;
		// an exact pick expects them.
		id := s.cands[i].ID
		_, keys, bs := s.exactHeld(i, req, base, lora, req.CacheSalt, tokens, now)
		if ca.exact.usable[i] {
			t.CacheView = kvindex.Exact.CacheView()
			t.Indexing.Exact.Expect = s.exact.Holds(id, keys) < len(keys)
			t.Indexing.Exact.Keys = keys
		}
		s.exact.Speculate(id, keys, bs, now)
		if ca.exact.usable[i] {
			s.syncSpeculated(id, keys)
		}
	}
	return i, reason
}

// indexKey is where a prompt for served model id served, with cache salt
// salt, lives in the prefix index: under the base model of the workers
// serving it, in a namespace of the adapter (when served is one) and the
// salt, so adapters of one base and salted tenants never share entries.
func indexKey(base, served, salt string) (model, ns string) {
	if served != base {
		ns = "lora:" + served
	}
	if salt != "" {
		ns += "\x00salt:" + salt
	}
	return base, ns
}

// indexChunks is a worker's share of the prefix index, in chunks.
func (s *State) indexChunks(id string) int {
	if s.prefix == nil {
		return 0
	}
	st, _ := s.prefix.index.Stats(id)
	return st.Chunks
}

// Indexing is the prefix-index record of a cache_aware pick, made only
// once the picked worker began to answer (Indexed): a prompt the engines
// refuse, or an attempt that fails before its first byte, leaves the index
// as it was. The zero value records nothing.
type Indexing struct {
	// Worker is the worker that computes the prompt's KV: the pick, or
	// the prefill worker of a disaggregated pair.
	Worker string
	// Model is the index's model, the worker's base model.
	Model string
	// Hashes are the prompt's chunk hashes in its namespace (adapter,
	// cache salt). They may be the request's PromptHashes memo's, valid
	// until the request's next Route: Indexed must come before it.
	Hashes []uint64
	// Exact is the pick's part on the worker's exact view.
	Exact ExactIndexing
}

// Indexed records ix, a pick's prompt whose answer began at now, in the
// prefix index (at most the worker's per-request share of it), and, for
// an exact pick, expects the worker's events about it. A worker that is
// gone, or now serves another model, records nothing.
func (s *State) Indexed(ix Indexing, now time.Time) {
	s.exactIndexed(ix, now)
	if s.prefix == nil || len(ix.Hashes) == 0 {
		return
	}
	_ = s.prefix.index.RecordHashes(ix.Model, ix.Worker, ix.Hashes)
}

// syncIndexing tells the Syncer, at pick time, the prompt a pick will
// record once its answer begins (see Syncer.Indexed for why peers are
// told at once).
func (s *State) syncIndexing(ix Indexing, now time.Time) {
	if !s.syncing() || s.prefix == nil || len(ix.Hashes) == 0 {
		return
	}
	if s.exact != nil && s.exact.Usable(ix.Worker, now) {
		return // every replica follows the worker's events itself
	}
	n := s.prefix.index.RequestShare(ix.Worker)
	s.cfg.Sync.Syncer.Indexed(ix.Model, ix.Worker, ix.Hashes[:min(len(ix.Hashes), n)])
}
