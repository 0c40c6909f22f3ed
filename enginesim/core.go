package enginesim

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tlgate/tlgate/enginesim/kvevents"
	kvv1 "github.com/tlgate/tlgate/protos/tl/kv/v1"
)

// Errors of admission and KV handles.
var (
	errTooLarge     = errors.New("enginesim: request needs more KV blocks than the engine has")
	errNoBlocks     = errors.New("enginesim: not enough free KV blocks")
	errHandleExists = errors.New("enginesim: KV handle already held")
	errCoreClosed   = errors.New("enginesim: engine closed")
)

// core is the engine's shared state: the KV block pool with its prefix
// cache, the FCFS queue of sequences waiting for a running slot and blocks,
// the KV handles held for decode, and the counters. It has no I/O, so its
// timers can run in a synctest bubble.
type core struct {
	mu          sync.Mutex
	pool        *blockPool
	maxRunning  int
	running     int
	waiting     list.List // of *admission
	handles     map[string]*handle
	heldBlocks  int
	holdTimeout time.Duration
	closed      bool
	counters    counters
	// awaitingKV counts requests waiting for their prompt's KV from a
	// prefill engine (Stats.WaitingForKV).
	awaitingKV int
	onExpire   func(id string) // called (without the lock) when a hold times out
	onQueued   func()          // called (without the lock) when a sequence starts waiting
	slots      slotTime
	// publish, when set, receives the KV cache events of each locked
	// operation, in order, under the lock (it must not block).
	publish func([]kvevents.Event)
	pending []kvevents.Event
	// hash computes block hashes; sched is the step scheduler (nil in the
	// flat mode).
	hash  *hasher
	sched *stepSched
}

// unlock publishes the KV cache events of the operation ending and
// releases the lock.
func (c *core) unlock() {
	if len(c.pending) > 0 {
		if c.publish != nil {
			c.publish(c.pending)
		}
		c.pending = nil
	}
	c.mu.Unlock()
}

// slotTime integrates the engine's running slots over time: busy is the
// running sequences' time (slot-seconds), stalled the time of free running
// slots while sequences waited (the head of the queue did not fit the free
// KV blocks). Either divided by a span of time is a mean number of slots.
type slotTime struct {
	last          time.Time
	busy, stalled time.Duration
}

// settleLocked adds the time since the last change of the running or
// waiting counts to c.slots; it runs before every such change. On the
// step scheduler the counts are its queues', the time its clock's, and
// sequences wait on KV when the last step's admission stopped at a head
// that did not fit the free blocks (not when they only wait for the next
// step to start).
func (c *core) settleLocked() {
	now, running := time.Now(), c.running
	stalled := c.waiting.Len() > 0
	if s := c.sched; s != nil {
		now, running = s.clock.Now(), len(s.running)
		stalled = s.kvShort && len(s.waiting) > 0
	}
	if !c.slots.last.IsZero() {
		dt := now.Sub(c.slots.last)
		c.slots.busy += dt * time.Duration(running)
		if stalled && running < c.maxRunning {
			c.slots.stalled += dt * time.Duration(c.maxRunning-running)
		}
	}
	c.slots.last = now
}

// counters are the engine's cumulative counts (see Stats).
type counters struct {
	requests, completed, aborted     uint64
	prefixQueries, prefixHits        uint64
	promptTokens, generationTokens   uint64
	finishedLength, finishedStop     uint64
	prefills, pushes, releases       uint64
	handlesReleased, handlesExpired  uint64
	heartbeatsSent, heartbeatsFailed uint64
	heartbeatsSkipped                uint64
	resumes, resumesUnseeded         uint64
	pulls                            uint64
	lastResumeSeed                   uint64
}

func newCore(blocks, maxRunning int, holdTimeout time.Duration) *core {
	c := &core{
		pool:        newBlockPool(blocks),
		maxRunning:  maxRunning,
		handles:     make(map[string]*handle),
		holdTimeout: holdTimeout,
	}
	c.pool.emit = func(ev kvevents.Event) { c.pending = append(c.pending, ev) }
	return c
}

// admission is a request for a running slot and KV blocks.
type admission struct {
	// want are the blocks to acquire: the full prompt blocks (cached and
	// shared) and private ones.
	want blockSet
	// promptLen is the prompt's length, for prefix cache accounting; 0
	// skips the accounting (a resumed handle's prompt is not looked up).
	promptLen int
	// handle, if set, is a taken handle whose blocks the sequence adopts;
	// want.private more blocks are acquired on top.
	handle *handle

	cached int           // prompt tokens found in the prefix cache
	seq    *seq          // set when admitted
	err    error         // set when failed while waiting
	ready  chan struct{} // closed when admitted or failed
	elem   *list.Element
}

// seq is an admitted sequence: it holds a running slot and its blocks until
// finish.
type seq struct {
	blocks blockSet
	cached int
}

// admit waits (FCFS) until a is admitted or ctx ends. It owns a.handle: on
// error the handle's blocks are freed.
func (c *core) admit(ctx context.Context, a *admission) (*seq, error) {
	c.mu.Lock()
	c.settleLocked()
	if c.closed {
		c.dropLocked(a.handle)
		c.unlock()
		return nil, errCoreClosed
	}
	total := a.want.size()
	if a.handle != nil {
		total += a.handle.blocks.size()
	}
	if total > c.pool.total {
		c.dropLocked(a.handle)
		c.unlock()
		return nil, fmt.Errorf("%w: %d blocks needed, %d in the engine", errTooLarge, total, c.pool.total)
	}
	if c.waiting.Len() == 0 && c.tryAdmitLocked(a) {
		c.unlock()
		return a.seq, nil
	}
	a.ready = make(chan struct{})
	a.elem = c.waiting.PushBack(a)
	onQueued := c.onQueued
	c.unlock()
	if onQueued != nil {
		onQueued()
	}

	select {
	case <-a.ready:
		return a.seq, a.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.unlock()
	c.settleLocked()
	if a.seq != nil { // admitted while we were giving up
		c.finishLocked(a.seq)
		return nil, ctx.Err()
	}
	if a.err != nil { // failed by close
		return nil, a.err
	}
	c.waiting.Remove(a.elem)
	c.dropLocked(a.handle)
	c.pumpLocked()
	return nil, ctx.Err()
}

// tryAdmitLocked admits a if a running slot and its blocks are free.
func (c *core) tryAdmitLocked(a *admission) bool {
	if c.running >= c.maxRunning || !c.pool.fits(a.want) {
		return false
	}
	if a.promptLen > 0 {
		// Like vLLM, at least the last prompt token is always computed.
		hits := min(c.pool.leadingHits(a.want.blocks), (a.promptLen-1)/BlockTokens)
		a.cached = hits * BlockTokens
		c.counters.prefixQueries += uint64(a.promptLen)
		c.counters.prefixHits += uint64(a.cached)
	}
	c.pool.acquire(a.want)
	s := &seq{blocks: a.want, cached: a.cached}
	if h := a.handle; h != nil {
		s.blocks.blocks = h.blocks.blocks
		s.blocks.private += h.blocks.private
		c.heldBlocks -= h.blocks.size()
		a.handle = nil
	}
	c.running++
	a.seq = s
	return true
}

// pumpLocked admits waiting sequences in order while they fit.
func (c *core) pumpLocked() {
	c.settleLocked()
	for e := c.waiting.Front(); e != nil && !c.closed; e = c.waiting.Front() {
		a := e.Value.(*admission)
		if !c.tryAdmitLocked(a) {
			return
		}
		c.waiting.Remove(e)
		close(a.ready)
	}
}

// finish frees the sequence's slot and blocks (full prompt blocks stay
// cached) and admits waiting sequences.
func (c *core) finish(s *seq) {
	c.mu.Lock()
	defer c.unlock()
	c.finishLocked(s)
}

func (c *core) finishLocked(s *seq) {
	c.settleLocked()
	c.pool.release(s.blocks)
	c.running--
	c.pumpLocked()
}

// handle is a prompt's KV held for one request: pushed to a decode engine
// for a resuming request, or held by a prefill engine for a remote decode
// engine to pull.
type handle struct {
	id     string
	header *kvv1.KvHeader
	blocks blockSet
	timer  *time.Timer
	// sampleFirst: the first token is sampled by the resuming request,
	// after it computes the last prompt token (vLLM's NixlConnector), not
	// taken from the header.
	sampleFirst bool
	// blockIDs name the blocks to a remote decode engine.
	blockIDs []uint64
}

// splitPrompt splits a sequence's blocks into those of its prompt's
// promptLen tokens (its full blocks cached, the partial tail private) and
// the rest.
func splitPrompt(b blockSet, promptLen int) (prompt, rest blockSet) {
	full := min(promptLen/BlockTokens, len(b.blocks))
	prompt.blocks = b.blocks[:full:full]
	rest.blocks = b.blocks[full:]
	prompt.private = min(blockCount(promptLen)-full, b.private)
	rest.private = b.private - prompt.private
	return prompt, rest
}

// finishKeeping ends a flat sequence, keeping its prompt's blocks for the
// caller and freeing the rest.
func (c *core) finishKeeping(s *seq, promptLen int) blockSet {
	c.mu.Lock()
	defer c.unlock()
	c.settleLocked()
	keep, rest := splitPrompt(s.blocks, promptLen)
	c.pool.release(rest)
	c.running--
	c.pumpLocked()
	return keep
}

// holdAcquired holds blocks already acquired (a finished request's
// prompt) under h until take, release or timeout.
func (c *core) holdAcquired(h *handle, timeout time.Duration) error {
	c.mu.Lock()
	defer c.unlock()
	if c.closed {
		c.pool.release(h.blocks)
		return errCoreClosed
	}
	if c.handles[h.id] != nil {
		c.pool.release(h.blocks)
		return fmt.Errorf("%w: %q", errHandleExists, h.id)
	}
	c.handles[h.id] = h
	c.heldBlocks += h.blocks.size()
	h.timer = time.AfterFunc(timeout, func() { c.expire(h) })
	return nil
}

// hold acquires blocks for h at once (no queueing) and keeps them until
// take, release or the hold timeout.
func (c *core) hold(h *handle) error {
	c.mu.Lock()
	defer c.unlock()
	switch {
	case c.closed:
		return errCoreClosed
	case c.handles[h.id] != nil:
		return fmt.Errorf("%w: %q", errHandleExists, h.id)
	case !c.pool.acquire(h.blocks):
		return fmt.Errorf("%w: %d needed, %d available", errNoBlocks, h.blocks.size(), c.pool.available())
	}
	c.handles[h.id] = h
	c.heldBlocks += h.blocks.size()
	c.counters.pushes++
	h.timer = time.AfterFunc(c.holdTimeout, func() { c.expire(h) })
	return nil
}

// take removes a held handle for a resuming request (nil if unknown); its
// blocks stay held until the request's sequence adopts or drops them.
func (c *core) take(id string) *handle {
	c.mu.Lock()
	defer c.unlock()
	h := c.handles[id]
	if h == nil {
		return nil
	}
	delete(c.handles, id)
	h.timer.Stop()
	return h
}

// drop frees a taken handle that no sequence adopted.
func (c *core) drop(h *handle) {
	c.mu.Lock()
	defer c.unlock()
	c.dropLocked(h)
}

func (c *core) dropLocked(h *handle) {
	if h == nil {
		return
	}
	c.pool.release(h.blocks)
	c.heldBlocks -= h.blocks.size()
	c.pumpLocked()
}

// release frees a held handle (the Release RPC): false for an unknown or
// already taken one.
func (c *core) release(id string) (released bool, freed int) {
	c.mu.Lock()
	defer c.unlock()
	c.counters.releases++
	h := c.handles[id]
	if h == nil {
		return false, 0
	}
	delete(c.handles, id)
	h.timer.Stop()
	c.dropLocked(h)
	c.counters.handlesReleased++
	return true, h.blocks.size()
}

// expire frees h if it is still held when its timer fires.
func (c *core) expire(h *handle) {
	c.mu.Lock()
	if c.handles[h.id] != h {
		c.unlock()
		return
	}
	delete(c.handles, h.id)
	c.dropLocked(h)
	c.counters.handlesExpired++
	onExpire := c.onExpire
	c.unlock()
	if onExpire != nil {
		onExpire(h.id)
	}
}

// close stops admitting, fails the waiting admissions and frees every held
// handle. Running sequences finish as usual.
func (c *core) close() {
	c.mu.Lock()
	defer c.unlock()
	c.settleLocked()
	c.closed = true
	for e := c.waiting.Front(); e != nil; e = c.waiting.Front() {
		a := c.waiting.Remove(e).(*admission)
		c.dropLocked(a.handle)
		a.handle = nil
		a.err = errCoreClosed
		close(a.ready)
	}
	for id, h := range c.handles {
		h.timer.Stop()
		delete(c.handles, id)
		c.dropLocked(h)
	}
}

// releaseBlocks frees blocks a finished prefill handed over.
func (c *core) releaseBlocks(b blockSet) {
	c.mu.Lock()
	defer c.unlock()
	c.pool.release(b)
}

// resetPrefixCache drops every cached block, as vLLM's reset_prefix_cache:
// false (nothing dropped) while sequences or handles hold blocks.
func (c *core) resetPrefixCache() bool {
	c.mu.Lock()
	defer c.unlock()
	return c.pool.reset()
}

// cachedKeys returns the keys of the blocks in the prefix cache.
func (c *core) cachedKeys() []uint64 {
	c.mu.Lock()
	defer c.unlock()
	keys := make([]uint64, 0, len(c.pool.cache))
	for k := range c.pool.cache {
		keys = append(keys, k)
	}
	return keys
}

// awaitKV counts a request that starts (+1) or stops (-1) waiting for its
// KV from a prefill engine.
func (c *core) awaitKV(n int) {
	c.mu.Lock()
	c.awaitingKV += n
	c.unlock()
}

// count applies f to the counters under the lock.
func (c *core) count(f func(*counters)) {
	c.mu.Lock()
	f(&c.counters)
	c.unlock()
}
