// Package kvindex is the gateway's exact picture of what each engine holds
// in its KV cache, built from the engine's own KV cache events (vLLM's and
// SGLang's BlockStored, BlockRemoved and AllBlocksCleared), where the
// prefix index (package prefixindex) can only guess from what the gateway
// sent.
//
// Every stored block is kept under the gateway's own chained key, computed
// from its token ids (keys.go), with the engine's hash mapped to it so that
// a removal resolves. A request's prompt, tokenized as the engine tokenizes
// it, is cut into the same keys (Keys), and Match walks them on a worker to
// the first block it does not hold: the longest cached prefix, each block
// weighed by its best tier (GPU above CPU above disk). Between a pick and
// the engine's first events about it, the pick's blocks are held
// speculatively for a short TTL (Speculate), so that a burst of one prefix
// does not spread over every worker.
//
// A worker's view is usable only while its events are known to be whole:
// the subscriber of its events sets its State (Exact, or Stale after a gap
// it could not fill), and Expect marks it stale when an answer began on it
// and none of the events that answer must cause arrived in time. Memory is
// bounded per worker (Config.MaxBlocks) whatever the engine sends: past the
// bound the oldest blocks are forgotten, whatever their data-parallel rank;
// a rank that holds nothing more is forgotten, and one that holds far
// fewer blocks than it did gives back the room they took.
//
// A view never scores a worker on blocks it does not hold as long as an
// engine hash names one block. vLLM and current SGLang chain their hashes
// over the parent block (a hash names a block and everything before it),
// so there a block the view forgot (evicted past the bound, dropped, or
// stored before the view began) only misses hits: its hash resolves to
// nothing. Older SGLang names a page by its tokens alone, so one hash names
// every equal page after any prefix, and a child whose parent's hash the
// view holds for another block would be keyed after the wrong prefix. The
// view learns that its engine's hashes are not chained the first time it
// sees one hash name two blocks, and from then on resolves an engine hash
// (a stored block's parent, a tier added to a held block) only on a rank
// it knows whole (complete: every block the rank held since its cache was
// last known empty, none forgotten); elsewhere the blocks are left out
// (Applied.Unresolved), a missed hit. Until that first collision is seen,
// an unchained engine's view can still key a block after the wrong prefix.
//
// An Index holds no actor and does no I/O; it is not safe for concurrent
// use (the router actor owns it).
package kvindex

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Defaults of Config.
const (
	// DefaultMaxBlocks bounds one worker's blocks: 4 Mi tokens of KV at
	// 16-token blocks, about 30 MiB of index (BytesPerBlock).
	DefaultMaxBlocks = 1 << 18
	// DefaultSpeculativeTTL is how long a pick's blocks count as held
	// before the engine's events say so.
	DefaultSpeculativeTTL = 2 * time.Second
	// DefaultMaxSpeculative bounds one worker's speculative blocks.
	DefaultMaxSpeculative = 1 << 14
	// DefaultEventTimeout is how long after an answer began the events of
	// the blocks it computed may take before the worker's view is stale.
	DefaultEventTimeout = 5 * time.Second
	// MaxRanks bounds the data-parallel ranks of one worker.
	MaxRanks = 256
	// MaxBlockSize bounds an event's block size in tokens.
	MaxBlockSize = 1 << 12
)

// DefaultWeights are the tiers' default weights: GPU 1, CPU 0.8 (as
// llm-d's precise scorer), disk and others 0.5.
var DefaultWeights = [NumMedia]float64{1, 0.8, 0.5, 0.5}

// BytesPerBlock estimates the index's memory per block: its entry (40
// bytes) and its places in two maps (about 40 each, with their growth).
// TestKVIndexBoundedPerWorker measures it. Beyond its blocks a worker's
// view takes a few KiB per data-parallel rank that holds any (a rank
// gives back its room once it holds under a quarter of the most it held
// since, down to minCompact blocks).
const BytesPerBlock = 120

// minCompact is the room, in blocks, below which a rank keeps what it
// has.
const minCompact = 16

// ErrConfig is wrapped by the errors of an invalid Config.
var ErrConfig = errors.New("kvindex: invalid config")

// Config bounds the index and weighs its tiers. Zero fields take the
// defaults (New).
type Config struct {
	// MaxBlocks bounds the blocks kept per worker, every rank and tier.
	MaxBlocks int
	// SpeculativeTTL is how long a pick's blocks count as held on its
	// worker before its events confirm them; MaxSpeculative bounds them
	// per worker.
	SpeculativeTTL time.Duration
	MaxSpeculative int
	// EventTimeout is how long the events of an answer that computed new
	// blocks may take (see Expect).
	EventTimeout time.Duration
	// Weights weigh a held block's tokens by its best tier, in [0, 1].
	Weights [NumMedia]float64
}

// Validate reports a config that cannot be used, naming the field.
func (c Config) Validate() error {
	switch {
	case c.MaxBlocks < 0:
		return fmt.Errorf("%w: max blocks %d must be >= 0", ErrConfig, c.MaxBlocks)
	case c.MaxSpeculative < 0:
		return fmt.Errorf("%w: max speculative blocks %d must be >= 0", ErrConfig, c.MaxSpeculative)
	case c.SpeculativeTTL < 0:
		return fmt.Errorf("%w: speculative TTL %s must be >= 0", ErrConfig, c.SpeculativeTTL)
	case c.EventTimeout < 0:
		return fmt.Errorf("%w: event timeout %s must be >= 0", ErrConfig, c.EventTimeout)
	}
	for i, w := range c.Weights {
		if math.IsNaN(w) || w < 0 || w > 1 {
			return fmt.Errorf("%w: %s weight %v must be in [0, 1]", ErrConfig, Medium(i), w)
		}
	}
	return nil
}

// State is how far a worker's view can be trusted.
type State uint8

// The states of a view.
const (
	// None: the worker publishes no events (or its subscription ended);
	// it is routed on the prefix index.
	None State = iota
	// Pending: subscribed, no batch yet; routed on the prefix index.
	Pending
	// Exact: every event since the view began was applied.
	Exact
	// Stale: events were lost, or are late (Expect); routed on the prefix
	// index until they flow again.
	Stale
)

// CacheView names how the gateway sees a worker's cache, as the admin API
// and the console show it: "exact", "stale" or "approximate".
func (s State) CacheView() string {
	switch s {
	case Exact:
		return "exact"
	case Stale:
		return "stale"
	}
	return "approximate"
}

// String names the state in logs.
func (s State) String() string {
	switch s {
	case Pending:
		return "pending"
	case Exact:
		return "exact"
	case Stale:
		return "stale"
	}
	return "none"
}

// Index is the exact view of every worker that publishes events.
type Index struct {
	cfg     Config
	workers map[string]*view
	buf     []byte // scratch of chain
}

// New returns an empty index; zero or invalid fields of cfg take the
// defaults.
func New(cfg Config) *Index {
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = DefaultMaxBlocks
	}
	if cfg.SpeculativeTTL <= 0 {
		cfg.SpeculativeTTL = DefaultSpeculativeTTL
	}
	if cfg.MaxSpeculative <= 0 {
		cfg.MaxSpeculative = DefaultMaxSpeculative
	}
	if cfg.EventTimeout <= 0 {
		cfg.EventTimeout = DefaultEventTimeout
	}
	if cfg.Weights == ([NumMedia]float64{}) || cfg.Validate() != nil {
		cfg.Weights = DefaultWeights
	}
	return &Index{cfg: cfg, workers: map[string]*view{}}
}

// Config returns the index's (defaulted) config.
func (x *Index) Config() Config { return x.cfg }

// view is one worker's.
type view struct {
	state     State
	blockSize int
	ranks     []*rankView
	n         int           // blocks, every rank
	media     [NumMedia]int // blocks held per tier (a block in two tiers counts in both)
	expect    time.Time     // events expected by then (zero: none)
	silent    bool          // expect passed with no batch: stale until one comes
	spec      speculative   // picks' blocks not confirmed yet
	lastBatch time.Time     // when the last batch was applied
	applied   Applied       // totals, for the admin API
	// unchained: the engine was seen naming two different blocks with one
	// hash, so its hashes are not chained over the parent (older SGLang),
	// and a hash resolves only on a complete rank. It is the engine's
	// hashing scheme: Clear keeps it, Forget and a new block size do not.
	unchained bool
	// complete has bit r set while the view of rank r knows every block
	// the engine's rank r holds: set when its cache is known empty
	// (AllBlocksCleared, ClearRestarted), unset once the view forgets or
	// leaves out a block the engine may hold.
	complete [MaxRanks / 64]uint64
	// clock is the stamp of the block stored or touched last, every rank
	// (see tick).
	clock uint32
}

// isComplete reports whether v knows every block of rank r.
func (v *view) isComplete(r int) bool { return v.complete[r/64]&(1<<(r%64)) != 0 }

// setComplete records whether v knows every block of rank r.
func (v *view) setComplete(r int, ok bool) {
	if ok {
		v.complete[r/64] |= 1 << (r % 64)
	} else {
		v.complete[r/64] &^= 1 << (r % 64)
	}
}

// resolves reports whether an engine hash held by v's rank r names the
// block the engine means: always while its hashes are chained, else only
// when the view knows every block of the rank.
func (v *view) resolves(r int) bool { return !v.unchained || v.isComplete(r) }

// tick returns v's next stamp: blocks are stamped in the order they are
// stored (or stored again), every rank together, so that the oldest of
// the worker's blocks goes first. Before the counter wraps, the blocks
// are stamped again from 1 in their order.
func (v *view) tick() uint32 {
	if v.clock == math.MaxUint32 {
		v.renumber()
	}
	v.clock++
	return v.clock
}

// renumber stamps v's blocks 1, 2... in the order of their stamps.
func (v *view) renumber() {
	type ref struct {
		rv    *rankView
		s     int32
		stamp uint32
	}
	refs := make([]ref, 0, v.n)
	for _, rv := range v.ranks {
		for s := rv.oldest; s >= 0; s = rv.ents[s].newer {
			refs = append(refs, ref{rv, s, rv.ents[s].stamp})
		}
	}
	slices.SortFunc(refs, func(a, b ref) int { return cmp.Compare(a.stamp, b.stamp) })
	for i, r := range refs {
		r.rv.ents[r.s].stamp = uint32(i + 1)
	}
	v.clock = uint32(len(refs))
}

// rankView is one data-parallel rank's blocks. len(ents) is the most
// blocks it held since its maps were made, which is what they take.
type rankView struct {
	rank   int
	byKey  map[uint64]int32 // own key -> entry
	byHash map[uint64]int32 // engine hash -> entry
	ents   []entry
	free   []int32
	newest int32 // -1: none
	oldest int32
}

// entry is one block: its keys, namespace tags, tiers, its place on the
// rank's list of blocks in the order they were stored, and its stamp in
// the worker's order (view.tick).
type entry struct {
	key, hash  uint64
	lora, salt uint32
	media      uint8
	newer      int32
	older      int32
	stamp      uint32
}

func newRankView(rank int) *rankView {
	return &rankView{rank: rank, byKey: map[uint64]int32{}, byHash: map[uint64]int32{}, newest: -1, oldest: -1}
}

// Watch starts a view for worker id (its events are subscribed); a view
// that exists is kept. It is Pending until SetState says otherwise.
func (x *Index) Watch(id string) {
	if x.workers[id] == nil {
		x.workers[id] = &view{state: Pending}
	}
}

// Forget drops worker id's view (gone, or no longer publishing).
func (x *Index) Forget(id string) { delete(x.workers, id) }

// Retain forgets every view for which keep returns false.
func (x *Index) Retain(keep func(id string) bool) {
	for id := range x.workers {
		if !keep(id) {
			delete(x.workers, id)
		}
	}
}

// Clear empties worker id's view (events were lost, or its engine
// restarted at some point the events do not show): every block, held or
// speculative, is forgotten; its state stays, and so does what the view
// learned of the engine's hashing (unchained). The engine may hold blocks
// the view never hears of: no rank is complete.
func (x *Index) Clear(id string) { x.clear(id, false) }

// ClearRestarted empties worker id's view as Clear does, where the
// engine's cache is known empty at this point: it restarted, or the
// batches to come are its first. Every rank is complete.
func (x *Index) ClearRestarted(id string) { x.clear(id, true) }

func (x *Index) clear(id string, empty bool) {
	v := x.workers[id]
	if v == nil {
		return
	}
	*v = view{state: v.state, applied: v.applied, lastBatch: v.lastBatch, unchained: v.unchained}
	if empty {
		for i := range v.complete {
			v.complete[i] = ^uint64(0)
		}
	}
}

// SetState sets worker id's state, watching it if need be (None forgets
// it).
func (x *Index) SetState(id string, s State) {
	if s == None {
		x.Forget(id)
		return
	}
	x.Watch(id)
	x.workers[id].state = s
}

// State returns worker id's state at now: Stale also when its events are
// overdue (Expect), None when it has no view.
func (x *Index) State(id string, now time.Time) State {
	v := x.workers[id]
	if v == nil {
		return None
	}
	if v.state == Exact && v.overdue(now) {
		return Stale
	}
	return v.state
}

// Usable reports whether Match may be trusted for worker id at now.
func (x *Index) Usable(id string, now time.Time) bool { return x.State(id, now) == Exact }

// overdue reports whether events expected of v are late at now (and
// remembers it until a batch comes).
func (v *view) overdue(now time.Time) bool {
	if !v.silent && !v.expect.IsZero() && !now.Before(v.expect) {
		v.silent = true
	}
	return v.silent
}

// Expect says that an answer began on worker id at now which computed
// blocks its view did not hold: the engine must publish them, so a batch
// must come within EventTimeout, or the view turns stale until one does.
// A batch applied since (Apply) clears the expectation.
func (x *Index) Expect(id string, now time.Time) {
	v := x.workers[id]
	if v == nil || v.state != Exact || !v.expect.IsZero() {
		return
	}
	v.expect = now.Add(x.cfg.EventTimeout)
}

// BlockSize returns worker id's block size in tokens (0 until its first
// Stored event).
func (x *Index) BlockSize(id string) int {
	if v := x.workers[id]; v != nil {
		return v.blockSize
	}
	return 0
}

// Applied counts what Apply did.
type Applied struct {
	// Events and Blocks are the events and the blocks they named.
	Events, Stored, Removed, Cleared int
	// Unresolved are stored blocks that could not be keyed: their parent
	// is not in the view (stored before the view began, or forgotten), or
	// the engine's hashes are not chained and the view does not know every
	// block of the rank (so the parent's hash may name another block), or
	// its namespace is not theirs, or the event's tokens do not fill its
	// blocks, or they are another tier's blocks of another size than the
	// GPU's; or, for an event without tokens (a copy to another tier), the
	// view does not hold a block under the hash. They are left out: a
	// missed hit, never a wrong one.
	Unresolved int
	// UnknownRemoved are removed blocks the view did not hold.
	UnknownRemoved int
	// Evicted are blocks forgotten to keep within MaxBlocks.
	Evicted int
	// OtherGroups are events about KV cache groups other than 0 (hybrid
	// models' sliding-window layers), not indexed.
	OtherGroups int
}

func (a *Applied) add(b Applied) {
	a.Events += b.Events
	a.Stored += b.Stored
	a.Removed += b.Removed
	a.Cleared += b.Cleared
	a.Unresolved += b.Unresolved
	a.UnknownRemoved += b.UnknownRemoved
	a.Evicted += b.Evicted
	a.OtherGroups += b.OtherGroups
}

// ErrRank: a batch names a data-parallel rank outside [0, MaxRanks); the
// view cannot apply it and must be cleared.
var ErrRank = errors.New("kvindex: data-parallel rank out of range")

// Apply applies one batch of worker id's events at now, in order, and
// clears any expectation of events (Expect). A worker with no view
// (Watch) applies nothing. An error means the batch could not be applied
// at all: the view no longer matches the engine and must be cleared.
func (x *Index) Apply(id string, b *Batch, now time.Time) (Applied, error) {
	v := x.workers[id]
	if v == nil {
		return Applied{}, nil
	}
	if b.Rank < 0 || b.Rank >= MaxRanks {
		return Applied{}, fmt.Errorf("%w: %d", ErrRank, b.Rank)
	}
	v.expect, v.silent, v.lastBatch = time.Time{}, false, now
	rv := v.rank(b.Rank)
	var a Applied
	for i := range b.Events {
		ev := &b.Events[i]
		a.Events++
		if ev.Group != 0 && ev.Kind != Cleared {
			a.OtherGroups++
			continue
		}
		switch ev.Kind {
		case Stored:
			x.store(v, &rv, ev, &a)
		case Removed:
			x.remove(v, rv, ev, &a)
		case Cleared:
			x.clearRank(v, rv)
			v.setComplete(rv.rank, true)
			a.Cleared++
		}
	}
	if b.Unknown > 0 { // events the decoder skipped may have stored blocks
		v.setComplete(rv.rank, false)
	}
	if len(rv.byHash) == 0 {
		v.dropRank(rv)
	}
	v.applied.add(a)
	return a, nil
}

// dropRank forgets rv, which holds no block (whether the view knows every
// block of its rank is kept).
func (v *view) dropRank(rv *rankView) {
	v.ranks = slices.DeleteFunc(v.ranks, func(o *rankView) bool { return o == rv })
}

// rank returns v's view of rank r, creating it.
func (v *view) rank(r int) *rankView {
	for _, rv := range v.ranks {
		if rv.rank == r {
			return rv
		}
	}
	rv := newRankView(r)
	v.ranks = append(v.ranks, rv)
	return rv
}

// store applies a Stored event on rv (which a change of block size may
// replace).
func (x *Index) store(v *view, rvp **rankView, ev *Event, a *Applied) {
	n := len(ev.Hashes)
	bs := ev.BlockSize
	if n == 0 {
		return
	}
	if len(ev.Tokens) == 0 {
		x.storeTier(v, *rvp, ev, a)
		return
	}
	if bs < 1 || bs > MaxBlockSize || len(ev.Tokens) != n*bs || ev.Extra != nil && len(ev.Extra) != n {
		v.unresolved(*rvp, n, a)
		return
	}
	if v.blockSize != bs && v.blockSize != 0 && ev.Medium != GPU {
		// Blocks of another size in another tier (a connector's own block
		// size): not indexed. Only the GPU's size is the engine's.
		v.unresolved(*rvp, n, a)
		return
	}
	if v.blockSize != bs {
		if v.blockSize != 0 && v.n > 0 {
			// Blocks of another size: another engine configuration,
			// maybe another hashing.
			rank := (*rvp).rank
			*v = view{state: v.state, applied: v.applied, lastBatch: v.lastBatch}
			*rvp = v.rank(rank)
		} else if v.blockSize != 0 {
			// None held (the size was a pick's guess, or every block is
			// gone): only the speculation goes, keyed at the old size.
			v.spec = speculative{}
		}
		v.blockSize = bs
	}
	rv := *rvp
	var prev uint64
	var lora, salt uint32
	if ev.HasParent {
		p, ok := rv.byHash[ev.Parent]
		if !ok || !v.resolves(rv.rank) {
			v.unresolved(rv, n, a)
			return
		}
		pe := &rv.ents[p]
		if pe.lora != tag(ev.LoRA) || ev.Salt != "" && pe.salt != tag(ev.Salt) {
			v.unresolved(rv, n, a)
			return
		}
		prev, lora, salt = pe.key, pe.lora, pe.salt
	} else {
		prev, lora, salt = Root(ev.LoRA, ev.Salt), tag(ev.LoRA), tag(ev.Salt)
	}
	bit := uint8(1) << ev.Medium
	for i, h := range ev.Hashes {
		var extra uint64
		if ev.Extra != nil {
			extra = ev.Extra[i]
		}
		prev, x.buf = chain(x.buf, prev, extra, ev.Tokens[i*bs:(i+1)*bs])
		a.Evicted += x.insert(v, rv, prev, h, bit, lora, salt)
		v.spec.confirm(prev)
	}
	a.Stored += n
}

// storeTier applies a Stored event without tokens, as vLLM's
// OffloadingConnector names the blocks it copied from the GPU to the CPU:
// each block held under one of its hashes (where hashes resolve, and the
// namespace the event names, if any, is the block's) is held in the
// event's tier too; the others are Unresolved.
func (x *Index) storeTier(v *view, rv *rankView, ev *Event, a *Applied) {
	bit := uint8(1) << ev.Medium
	for _, h := range ev.Hashes {
		s, ok := rv.byHash[h]
		if !ok || !v.resolves(rv.rank) {
			v.unresolved(rv, 1, a)
			continue
		}
		e := &rv.ents[s]
		if ev.LoRA != "" && e.lora != tag(ev.LoRA) || ev.Salt != "" && e.salt != tag(ev.Salt) {
			v.unresolved(rv, 1, a)
			continue
		}
		if e.media&bit == 0 {
			e.media |= bit
			v.countMedia(bit, 1)
		}
		rv.toNewest(s, v.tick())
		a.Stored++
	}
}

// unresolved counts n stored blocks of rv left out: the engine holds them
// and the view does not, so it no longer knows every block of the rank.
func (v *view) unresolved(rv *rankView, n int, a *Applied) {
	a.Unresolved += n
	v.setComplete(rv.rank, false)
}

// insert records block key (engine hash h) in tier bit on rv; it returns
// how many blocks it evicted to stay within MaxBlocks.
func (x *Index) insert(v *view, rv *rankView, key, h uint64, bit uint8, lora, salt uint32) int {
	if s, ok := rv.byHash[h]; ok {
		e := &rv.ents[s]
		if e.key == key && e.lora == lora && e.salt == salt {
			if e.media&bit == 0 {
				e.media |= bit
				v.countMedia(bit, 1)
			}
			rv.toNewest(s, v.tick())
			return 0
		}
		// The engine names another block with a hash it named one with
		// (older SGLang names equal tokens alike after any prefix and
		// under any salt): the old block is replaced, though the engine
		// may hold both, and from now on a hash may name either.
		x.drop(v, rv, s)
		v.unchained = true
		v.setComplete(rv.rank, false)
	}
	if s, ok := rv.byKey[key]; ok {
		// The same block under another engine hash: keep the newest name.
		// The engine may still hold the other one: the view no longer
		// knows every block of the rank.
		x.drop(v, rv, s)
		v.setComplete(rv.rank, false)
	}
	evicted := 0
	for v.n >= x.cfg.MaxBlocks {
		if !x.evictOldest(v, rv) {
			break
		}
		evicted++
	}
	s := rv.alloc()
	rv.ents[s] = entry{key: key, hash: h, lora: lora, salt: salt, media: bit, newer: -1, older: -1}
	rv.byKey[key], rv.byHash[h] = s, s
	rv.pushNewest(s, v.tick())
	v.n++
	v.countMedia(bit, 1)
	return evicted
}

// remove applies a Removed event on rv: each block leaves the event's
// tier, and the view once it is in none.
func (x *Index) remove(v *view, rv *rankView, ev *Event, a *Applied) {
	bit := uint8(1) << ev.Medium
	for _, h := range ev.Hashes {
		s, ok := rv.byHash[h]
		if !ok {
			a.UnknownRemoved++
			continue
		}
		e := &rv.ents[s]
		if e.media&bit == 0 {
			a.UnknownRemoved++
			continue
		}
		a.Removed++
		e.media &^= bit
		v.countMedia(bit, -1)
		if e.media == 0 {
			x.drop(v, rv, s)
		}
	}
}

// clearRank forgets every block of rv (AllBlocksCleared: the engine's rank
// holds none).
func (x *Index) clearRank(v *view, rv *rankView) {
	for s := rv.newest; s >= 0; s = rv.ents[s].older {
		v.n--
		v.countMedia(rv.ents[s].media, -1)
	}
	*rv = *newRankView(rv.rank)
}

// drop forgets entry s of rv; rv gives back its room when it holds under
// a quarter of the most it held (compact), so entries move: the caller
// holds no index into rv.ents across it.
func (x *Index) drop(v *view, rv *rankView, s int32) {
	e := &rv.ents[s]
	delete(rv.byKey, e.key)
	delete(rv.byHash, e.hash)
	v.countMedia(e.media, -1)
	v.n--
	rv.unlink(s)
	*e = entry{newer: -1, older: -1}
	rv.free = append(rv.free, s)
	if len(rv.ents) > minCompact && len(rv.byHash) < len(rv.ents)/4 {
		rv.compact()
	}
}

// compact moves rv's blocks into maps and a list made for as many,
// keeping their order: Go maps do not shrink, nor does a slice. Its cost,
// in the blocks held, is less than a third of the drops since the rank
// held the most.
func (rv *rankView) compact() {
	n := len(rv.byHash)
	ents := make([]entry, 0, n)
	byKey, byHash := make(map[uint64]int32, n), make(map[uint64]int32, n)
	for s := rv.oldest; s >= 0; s = rv.ents[s].newer {
		e := rv.ents[s]
		i := int32(len(ents))
		e.older, e.newer = i-1, -1
		if i > 0 {
			ents[i-1].newer = i
		}
		ents = append(ents, e)
		byKey[e.key], byHash[e.hash] = i, i
	}
	rv.ents, rv.byKey, rv.byHash, rv.free = ents, byKey, byHash, nil
	rv.oldest, rv.newest = -1, -1
	if n > 0 {
		rv.oldest, rv.newest = 0, int32(n-1)
	}
}

// evictOldest forgets the worker's oldest block, whatever its rank (each
// rank's oldest compared by stamp), and reports whether there was one.
// Its rank no longer knows every block its engine holds; a rank other
// than storing (the one storing a block) left with none is forgotten.
func (x *Index) evictOldest(v *view, storing *rankView) bool {
	var from *rankView
	for _, o := range v.ranks {
		if o.oldest >= 0 && (from == nil || o.ents[o.oldest].stamp < from.ents[from.oldest].stamp) {
			from = o
		}
	}
	if from == nil {
		return false
	}
	x.drop(v, from, from.oldest)
	v.setComplete(from.rank, false)
	if from != storing && len(from.byHash) == 0 {
		v.dropRank(from)
	}
	return true
}

// countMedia adds d to the count of every tier in bits.
func (v *view) countMedia(bits uint8, d int) {
	for m := range NumMedia {
		if bits&(1<<m) != 0 {
			v.media[m] += d
		}
	}
}

func (rv *rankView) alloc() int32 {
	if k := len(rv.free); k > 0 {
		s := rv.free[k-1]
		rv.free = rv.free[:k-1]
		return s
	}
	rv.ents = append(rv.ents, entry{})
	return int32(len(rv.ents) - 1)
}

// pushNewest puts entry s first on rv's list, stamped stamp.
func (rv *rankView) pushNewest(s int32, stamp uint32) {
	e := &rv.ents[s]
	e.newer, e.older, e.stamp = -1, rv.newest, stamp
	if rv.newest >= 0 {
		rv.ents[rv.newest].newer = s
	}
	rv.newest = s
	if rv.oldest < 0 {
		rv.oldest = s
	}
}

func (rv *rankView) unlink(s int32) {
	e := &rv.ents[s]
	if e.newer >= 0 {
		rv.ents[e.newer].older = e.older
	} else {
		rv.newest = e.older
	}
	if e.older >= 0 {
		rv.ents[e.older].newer = e.newer
	} else {
		rv.oldest = e.newer
	}
	e.newer, e.older = -1, -1
}

// toNewest moves entry s first on rv's list, stamped stamp.
func (rv *rankView) toNewest(s int32, stamp uint32) {
	if rv.newest == s {
		rv.ents[s].stamp = stamp
		return
	}
	rv.unlink(s)
	rv.pushNewest(s, stamp)
}

// weight is the weight of a block held in tiers bits: its best tier's.
func (x *Index) weight(bits uint8) float64 {
	for m := range NumMedia {
		if bits&(1<<m) != 0 {
			return x.cfg.Weights[m]
		}
	}
	return 0
}

// Match is worker id's longest held prefix of keys (Keys at its block
// size) at now: Tokens weighs each of its blocks' tokens by the block's
// best tier (a speculative block as GPU), Blocks counts them. With several
// data-parallel ranks it is the best rank's. It does not look at the
// view's State (see Usable).
type Match struct {
	Tokens float64
	Blocks int
	// Speculative is how many of Blocks are held only speculatively.
	Speculative int
}

// Match returns worker id's match of keys at now.
func (x *Index) Match(id string, keys []uint64, now time.Time) Match {
	v := x.workers[id]
	if v == nil || v.blockSize == 0 && v.spec.len() == 0 || len(keys) == 0 {
		return Match{}
	}
	bs := v.blockSize
	var best Match
	ranks := v.ranks
	if len(ranks) == 0 {
		ranks = []*rankView{nil}
	}
	for _, rv := range ranks {
		var m Match
		var w float64
		for _, k := range keys {
			if rv != nil {
				if s, ok := rv.byKey[k]; ok {
					w += x.weight(rv.ents[s].media)
					m.Blocks++
					continue
				}
			}
			if v.spec.holds(k, now) {
				w += x.cfg.Weights[GPU]
				m.Blocks++
				m.Speculative++
				continue
			}
			break
		}
		m.Tokens = w * float64(bs)
		if m.Tokens > best.Tokens || m.Tokens == best.Tokens && m.Blocks > best.Blocks {
			best = m
		}
	}
	return best
}

// Holds reports how many of keys, from the first, worker id holds for
// certain (in any rank and tier, speculation aside).
func (x *Index) Holds(id string, keys []uint64) int {
	if v := x.workers[id]; v != nil {
		return v.holds(keys)
	}
	return 0
}

// holds is Holds of v: its best rank's.
func (v *view) holds(keys []uint64) int {
	best := 0
	for _, rv := range v.ranks {
		n := 0
		for _, k := range keys {
			if _, ok := rv.byKey[k]; !ok {
				break
			}
			n++
		}
		best = max(best, n)
	}
	return best
}

// Speculate holds keys on worker id for SpeculativeTTL from now: a pick
// sent the prompt there, and its events will say so soon. Keys it holds
// already are left alone. It counts for Match only, with the blocks'
// size being the worker's (a worker whose block size is not known yet
// takes blockSize).
func (x *Index) Speculate(id string, keys []uint64, blockSize int, now time.Time) {
	v := x.workers[id]
	if v == nil || len(keys) == 0 {
		return
	}
	if v.blockSize == 0 {
		v.blockSize = blockSize
	}
	held := v.holds(keys)
	exp := now.Add(x.cfg.SpeculativeTTL)
	for _, k := range keys[held:] {
		v.spec.add(k, exp, now, x.cfg.MaxSpeculative)
	}
}

// speculative is a worker's blocks held speculatively, each until its
// expiry, with a FIFO of them to expire and bound them.
type speculative struct {
	until map[uint64]time.Time
	fifo  []specItem
	head  int
}

type specItem struct {
	key uint64
	exp time.Time
}

func (s *speculative) len() int { return len(s.until) }

func (s *speculative) holds(k uint64, now time.Time) bool {
	exp, ok := s.until[k]
	return ok && now.Before(exp)
}

// add holds k until exp, dropping what expired by now and, beyond max,
// the oldest.
func (s *speculative) add(k uint64, exp, now time.Time, limit int) {
	if s.until == nil {
		s.until = map[uint64]time.Time{}
	}
	if e, ok := s.until[k]; ok && e.Equal(exp) {
		return // held already until then (a key repeated in one pick, or one batch)
	}
	for s.head < len(s.fifo) {
		it := s.fifo[s.head]
		// Past the limit, or past twice as many items (keys held again
		// later leave their earlier items behind), the oldest goes.
		if now.Before(it.exp) && len(s.until) < limit && len(s.fifo)-s.head < 2*limit {
			break
		}
		if e, ok := s.until[it.key]; ok && e.Equal(it.exp) {
			delete(s.until, it.key)
		}
		s.head++
	}
	if s.head > len(s.fifo)/2 {
		s.fifo = append(s.fifo[:0], s.fifo[s.head:]...)
		s.head = 0
	}
	s.until[k] = exp
	s.fifo = append(s.fifo, specItem{k, exp})
}

// confirm drops k: the engine's events hold it now.
func (s *speculative) confirm(k uint64) {
	if s.until != nil {
		delete(s.until, k)
	}
}

// Stats is one worker's view as the admin API and metrics show it.
type Stats struct {
	State State
	// Blocks are the blocks held, every rank; ByMedium counts them per tier
	// (a block in two tiers in both).
	Blocks   int
	ByMedium [NumMedia]int
	// Speculative are the blocks held speculatively (expired ones
	// included until they are dropped).
	Speculative int
	BlockSize   int
	// Ranks are the data-parallel ranks holding blocks.
	Ranks int
	// LastBatch is when the last batch was applied (zero: none yet).
	LastBatch time.Time
	// Applied totals what every batch did.
	Applied Applied
}

// Stats returns worker id's view at now; ok is false when it has none.
func (x *Index) Stats(id string, now time.Time) (Stats, bool) {
	v := x.workers[id]
	if v == nil {
		return Stats{}, false
	}
	return Stats{State: x.State(id, now), Blocks: v.n, ByMedium: v.media, Speculative: v.spec.len(),
		BlockSize: v.blockSize, Ranks: len(v.ranks), LastBatch: v.lastBatch, Applied: v.applied}, true
}

// Workers calls fn for every worker with a view.
func (x *Index) Workers(fn func(id string)) {
	for id := range x.workers {
		fn(id)
	}
}
