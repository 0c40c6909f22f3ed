package router

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/kvindex"
	"github.com/tlgate/tlgate/internal/routing/policy"
)

// The exact view: for workers that publish their KV cache events, what
// their caches hold, from the events (package kvindex), where the prefix
// index can only guess. Their subscribers (internal/adapter/kvsub) send the
// batches as KVEvents; a cache_aware pick scores a worker whose view is
// exact on the request's tokens, tokenized as the engine tokenizes them,
// and every other worker on the prefix index, as before.

// KVEvents is a worker's KV cache events, and the state of its view once
// they are applied, from the worker's subscriber.
type KVEvents struct {
	Worker string
	// Clear empties the view before Batches are applied (the engine
	// restarted, or batches were lost).
	Clear bool
	// Restarted: the engine's cache was empty before Batches (it
	// restarted, or Batches begin with its first batch): the view is
	// emptied as with Clear, and knows every block the engine holds
	// (kvindex.Index.ClearRestarted).
	Restarted bool
	Batches   []kvindex.Batch
	// State is the view's state after Batches: kvindex.None ends it (the
	// subscription stopped).
	State kvindex.State
	// Done, when set, is called once the router applied the events (the
	// subscriber bounds what it has in flight).
	Done func()
}

// KVApplied is what the router did with a worker's KVEvents, for metrics
// (Config.OnKVApplied).
type KVApplied struct {
	Worker  string
	Applied kvindex.Applied
	// Failed counts batches the view could not apply (it was cleared).
	Failed int
}

// NeedTokensError answers a Route whose pick would score a worker on its
// exact view but which brings no tokens of its prompt for the worker's
// model: nothing was counted; the request tokenizes its prompt (at URL,
// or, when URL is empty, on Worker's HTTP address, as Model) and routes
// again with Request.Tokens, or with Request.NoTokens when it could not
// in time.
type NeedTokensError struct {
	// Base is the base model the tokens are for (Request.Tokens' key).
	Base string
	// Model is the model id to tokenize as (the served id: the base, or
	// an adapter of it).
	Model string
	// URL is the base URL of the tokenizer configured for Base (""
	// none); Worker the HTTP address of a worker of Model to ask instead.
	URL, Worker string
}

// ErrNeedTokens is wrapped by NeedTokensError.
var ErrNeedTokens = errors.New("router: the prompt's tokens are needed")

func (e *NeedTokensError) Error() string {
	return fmt.Sprintf("%v: %s (as %s)", ErrNeedTokens, e.Base, e.Model)
}

func (e *NeedTokensError) Unwrap() error { return ErrNeedTokens }

// TokenKeys keeps a request's block keys (kvindex.Keys) across its Routes
// (failover retries, cascade steps, dispatch scans in the queue), per
// model, namespace and block size, so that they are computed once. The
// router alone reads and fills it; the zero value holds none.
type TokenKeys struct {
	sets []keySet
	// skip and checked are the request's agreement decisions per base
	// model (agreement.go): routed on the index without its tokens, and
	// its exact pick checked against the index's.
	skip, checked map[string]bool
}

type keySet struct {
	base, lora, salt string
	bs               int
	keys             []uint64
}

// keysFor returns the keys of tokens in (base, lora, salt) at block size
// bs, computing them once.
func (k *TokenKeys) keysFor(base, lora, salt string, tokens []uint32, bs int) []uint64 {
	for _, s := range k.sets {
		if s.base == base && s.lora == lora && s.salt == salt && s.bs == bs {
			return s.keys
		}
	}
	keys := kvindex.Keys(make([]uint64, 0, len(tokens)/max(bs, 1)), lora, salt, tokens, bs)
	k.sets = append(k.sets, keySet{base, lora, salt, bs, keys})
	return keys
}

// ApplyKV applies a worker's KV events at now and reports what it did. A
// batch the view cannot apply clears it (stale).
func (s *State) ApplyKV(m *KVEvents, now time.Time) KVApplied {
	r := KVApplied{Worker: m.Worker}
	if s.exact == nil {
		return r
	}
	x := s.exact
	if m.State == kvindex.None {
		x.Forget(m.Worker)
		return r
	}
	x.Watch(m.Worker)
	switch {
	case m.Restarted:
		x.ClearRestarted(m.Worker)
	case m.Clear:
		x.Clear(m.Worker)
	}
	st := m.State
	for i := range m.Batches {
		a, err := x.Apply(m.Worker, &m.Batches[i], now)
		if err != nil {
			x.Clear(m.Worker)
			st = kvindex.Stale
			r.Failed++
			continue
		}
		r.Applied.Events += a.Events
		r.Applied.Stored += a.Stored
		r.Applied.Removed += a.Removed
		r.Applied.Cleared += a.Cleared
		r.Applied.Unresolved += a.Unresolved
		r.Applied.UnknownRemoved += a.UnknownRemoved
		r.Applied.Evicted += a.Evicted
		r.Applied.OtherGroups += a.OtherGroups
	}
	x.SetState(m.Worker, st)
	return r
}

// exactScore is the cache_aware scratch of a pick on exact views.
type exactScore struct {
	usable []bool // parallel to State.cands
}

// tokensOf returns the request's tokens of base (ok false: none).
func tokensOf(req *Request, base string) ([]uint32, bool) {
	if req.Tokens == nil {
		return nil, false
	}
	t, ok := req.Tokens[base]
	return t, ok
}

// markUsable fills ca.exact.usable for s.cands and reports whether any
// candidate's view is usable at now.
func (s *State) markUsable(now time.Time) bool {
	ca := s.prefix
	ca.exact.usable = ca.exact.usable[:0]
	anyUsable := false
	for i := range s.cands {
		u := s.exact != nil && s.exact.Usable(s.cands[i].ID, now)
		ca.exact.usable = append(ca.exact.usable, u)
		anyUsable = anyUsable || u
	}
	return anyUsable
}

// tokenizeBeforeWait asks a cache_aware request that finds its pool full
// (s.cands: the pool's candidates) for its prompt's tokens now, as its
// pick would once dispatched, when it brings none and may be asked: it
// tokenizes while it would wait anyway and waits with them. Asked only at
// dispatch, a waiter would leave the queue to tokenize and lose its place,
// and every slot freed would send the whole queue away.
func (s *State) tokenizeBeforeWait(model string, req *Request, now time.Time) {
	if s.prefix == nil || s.exact == nil || req.NoAsk || len(s.cands) == 0 {
		return
	}
	base, _ := indexKey(s.members[0].Model, model, req.CacheSalt)
	if _, ok := tokensOf(req, base); ok || req.NoTokens[base] {
		return
	}
	if s.markUsable(now) && !s.skipTokens(base, req) {
		s.needTok = s.needTokens(base, model)
	}
}

// tokensToWait returns the NeedTokensError a cache_aware request that is
// about to join its model's queue answers first (nil: none), by the rule
// of tokenizeBeforeWait, over the pools its pick would look at: the
// route's backends, or its cascade step's model.
func (s *State) tokensToWait(req *Request, now time.Time) *NeedTokensError {
	if s.cfg.Policy != policy.NameCacheAware || s.prefix == nil || s.exact == nil || req.NoAsk || req.LeastLoaded || req.Pin != "" {
		return nil
	}
	models, role := []string{req.Model}, fleet.RoleUnified
	if r, ok := s.table.Lookup(req.Model); ok {
		switch {
		case r.IsCascade():
			models = []string{r.Cascade[lastStepFor(r, req)].Model}
		default:
			models = models[:0]
			for _, b := range r.Backends {
				models = append(models, b.Model)
			}
			if r.IsDisaggregated() {
				role = fleet.RolePrefill
			}
		}
	}
	full := s.full
	defer func() { s.full = full }()
	for _, m := range models {
		s.needTok = nil
		if _, ok := s.candidates(s.cfg.Policy, m, role, req, now, nil); ok {
			s.tokenizeBeforeWait(m, req, now)
		}
		if nt := s.needTok; nt != nil {
			s.needTok = nil
			return nt
		}
	}
	return nil
}

// needTokens builds the NeedTokensError of a pick among s.cands for
// served model (of base): the configured tokenizer, or the least loaded
// candidate whose view is usable. Asking adds no load, so the candidates
// equally loaded take turns: a burst of requests does not all tokenize
// on one engine.
func (s *State) needTokens(base, served string) *NeedTokensError {
	e := &NeedTokensError{Base: base, Model: served, URL: s.cfg.Tokenizers[base]}
	least, ties := 0, 0
	for i, u := range s.prefix.exact.usable {
		switch {
		case !u:
		case ties == 0 || s.cands[i].Load < least:
			least, ties = s.cands[i].Load, 1
		case s.cands[i].Load == least:
			ties++
		}
	}
	if ties == 0 {
		return e
	}
	turn := int(s.asks % uint64(ties))
	s.asks++
	for i, u := range s.prefix.exact.usable {
		if u && s.cands[i].Load == least {
			if turn == 0 {
				e.Worker = s.members[i].HTTPAddress
				break
			}
			turn--
		}
	}
	return e
}

// exactBlockSize is the block size, in tokens, of worker id's exact view:
// its events', else what its heartbeats say (kvBlockTokens), else 16. A
// pick's keys and a peer's speculated keys are cut by the same rule, so
// that they name the same blocks.
func (s *State) exactBlockSize(id string, kvBlockTokens int) int {
	if bs := s.exact.BlockSize(id); bs > 0 {
		return bs
	}
	if kvBlockTokens > 0 {
		return kvBlockTokens
	}
	return 16
}

// exactHeld returns, for candidate i whose view is usable, the tokens of
// the prompt (tokens, in namespace lora/salt of base) its cache holds,
// weighed by tier, and the prompt's keys at its block size.
func (s *State) exactHeld(i int, req *Request, base, lora, salt string, tokens []uint32, now time.Time) (float64, []uint64, int) {
	id := s.cands[i].ID
	bs := s.exactBlockSize(id, s.members[i].KVBlockTokens)
	var keys []uint64
	if req.Keys != nil {
		keys = req.Keys.keysFor(base, lora, salt, tokens, bs)
	} else {
		keys = kvindex.Keys(nil, lora, salt, tokens, bs)
	}
	m := s.exact.Match(id, keys, now)
	return m.Tokens, keys, bs
}

// PeerSpeculate is a pick another replica made on a worker's exact view:
// its prompt's blocks (Hashes: the block keys, kvindex.Keys) are held
// speculatively on the worker here too, until the worker's events (which
// every replica follows itself) confirm them.
const PeerSpeculate PeerEventKind = 9

// SpeculationSyncer is a Syncer that also tells the peers of the blocks
// an exact pick holds speculatively (fleetsync.Client). It runs inside
// the router actor and must copy what it keeps.
type SpeculationSyncer interface {
	Speculated(worker string, keys []uint64)
}

// syncSpeculated tells the peers of a pick's speculative blocks.
func (s *State) syncSpeculated(worker string, keys []uint64) {
	if !s.syncing() || len(keys) == 0 {
		return
	}
	if sp, ok := s.cfg.Sync.Syncer.(SpeculationSyncer); ok {
		sp.Speculated(worker, keys)
	}
}

// applyPeerSpeculate holds a peer's pick's blocks on the worker's exact
// view at now.
func (s *State) applyPeerSpeculate(ev *PeerEvent, now time.Time, r *PeerApplied) {
	w, ok := s.workers[ev.Worker]
	switch {
	case !ok:
		r.drop(ev.Kind, DropUnknownWorker)
		return
	case s.exact == nil:
		r.applied(ev.Kind) // no exact view here: nothing to hold
		return
	}
	s.exact.Speculate(ev.Worker, ev.Hashes, s.exactBlockSize(ev.Worker, w.KVBlockTokens), now)
	r.applied(ev.Kind)
}

// ExactIndexing is what an exact pick does once its answer begins: the
// worker's events must show the blocks it computed within the event
// timeout (kvindex.Index.Expect).
type ExactIndexing struct {
	// Expect: the pick's prompt has blocks the worker's view did not
	// hold. Keys are the prompt's block keys (read only): blocks the
	// events brought before the answer began expect nothing more.
	Expect bool
	Keys   []uint64
}

// exactIndexed applies ix's exact part at now: the worker's events are
// expected unless its view already holds every block of the prompt (an
// engine may publish a prompt's blocks before its first token reaches
// the gateway, and an idle one publishes nothing after).
func (s *State) exactIndexed(ix Indexing, now time.Time) {
	if s.exact == nil || !ix.Exact.Expect {
		return
	}
	if k := ix.Exact.Keys; len(k) > 0 && s.exact.Holds(ix.Worker, k) == len(k) {
		return
	}
	s.exact.Expect(ix.Worker, now)
}

// exactStats is a worker's exact view for the admin API.
func (s *State) exactStats(id string, now time.Time) (view string, blocks map[string]int) {
	if s.exact == nil {
		return kvindex.None.CacheView(), nil
	}
	st, ok := s.exact.Stats(id, now)
	if !ok {
		return kvindex.None.CacheView(), nil
	}
	blocks = map[string]int{}
	for m, n := range st.ByMedium {
		if n > 0 {
			blocks[kvindex.Medium(m).String()] = n
		}
	}
	return st.State.CacheView(), blocks
}

// ExactView is one worker's exact view, for metrics.
type ExactView struct {
	Worker string
	State  kvindex.State
	// Blocks per tier (kvindex.Medium order); Speculative blocks.
	Blocks      [kvindex.NumMedia]int
	Speculative int
}

// ExactViews lists the workers' exact views at now, sorted by worker.
func (s *State) ExactViews(now time.Time) []ExactView {
	if s.exact == nil {
		return nil
	}
	var out []ExactView
	s.exact.Workers(func(id string) {
		st, _ := s.exact.Stats(id, now)
		out = append(out, ExactView{Worker: id, State: st.State, Blocks: st.ByMedium, Speculative: st.Speculative})
	})
	slices.SortFunc(out, func(a, b ExactView) int {
		switch {
		case a.Worker < b.Worker:
			return -1
		case a.Worker > b.Worker:
			return 1
		}
		return 0
	})
	return out
}
