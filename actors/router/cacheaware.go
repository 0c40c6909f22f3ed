package router

import (
	"slices"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/prefixindex"
)

// cacheState is the cache_aware policy's part of the router state: the
// prefix index of what each worker was sent, and scratch for a pick.
type cacheState struct {
	cfg     policy.CacheAwareConfig
	index   *prefixindex.Index
	prefill []int // parallel to State.cands
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

// observeWorker runs before SetWorker stores w: a new heartbeat samples the
// worker's foreign load, and the index follows the worker (a restart or
// rebuilt KV forgets what it held).
func (s *State) observeWorker(w fleet.Worker) {
	c := s.counter(w.ID)
	if old, ok := s.workers[w.ID]; !ok || !old.LastHeartbeat.Equal(w.LastHeartbeat) {
		sample := w.Running + w.QueueDepth - c.n - c.peer
		c.foreign = sample
		if c.sampled {
			c.foreign = min(sample, c.lastSample)
		}
		c.lastSample, c.sampled = sample, true
	}
	if s.prefix == nil {
		return
	}
	s.prefix.index.Observe(w)
	c.slot, _ = s.prefix.index.Slot(w.ID)
}

// forgetWorker drops an evicted worker's index entries.
func (s *State) forgetWorker(id string) {
	if s.prefix != nil {
		s.prefix.index.Forget(id)
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
// Fleet sync's peer in-flight (c.peer) counts too, and is left out of the
// heartbeats' foreign load, which is then only what neither the gateway
// nor its peers sent.
func slotLoad(c *counter) int {
	return c.n + c.peer + max(0, c.foreign)
}

// pickCacheAware picks among s.cands by policy.CacheAware. The prompt is
// not recorded yet: t.Indexing says what to record once the pick's answer
// begins (Indexed). It returns the pick's index and reason.
func (s *State) pickCacheAware(t *Target, model string, req *Request) (int, string) {
	ca := s.prefix
	if ca == nil || len(s.cands) == 0 {
		return -1, ""
	}
	base, ns := indexKey(s.members[0].Model, model, req.CacheSalt)
	q := ca.index.LookupHashed(base, ns, req.Prompt, req.Hashes)
	tokens := ca.index.Tokens(q.PromptBytes())
	chunk := ca.index.Config().ChunkBytes
	ca.prefill = ca.prefill[:0]
	for i := range s.cands {
		c := s.ctrs[i]
		s.cands[i].Load = slotLoad(c)
		held := 0
		if s.members[i].Model == base { // a slot is its base model's
			held = ca.index.Tokens(q.ChunksAt(c.slot) * chunk)
		}
		ca.prefill = append(ca.prefill, tokens-min(tokens, held))
	}
	i, reason := policy.CacheAware(s.cands, ca.prefill, ca.cfg)
	if i < 0 {
		return -1, ""
	}
	hs := q.Hashes() // the request's memo's: stable until its next Route
	if req.Hashes == nil {
		hs = slices.Clone(hs) // the index's scratch
	}
	t.Indexing = Indexing{Worker: s.cands[i].ID, Model: base, Hashes: hs}
	t.MatchedTokens, t.PromptTokens = tokens-ca.prefill[i], tokens
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
}

// Indexed records ix, a pick's prompt whose answer began, in the prefix
// index (at most the worker's per-request share of it). A worker that is
// gone, or now serves another model, records nothing.
func (s *State) Indexed(ix Indexing) {
	if s.prefix == nil || len(ix.Hashes) == 0 {
		return
	}
	_ = s.prefix.index.RecordHashes(ix.Model, ix.Worker, ix.Hashes)
}

// syncIndexing tells the Syncer, at pick time, the prompt a pick will
// record once its answer begins (see Syncer.Indexed for why peers are
// told at once).
func (s *State) syncIndexing(ix Indexing) {
	if !s.syncing() || s.prefix == nil || len(ix.Hashes) == 0 {
		return
	}
	n := s.prefix.index.RequestShare(ix.Worker)
	s.cfg.Sync.Syncer.Indexed(ix.Model, ix.Worker, ix.Hashes[:min(len(ix.Hashes), n)])
}
