// Package prefixindex is the gateway's approximate picture of what each
// engine holds in its prefix (KV) cache, built from the prompts the gateway
// sent it and it began to answer. A rendered prompt is cut into fixed-size chunks of bytes, each
// named by the hash of the whole prompt up to its end (a chained hash: two
// prompts share a chunk hash only if they share everything before it). Per
// model it records which workers were recently sent which chunks; each
// worker's share is bounded by an estimate of its KV capacity
// (kv_total_blocks × kv_block_tokens × bytes per token, in chunks), the
// least recently sent chunks going first. A lookup walks the prompt's
// chunks once and reports, for every worker holding any of them, the
// length of its longest cached prefix: its cost is linear in the prompt's
// chunks (and in the fleet only by one bit per worker and chunk, 64 workers
// to a machine word), never a scan of the workers.
//
// What other gateway replicas report they sent (RecordPeer) is kept in a
// second share per worker, bounded alike and evicted on its own: what a
// peer reports can never push out what the gateway recorded itself.
//
// An Index holds no actor and does no I/O; it is not safe for concurrent
// use (the router actor owns it).
package prefixindex

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// Defaults of Config.
const (
	// DefaultChunkBytes is about two 16-token KV blocks of English text:
	// half the hashing, lookups and memory of one block a chunk, for a
	// matched length rounded down to 32 tokens rather than 16.
	DefaultChunkBytes = 128
	// DefaultBytesPerToken is the usual 4 bytes of English text per token
	// (under common BPE tokenizers): the gateway's one figure for it, used
	// wherever a byte count stands for tokens.
	DefaultBytesPerToken = 4
	// DefaultCapacityTokens bounds a worker that reports no KV figures.
	DefaultCapacityTokens = 65536
	// MaxCapacityChunks caps any worker's share, whatever KV it reports
	// (about 8 million tokens of KV at the default chunking; some 44 MiB
	// of index at BytesPerChunk).
	MaxCapacityChunks = 1 << 18
	// DefaultMaxRequestShare is the share of a worker's index one prompt
	// may take: half, so that no one request, however long, pushes out
	// everything the others left there.
	DefaultMaxRequestShare = 0.5
	// defaultBlockTokens is assumed when a worker reports kv_total_blocks
	// but no kv_block_tokens (the reference engine's and vLLM's default).
	defaultBlockTokens = 16
)

// ErrConfig is wrapped by the errors of an invalid Config.
var ErrConfig = errors.New("prefixindex: invalid config")

// Config sets the chunking and the capacity estimate.
type Config struct {
	// ChunkBytes is the chunk size in bytes of the rendered prompt (> 0).
	ChunkBytes int
	// BytesPerToken converts bytes to tokens (> 0): prompt and matched
	// lengths in tokens, and KV capacity in bytes.
	BytesPerToken float64
	// MaxRequestShare is the share of a worker's capacity one recorded
	// prompt may take (in (0, 1]): a longer prompt is recorded up to that
	// many leading chunks, the ones a later prompt can match.
	MaxRequestShare float64
}

// Validate reports a config that cannot be used, naming the field.
func (c Config) Validate() error {
	if c.ChunkBytes < 1 {
		return fmt.Errorf("%w: chunk bytes %d must be positive", ErrConfig, c.ChunkBytes)
	}
	if !(c.BytesPerToken > 0) || math.IsInf(c.BytesPerToken, 0) {
		return fmt.Errorf("%w: bytes per token %v must be positive", ErrConfig, c.BytesPerToken)
	}
	if !(c.MaxRequestShare > 0 && c.MaxRequestShare <= 1) {
		return fmt.Errorf("%w: max request share %v must be in (0, 1]", ErrConfig, c.MaxRequestShare)
	}
	return nil
}

// Index is the prefix index of every model.
type Index struct {
	cfg     Config
	models  map[string]*model
	workers map[string]*worker
	free    *node // recycled nodes, linked through next
	q       Query // scratch of the last lookup
}

// New returns an empty index; an invalid cfg is replaced field by field
// by the defaults.
func New(cfg Config) *Index {
	if cfg.ChunkBytes < 1 {
		cfg.ChunkBytes = DefaultChunkBytes
	}
	if !(cfg.BytesPerToken > 0) || math.IsInf(cfg.BytesPerToken, 0) {
		cfg.BytesPerToken = DefaultBytesPerToken
	}
	if !(cfg.MaxRequestShare > 0 && cfg.MaxRequestShare <= 1) {
		cfg.MaxRequestShare = DefaultMaxRequestShare
	}
	return &Index{cfg: cfg, models: map[string]*model{}, workers: map[string]*worker{}}
}

// Config returns the index's (defaulted) config.
func (x *Index) Config() Config { return x.cfg }

// model is one model's chunks and worker slots.
type model struct {
	chunks map[uint64]*entry
	slots  []*worker // slot -> worker; nil when free
	free   []int     // free slots, reused smallest last
}

// entry is one chunk hash: the workers holding it, as a bitmask over the
// model's slots and their LRU nodes in slot order.
type entry struct {
	hash  uint64
	mask  []uint64
	nodes []*node // len == popcount(mask), ordered by slot
}

// node is one (chunk, worker) pair on one of the worker's LRU lists: its
// own (Record) or its peers' (RecordPeer).
type node struct {
	e          *entry
	w          *worker
	prev, next *node
	peer       bool
}

// worker is what the index knows of one worker.
type worker struct {
	id        string
	model     string
	slot      int
	capacity  int  // chunks, of each share
	n         int  // chunks held of its own
	lru       node // its own chunks, most recent first
	pn        int  // chunks held that peers reported
	plru      node // the peers' chunks, most recent first
	startedAt time.Time
	kvTotal   int
}

// Chunks returns the number of whole chunks of a prompt of n bytes.
func (x *Index) Chunks(n int) int { return n / x.cfg.ChunkBytes }

// Tokens converts bytes of prompt to estimated tokens (rounded down).
func (x *Index) Tokens(n int) int { return int(float64(n) / x.cfg.BytesPerToken) }

// Hashes appends to dst the chained hashes of prompt's whole chunks: the
// i-th covers prompt[:(i+1)·ChunkBytes], as the xxhash of chunk i mixed
// with the (i-1)-th. A trailing partial chunk has no hash (engines cache
// whole blocks only).
func (x *Index) Hashes(dst []uint64, prompt string) []uint64 {
	return x.HashesIn(dst, "", prompt)
}

// rootHash starts every chain of the empty namespace.
const rootHash = uint64(0x9e3779b97f4a7c15)

// HashesIn is Hashes in namespace ns: a non-empty namespace (a LoRA
// adapter, a cache salt) starts the chain from its own hash, so no chunk
// of one namespace is ever a chunk of another or of the empty one.
func (x *Index) HashesIn(dst []uint64, ns, prompt string) []uint64 {
	cb := x.cfg.ChunkBytes
	prev := rootHash
	if ns != "" {
		prev = chain(rootHash, xxhash.Sum64String(ns)^0x5bd1e9955bd1e995)
	}
	for end := cb; end <= len(prompt); end += cb {
		prev = chain(prev, xxhash.Sum64String(prompt[end-cb:end]))
		dst = append(dst, prev)
	}
	return dst
}

// chain mixes a chunk's hash into its prefix's (splitmix64's finalizer over
// both, so the order matters and equal chunks after different prefixes
// differ).
func chain(prev, h uint64) uint64 {
	z := prev*0xbf58476d1ce4e5b9 ^ h
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// Capacity is the number of chunks a worker's KV cache is estimated to
// hold: kv_total_blocks × kv_block_tokens × bytes per token / chunk bytes
// (kv_block_tokens 16 when unreported; DefaultCapacityTokens when the
// worker reports no kv_total_blocks), at least one chunk and at most
// MaxCapacityChunks.
func (x *Index) Capacity(w *fleet.Worker) int {
	tokens := float64(DefaultCapacityTokens)
	if w.KVTotalBlocks > 0 {
		bt := w.KVBlockTokens
		if bt <= 0 {
			bt = defaultBlockTokens
		}
		tokens = float64(w.KVTotalBlocks) * float64(bt)
	}
	chunks := tokens * x.cfg.BytesPerToken / float64(x.cfg.ChunkBytes)
	return int(max(1, min(chunks, MaxCapacityChunks)))
}

// Observe records a worker's new snapshot. A worker that changed model,
// restarted (its started_at changed) or whose KV was rebuilt (its
// kv_total_blocks changed, to zero included) loses its entries: whatever
// its cache held is gone. Its capacity follows the snapshot; a smaller one
// evicts the least recently sent chunks at once.
//
// A worker reporting every block free is not taken as empty: engines count
// cached blocks that no sequence uses as free, so an idle engine with a
// warm cache reports the same.
func (x *Index) Observe(fw fleet.Worker) {
	w := x.workers[fw.ID]
	if w != nil && (w.model != fw.Model || !w.startedAt.Equal(fw.StartedAt) || w.kvTotal != fw.KVTotalBlocks) {
		x.Forget(fw.ID)
		w = nil
	}
	if w == nil {
		m := x.models[fw.Model]
		if m == nil {
			m = &model{chunks: map[uint64]*entry{}}
			x.models[fw.Model] = m
		}
		w = &worker{id: fw.ID, model: fw.Model}
		w.lru.prev, w.lru.next = &w.lru, &w.lru
		w.plru.prev, w.plru.next = &w.plru, &w.plru
		if k := len(m.free); k > 0 {
			w.slot = m.free[k-1]
			m.free = m.free[:k-1]
			m.slots[w.slot] = w
		} else {
			w.slot = len(m.slots)
			m.slots = append(m.slots, w)
		}
		x.workers[fw.ID] = w
	}
	w.startedAt, w.kvTotal = fw.StartedAt, fw.KVTotalBlocks
	w.capacity = x.Capacity(&fw)
	x.trim(w)
}

// Forget drops a worker and every entry it holds (evicted, restarted).
func (x *Index) Forget(id string) {
	w := x.workers[id]
	if w == nil {
		return
	}
	m := x.models[w.model]
	for w.lru.next != &w.lru {
		x.evict(m, w.lru.prev)
	}
	for w.plru.next != &w.plru {
		x.evict(m, w.plru.prev)
	}
	m.slots[w.slot] = nil
	m.free = append(m.free, w.slot)
	// Keep the smallest free slot last so slots stay dense.
	slices.SortFunc(m.free, func(a, b int) int { return b - a })
	delete(x.workers, id)
	if len(x.workers) == 0 || m.empty() {
		delete(x.models, w.model)
	}
}

// entry returns the entry of chunk hash h, added empty if new.
func (m *model) entry(h uint64) *entry {
	e := m.chunks[h]
	if e == nil {
		e = &entry{hash: h}
		m.chunks[h] = e
	}
	return e
}

func (m *model) empty() bool {
	for _, w := range m.slots {
		if w != nil {
			return false
		}
	}
	return true
}

// Retain forgets every worker for which keep returns false.
func (x *Index) Retain(keep func(id string) bool) {
	for id := range x.workers {
		if !keep(id) {
			x.Forget(id)
		}
	}
}

// Slot returns the worker's slot in its model, for Query.ChunksAt: stable
// until the worker is forgotten (an Observe that forgets it may give it
// another). ok is false for an unknown worker.
func (x *Index) Slot(id string) (slot int, ok bool) {
	if w := x.workers[id]; w != nil {
		return w.slot, true
	}
	return -1, false
}

// WorkerStats is one worker's share of the index.
type WorkerStats struct {
	Chunks   int // chunks held, its own and its peers'
	Capacity int // chunks allowed in each share
	// PeerChunks is the part of Chunks that peers reported.
	PeerChunks int
	// Bytes estimates the memory the worker's chunks cost the index.
	Bytes int
}

// BytesPerChunk estimates the index's memory per (chunk, worker) pair: the
// LRU node (48 bytes allocated), its place in the entry's node slice (8),
// and the entry with its map slot, one mask word and slice headers (about
// 112), counted whole as if no other worker shared it. Sharing lowers it;
// a model with more than 64 workers adds 8 bytes of mask per 64 to the
// entries its higher slots hold. TestPrefixIndexBoundedPerWorker measures
// it.
const BytesPerChunk = 48 + 8 + 112

// Stats reports a worker's share; ok is false for an unknown worker.
func (x *Index) Stats(id string) (s WorkerStats, ok bool) {
	w := x.workers[id]
	if w == nil {
		return WorkerStats{}, false
	}
	n := w.n + w.pn
	return WorkerStats{Chunks: n, Capacity: w.capacity, PeerChunks: w.pn, Bytes: n * BytesPerChunk}, true
}

// Hit is one worker's longest cached prefix of a looked-up prompt.
type Hit struct {
	ID     string
	Chunks int
}

// Query is the outcome of a lookup. It is scratch space of the index,
// valid until the next Lookup.
type Query struct {
	model   string
	bytes   int
	hashes  []uint64 // scratch's, or a memo's
	scratch PromptHashes
	entries []*entry // entries of hashes[:len(entries)], present at lookup
	hits    []Hit
	seen    []uint64
	depth   []int // by slot: the hits
}

// Hits lists every worker holding a prefix of the prompt, with its length
// in chunks, in no particular order.
func (q *Query) Hits() []Hit { return q.hits }

// ChunksAt returns the longest prefix, in chunks, held by the worker in
// slot (see Slot): a hit's Chunks without looking its id up.
func (q *Query) ChunksAt(slot int) int {
	if slot < 0 || slot >= len(q.depth) {
		return 0
	}
	return q.depth[slot]
}

// Hashes are the looked-up prompt's chunk hashes (see Index.Hashes), valid
// until the next Lookup.
func (q *Query) Hashes() []uint64 { return q.hashes }

// PromptBytes is the looked-up prompt's length.
func (q *Query) PromptBytes() int { return q.bytes }

// Lookup cuts prompt into chunks and finds, for every worker of model,
// its longest prefix of them in the index. The result is valid until the
// next Lookup.
func (x *Index) Lookup(modelID, prompt string) *Query { return x.LookupIn(modelID, "", prompt) }

// LookupIn is Lookup in namespace ns (see HashesIn): only prompts
// recorded in the same namespace match, so two LoRA adapters of one base
// model, or two cache salts, never share entries.
func (x *Index) LookupIn(modelID, ns, prompt string) *Query {
	return x.LookupHashed(modelID, ns, prompt, nil)
}

// PromptHashes keeps one prompt's chunk hashes between lookups of it, so
// that a prompt looked up again (a request's failover retries and cascade
// steps, its turns in a dispatch scan of the queue) is hashed once: per
// namespace, the last one it was looked up in. The zero value holds none.
// It belongs to the one prompt it is first used with; it is not safe for
// concurrent use.
type PromptHashes struct {
	ns     string
	chunk  int // the index's ChunkBytes when hashed; 0: none held
	hashes []uint64
	runs   int
}

// Runs is how many times a prompt was hashed into p.
func (p *PromptHashes) Runs() int { return p.runs }

// in returns the hashes of prompt in namespace ns, hashing it unless p
// holds them.
func (p *PromptHashes) in(x *Index, ns, prompt string) []uint64 {
	if p.chunk != x.cfg.ChunkBytes || p.ns != ns {
		p.hashes = x.HashesIn(slices.Grow(p.hashes[:0], x.Chunks(len(prompt))), ns, prompt)
		p.ns, p.chunk = ns, x.cfg.ChunkBytes
		p.runs++
	}
	return p.hashes
}

// LookupHashed is LookupIn with prompt's hashes kept in memo (see
// PromptHashes); a nil memo hashes the prompt again.
func (x *Index) LookupHashed(modelID, ns, prompt string, memo *PromptHashes) *Query {
	q := &x.q
	q.model, q.bytes = modelID, len(prompt)
	if memo == nil {
		memo = &q.scratch
		memo.chunk = 0
	}
	q.hashes = memo.in(x, ns, prompt)
	q.entries, q.hits, q.depth = q.entries[:0], q.hits[:0], q.depth[:0]
	m := x.models[modelID]
	if m == nil {
		return q
	}
	q.depth = slices.Grow(q.depth, len(m.slots))[:len(m.slots)]
	clear(q.depth)
	for _, h := range q.hashes {
		e := m.chunks[h]
		if e == nil {
			break
		}
		q.entries = append(q.entries, e)
	}
	// Deepest first: a worker's longest prefix is the deepest entry that
	// holds it.
	words := (len(m.slots) + 63) / 64
	q.seen = slices.Grow(q.seen[:0], words)[:words]
	clear(q.seen)
	for i := len(q.entries) - 1; i >= 0; i-- {
		for wi, bitsw := range q.entries[i].mask {
			fresh := bitsw &^ q.seen[wi]
			q.seen[wi] |= bitsw
			for fresh != 0 {
				b := bits.TrailingZeros64(fresh)
				fresh &= fresh - 1
				q.hits = append(q.hits, Hit{ID: m.slots[wi*64+b].id, Chunks: i + 1})
				q.depth[wi*64+b] = i + 1
			}
		}
	}
	return q
}

// Errors of RecordHashes and RecordPeer: the prompt is not recorded.
var (
	// ErrUnknownWorker: the worker is not observed.
	ErrUnknownWorker = errors.New("prefixindex: unknown worker")
	// ErrOtherModel: the worker serves another model.
	ErrOtherModel = errors.New("prefixindex: the worker serves another model")
)

// Record notes that the prompt of q, the last lookup, was sent to worker
// id: RecordHashes of its hashes under its model, the error dropped.
func (x *Index) Record(q *Query, id string) {
	_ = x.RecordHashes(q.model, id, q.hashes)
}

// RecordHashes notes that a prompt with the chained chunk hashes hashes
// (Hashes' form, first chunk first) was sent to worker id of model, and
// the worker began to answer it: every chunk of it becomes the worker's
// most recent, the first chunk most recent of all (so a prefix outlives
// its continuations), and the worker's least recent chunks beyond its
// capacity are dropped. Only the leading MaxRequestShare of the worker's
// capacity is recorded. It fails, recording nothing, for a worker not
// observed or of another model.
func (x *Index) RecordHashes(modelID, id string, hashes []uint64) error {
	return x.record(modelID, id, hashes, false)
}

// RecordPeer is RecordHashes for a prompt another replica sent, in the
// worker's peer share: beyond the worker's capacity the peers' least
// recent chunks are dropped, never the gateway's own, and a chunk the
// gateway recorded itself stays in its own share where it was.
func (x *Index) RecordPeer(modelID, id string, hashes []uint64) error {
	return x.record(modelID, id, hashes, true)
}

// ImportPeer records the chunks another replica exported for worker id of
// model (Export's list, most recent first, gathered from many prompts) in
// the worker's peer share: every chunk, up to the worker's capacity, with
// the same recency; a chunk the gateway recorded itself stays in its own
// share where it was. Unlike RecordPeer it takes no one prompt's share and
// does not stop at the first chunk the gateway holds (the list is not one
// prompt's chain), so a warm index takes a peer's whole view too.
func (x *Index) ImportPeer(modelID, id string, hashes []uint64) error {
	w, err := x.recordable(modelID, id)
	if err != nil {
		return err
	}
	hashes = hashes[:min(len(hashes), w.capacity)]
	m := x.models[modelID]
	for i := len(hashes) - 1; i >= 0; i-- {
		x.touch(m.entry(hashes[i]), w, true)
	}
	x.trim(w)
	return nil
}

// record is RecordHashes (peer false) and RecordPeer (peer true). A peer's
// prompt is recorded down to the deepest chunk the gateway holds itself
// on the worker, and no further: the gateway's own share of a worker is
// closed under prefixes, so every chunk before that one is held as well,
// and a peer leaves such chunks where they are. The share is closed
// because a chained hash names its whole prefix (every prompt holding a
// chunk holds those before it), a prompt's leading chunks are recorded
// (never a middle part) with the deepest touched first (so each chunk's
// predecessors are touched after it), a share gives up its least recent
// chunks first, and peers' touches never move the gateway's own chunks.
func (x *Index) record(modelID, id string, hashes []uint64, peer bool) error {
	w, err := x.recordable(modelID, id)
	if err != nil || len(hashes) == 0 {
		return err
	}
	hashes = hashes[:min(len(hashes), x.requestShare(w))]
	m := x.models[modelID]
	for i := len(hashes) - 1; i >= 0; i-- {
		if !x.touch(m.entry(hashes[i]), w, peer) {
			break // a peer's chunk the gateway holds itself: so are those before it
		}
	}
	x.trim(w)
	return nil
}

// recordable returns worker id when prompts of modelID may be recorded on
// it: it is observed and serves that model.
func (x *Index) recordable(modelID, id string) (*worker, error) {
	w := x.workers[id]
	switch {
	case w == nil:
		return nil, fmt.Errorf("%w %q", ErrUnknownWorker, id)
	case w.model != modelID:
		return nil, fmt.Errorf("%w: %q serves %q, not %q", ErrOtherModel, id, w.model, modelID)
	}
	return w, nil
}

// requestShare is the most chunks one prompt may take of w's share.
func (x *Index) requestShare(w *worker) int {
	return max(1, int(float64(w.capacity)*x.cfg.MaxRequestShare))
}

// RequestShare is the most chunks RecordHashes records of one prompt on
// worker id (0 for a worker not observed).
func (x *Index) RequestShare(id string) int {
	if w := x.workers[id]; w != nil {
		return x.requestShare(w)
	}
	return 0
}

// touch makes (e, w) w's most recent pair in its own share (peer false)
// or its peers' (peer true), adding it if new. A pair of the worker's own
// share that a peer touches stays where it is (peers never reorder what
// the gateway learnt), and touch reports false for it; one of the peers'
// share the gateway touches moves to its own.
func (x *Index) touch(e *entry, w *worker, peer bool) (touched bool) {
	word, bit := w.slot/64, uint64(1)<<(w.slot%64)
	pos := e.rank(w.slot)
	var n *node
	if word < len(e.mask) && e.mask[word]&bit != 0 {
		n = e.nodes[pos]
		if peer && !n.peer {
			return false
		}
		n.prev.next, n.next.prev = n.next, n.prev
		if n.peer && !peer {
			n.peer = false
			w.pn--
			w.n++
		}
	} else {
		n = x.newNode()
		n.e, n.w, n.peer = e, w, peer
		for len(e.mask) <= word {
			e.mask = append(e.mask, 0)
		}
		e.mask[word] |= bit
		e.nodes = slices.Insert(e.nodes, pos, n)
		if peer {
			w.pn++
		} else {
			w.n++
		}
	}
	head := &w.lru
	if n.peer {
		head = &w.plru
	}
	n.prev, n.next = head, head.next
	head.next.prev = n
	head.next = n
	return true
}

// rank is the number of workers in e below slot: the index of slot's node.
func (e *entry) rank(slot int) int {
	word := slot / 64
	r := 0
	for i := 0; i < word && i < len(e.mask); i++ {
		r += bits.OnesCount64(e.mask[i])
	}
	if word < len(e.mask) {
		r += bits.OnesCount64(e.mask[word] & (uint64(1)<<(slot%64) - 1))
	}
	return r
}

func (x *Index) trim(w *worker) {
	if w.n <= w.capacity && w.pn <= w.capacity {
		return
	}
	m := x.models[w.model]
	for w.n > w.capacity {
		x.evict(m, w.lru.prev)
	}
	for w.pn > w.capacity {
		x.evict(m, w.plru.prev)
	}
}

// evict removes node n (of its worker) from the index.
func (x *Index) evict(m *model, n *node) {
	e, w := n.e, n.w
	n.prev.next, n.next.prev = n.next, n.prev
	pos := e.rank(w.slot)
	e.nodes = slices.Delete(e.nodes, pos, pos+1)
	e.mask[w.slot/64] &^= uint64(1) << (w.slot % 64)
	if n.peer {
		w.pn--
	} else {
		w.n--
	}
	if len(e.nodes) == 0 {
		delete(m.chunks, e.hash)
	}
	*n = node{next: x.free}
	x.free = n
}

func (x *Index) newNode() *node {
	if n := x.free; n != nil {
		x.free = n.next
		n.next = nil
		return n
	}
	return &node{}
}

// Len returns the number of distinct chunks indexed for model.
func (x *Index) Len(modelID string) int {
	if m := x.models[modelID]; m != nil {
		return len(m.chunks)
	}
	return 0
}

// Export calls fn for every worker holding chunks, by model, with at most
// limit of its chunk hashes (AppendWorker's). hashes is scratch, valid
// during the call only.
func (x *Index) Export(limit int, fn func(modelID, id string, hashes []uint64)) {
	var hs []uint64
	for id, w := range x.workers {
		if hs = x.appendWorker(hs[:0], w, limit); len(hs) > 0 {
			fn(w.model, id, hs)
		}
	}
}

// Sizes calls fn for every worker holding chunks: its model and the
// chunks it holds, its own and its peers'.
func (x *Index) Sizes(fn func(modelID, id string, chunks int)) {
	for id, w := range x.workers {
		if n := w.n + w.pn; n > 0 {
			fn(w.model, id, n)
		}
	}
}

// AppendWorker appends to dst at most limit of worker id's chunk hashes:
// its own share first, then its peers', most recent first in each
// (ImportPeer of them rebuilds the same recency). It returns the worker's
// model ("" and dst for a worker not observed).
func (x *Index) AppendWorker(dst []uint64, id string, limit int) (modelID string, hashes []uint64) {
	w := x.workers[id]
	if w == nil {
		return "", dst
	}
	return w.model, x.appendWorker(dst, w, limit)
}

func (x *Index) appendWorker(dst []uint64, w *worker, limit int) []uint64 {
	n := 0
	for _, head := range []*node{&w.lru, &w.plru} {
		for nd := head.next; nd != head && n < limit; nd = nd.next {
			dst = append(dst, nd.e.hash)
			n++
		}
	}
	return dst
}
