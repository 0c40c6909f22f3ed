package enginesim

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// DefaultMaxNumBatchedTokens is the step scheduler's token budget per step
// (vLLM's max_num_batched_tokens) when the configuration sets none.
const DefaultMaxNumBatchedTokens = 8192

// StepConfig selects the step scheduler: one loop per engine runs steps
// like vLLM's V1 scheduler, each step's duration coming from Cost.
type StepConfig struct {
	// Cost is the step's cost model.
	Cost StepCost
	// MaxNumBatchedTokens bounds the tokens of one step: every running
	// sequence's decode token plus prefill chunks (default
	// DefaultMaxNumBatchedTokens).
	MaxNumBatchedTokens int
	// APIServer is the serial work beside the steps: per request before
	// it is scheduled, per output token before the client sees it (zero:
	// none).
	APIServer APIServerCost
	// Clock is the scheduler's time (default the real clock).
	Clock Clock
}

// StepCost is the duration of one step as a function of its batch: a
// fixed part (launch, sampling, the weights read once per step), a part
// per prefill token computed (matrix multiplies), a part per decode
// sequence, and a part per context token the step's attention reads (the
// KV cache of every scheduled sequence).
type StepCost struct {
	Fixed           time.Duration
	PerPrefillToken time.Duration
	PerDecodeSeq    time.Duration
	PerContextToken time.Duration
}

// Duration returns the duration of a step computing prefillTokens prompt
// tokens and decodeSeqs decode tokens over contextTokens tokens of KV.
func (c StepCost) Duration(prefillTokens, decodeSeqs, contextTokens int) time.Duration {
	return c.Fixed + time.Duration(prefillTokens)*c.PerPrefillToken +
		time.Duration(decodeSeqs)*c.PerDecodeSeq + time.Duration(contextTokens)*c.PerContextToken
}

func (c StepCost) validate() error {
	if c.Fixed < 0 || c.PerPrefillToken < 0 || c.PerDecodeSeq < 0 || c.PerContextToken < 0 {
		return fmt.Errorf("%w: negative step cost", ErrConfig)
	}
	return nil
}

// stepSeq is one sequence on the step scheduler. Its tokens are the
// prompt then every token sampled so far; computed of them have KV. A
// token is sampled by the request's own goroutine (ready then accept), so
// generation code is shared with the flat mode; the loop waits for every
// ready token to be accepted before the next step, as a decode step needs
// its input token.
type stepSeq struct {
	tokens    []uint32 // prompt, then the sampled tokens
	promptLen int
	maxTokens int
	lora      string
	salt      string
	// prefillOnly sequences end when their prompt is computed; their
	// blocks are kept for the caller (KV transfer) instead of freed.
	prefillOnly bool
	// keepPrompt sequences keep their prompt's blocks for the caller
	// (takeBlocks) when they finish; the rest are freed.
	keepPrompt bool
	resumed    bool // started from a handle's KV

	computed int      // tokens with KV
	held     blockSet // cached full blocks referenced and private blocks
	hashed   []*kvBlock
	cached   int // prompt tokens found in the prefix cache at admission

	ready    int  // tokens made ready to sample
	taken    int  // of them, taken by the request
	awaiting bool // a ready token is not accepted yet
	done     bool // finished (or failed): no more steps
	running  bool
	inStep   bool // part of the step being executed
	released bool // its blocks were freed (or handed over)
	aborted  bool
	err      error
	notify   chan struct{}

	admitted       time.Time // when first scheduled
	lastToken      time.Time
	arrived        time.Time
	preemptedTimes int
}

func (s *stepSeq) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// stepPlan is one step: the sequences scheduled and the tokens each
// computes.
type stepPlan struct {
	seqs                               []*stepSeq
	tokens                             []int
	prefillTokens, decodeSeqs, context int
}

func (p *stepPlan) empty() bool { return len(p.seqs) == 0 }

// stepSched is the step scheduler. Its state is guarded by the core's
// lock (the block pool is the core's).
type stepSched struct {
	c       *core
	cost    StepCost
	budget  int
	maxSeqs int
	clock   Clock
	waiting []*stepSeq
	running []*stepSeq
	wake    chan struct{}
	// accepted is signalled when a ready token is accepted.
	accepted    chan struct{}
	steps       uint64
	preemptions uint64
	closed      bool
	// kvShort is set when the last step's admission stopped because the
	// head of the waiting queue did not fit the free KV blocks (the
	// engine's slots stalled on KV, Stats.StalledSlotTime).
	kvShort bool
	// observe, when set, is called (under the lock) with each token made
	// ready: whether it is the sequence's first and the time since the
	// previous one (or since arrival).
	observe func(first bool, since time.Duration)
}

func newStepSched(c *core, cfg StepConfig, maxSeqs int) *stepSched {
	s := &stepSched{
		c: c, cost: cfg.Cost, budget: cfg.MaxNumBatchedTokens, maxSeqs: maxSeqs, clock: cfg.Clock,
		wake: make(chan struct{}, 1), accepted: make(chan struct{}, 1),
	}
	if s.budget == 0 {
		s.budget = DefaultMaxNumBatchedTokens
	}
	if s.clock == nil {
		s.clock = RealClock{}
	}
	return s
}

func (s *stepSched) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// submit queues a sequence; with h its blocks are the handle's (a
// resumed prompt, computed, its first token known). The caller holds no
// lock.
func (s *stepSched) submit(q *stepSeq, h *handle) error {
	q.notify = make(chan struct{}, 1)
	s.c.mu.Lock()
	defer s.c.unlock()
	q.arrived = s.clock.Now()
	if s.closed {
		s.c.dropLocked(h)
		return errCoreClosed
	}
	s.c.settleLocked()
	need := blockCount(q.promptLen + q.maxTokens)
	if q.prefillOnly {
		need = blockCount(q.promptLen)
	}
	if need > s.c.pool.total {
		s.c.dropLocked(h)
		return fmt.Errorf("%w: %d blocks needed, %d in the engine", errTooLarge, need, s.c.pool.total)
	}
	if h != nil {
		q.resumed = true
		q.held = h.blocks
		q.hashed = slices.Clone(h.blocks.blocks)
		q.computed = q.promptLen
		s.c.heldBlocks -= h.blocks.size()
		if h.sampleFirst { // the last prompt token is computed here
			q.computed--
		} else {
			q.ready, q.awaiting = 1, true // the first token came with the KV
		}
	}
	s.waiting = append(s.waiting, q)
	s.kick()
	return nil
}

// next waits for the sequence's next token to be ready to sample.
func (s *stepSched) next(ctx context.Context, q *stepSeq) error {
	for {
		s.c.mu.Lock()
		switch {
		case q.err != nil:
			s.c.unlock()
			return q.err
		case q.ready > q.taken:
			q.taken++
			s.c.unlock()
			return nil
		}
		s.c.unlock()
		select {
		case <-q.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// accept records the token sampled for the last ready slot; done ends the
// sequence (its last token), freeing its blocks unless prefillOnly.
func (s *stepSched) accept(q *stepSeq, token uint32, done bool) {
	s.c.mu.Lock()
	defer s.c.unlock()
	if q.awaiting {
		q.awaiting = false
		if q.computed == len(q.tokens) { // a resumed first token is in tokens already
			q.tokens = append(q.tokens, token)
		}
	}
	if done {
		s.finishLocked(q)
	}
	select {
	case s.accepted <- struct{}{}:
	default:
	}
	s.kick()
}

// abort ends a sequence whose request went away (or failed).
func (s *stepSched) abort(q *stepSeq) {
	s.c.mu.Lock()
	defer s.c.unlock()
	q.aborted = true
	if q.prefillOnly && q.released { // computed, its blocks not taken
		s.c.pool.release(q.held)
		q.held = blockSet{}
	}
	s.finishLocked(q)
	select {
	case s.accepted <- struct{}{}:
	default:
	}
	s.kick()
}

// finishLocked removes q from the queues and frees its blocks (a
// prefillOnly sequence's blocks are the caller's) unless a step is
// executing it: the step's end does it then.
func (s *stepSched) finishLocked(q *stepSeq) {
	q.done = true
	if q.inStep || q.released {
		return
	}
	q.released = true
	s.c.settleLocked()
	s.waiting = slices.DeleteFunc(s.waiting, func(x *stepSeq) bool { return x == q })
	s.running = slices.DeleteFunc(s.running, func(x *stepSeq) bool { return x == q })
	switch {
	case q.keepPrompt && !q.aborted:
		var rest blockSet
		q.held, rest = splitPrompt(q.held, q.promptLen)
		s.c.pool.release(rest)
	case !q.prefillOnly || q.aborted:
		s.c.pool.release(q.held)
		q.held = blockSet{}
	}
	if q.err == nil && q.aborted {
		q.err = context.Canceled
	}
	q.signal()
}

// takeBlocks hands a finished prefillOnly sequence's blocks to the caller.
func (s *stepSched) takeBlocks(q *stepSeq) blockSet {
	s.c.mu.Lock()
	defer s.c.unlock()
	b := q.held
	q.held = blockSet{}
	return b
}

// pendingAccept reports whether a running sequence has a ready token not
// accepted yet: the next step needs it.
func (s *stepSched) pendingAccept() bool {
	for _, q := range s.running {
		if q.awaiting && !q.done {
			return true
		}
	}
	return false
}

// schedule plans the next step as vLLM's V1 scheduler does: first every
// running sequence in order gets its next tokens (a decode token, or a
// prefill chunk within the budget), allocating their blocks and
// preempting the newest running sequence (recompute) when blocks run out;
// then, if nothing was preempted, waiting sequences are admitted in order
// while the budget, max_num_seqs and the free blocks allow.
func (s *stepSched) schedule() *stepPlan {
	s.c.settleLocked()
	p := &stepPlan{}
	budget := s.budget
	preempted := false
	for i := 0; i < len(s.running) && budget > 0; i++ {
		q := s.running[i]
		if q.done || q.awaiting {
			continue
		}
		n := min(len(q.tokens)-q.computed, budget)
		if n <= 0 {
			continue
		}
		for !s.grow(q, n) {
			victim := s.running[len(s.running)-1]
			s.preempt(victim)
			preempted = true
			if victim == q {
				n = 0
				break
			}
		}
		if n == 0 {
			break
		}
		s.add(p, q, n)
		budget -= n
	}
	s.kvShort = preempted // the victims wait for blocks
	for !preempted && budget > 0 && len(s.waiting) > 0 && len(s.running) < s.maxSeqs {
		q := s.waiting[0]
		n, ok := s.admit(q, budget)
		if !ok {
			s.kvShort = true
			break
		}
		s.waiting = s.waiting[1:]
		s.running = append(s.running, q)
		q.running = true
		if q.admitted.IsZero() {
			q.admitted = s.clock.Now()
		}
		if n > 0 {
			s.add(p, q, n)
			budget -= n
		}
	}
	return p
}

func (s *stepSched) add(p *stepPlan, q *stepSeq, n int) {
	p.seqs = append(p.seqs, q)
	p.tokens = append(p.tokens, n)
	if q.computed >= q.promptLen && n == 1 && q.computed == len(q.tokens)-1 {
		p.decodeSeqs++
	} else {
		p.prefillTokens += n
	}
	p.context += q.computed + n
	q.inStep = true
}

// grow allocates the blocks q needs to compute n more tokens.
func (s *stepSched) grow(q *stepSeq, n int) bool {
	need := blockCount(q.computed+n) - q.held.size()
	if need <= 0 {
		return true
	}
	if !s.c.pool.grow(need) {
		return false
	}
	q.held.private += need
	return true
}

// admit takes the blocks of a waiting sequence's prefix cache hits and of
// its first chunk; false (nothing taken) when they do not fit.
func (s *stepSched) admit(q *stepSeq, budget int) (int, bool) {
	if q.resumed { // its KV is held already; the last prompt token may be left to compute
		n := min(len(q.tokens)-q.computed, budget)
		if n > 0 && !s.grow(q, n) {
			return 0, false
		}
		return max(n, 0), true
	}
	if len(q.hashed) < len(q.tokens)/BlockTokens {
		q.hashed = append(q.hashed, s.c.hash.extend(q.hashed, q.tokens, q.lora, q.salt)...)
	}
	// Like vLLM, at least the last token is always computed.
	hits := min(s.c.pool.leadingHits(q.hashed), (len(q.tokens)-1)/BlockTokens)
	n := min(len(q.tokens)-hits*BlockTokens, budget)
	want := blockSet{blocks: q.hashed[:hits], private: blockCount(hits*BlockTokens+n) - hits}
	if !s.c.pool.fits(want) {
		return 0, false
	}
	s.c.pool.acquire(want)
	q.held = blockSet{blocks: slices.Clone(want.blocks), private: want.private}
	q.computed = hits * BlockTokens
	q.cached = q.computed
	s.c.counters.prefixQueries += uint64(len(q.tokens))
	s.c.counters.prefixHits += uint64(q.computed)
	return n, true
}

// preempt frees a running sequence's blocks and queues it first for
// recomputation of all its tokens (vLLM's preemption by recompute).
func (s *stepSched) preempt(q *stepSeq) {
	s.running = slices.DeleteFunc(s.running, func(x *stepSeq) bool { return x == q })
	s.c.pool.release(q.held)
	q.held = blockSet{}
	q.computed = 0
	q.resumed = false
	q.running = false
	q.inStep = false
	q.preemptedTimes++
	s.preemptions++
	s.waiting = slices.Insert(s.waiting, 0, q)
}

// complete ends a step at now: the scheduled tokens have KV, full blocks
// are cached, and a sequence whose tokens are all computed has its next
// token ready to sample (or, prefillOnly, is done).
func (s *stepSched) complete(p *stepPlan, now time.Time) {
	s.c.settleLocked()
	s.steps++
	for i, q := range p.seqs {
		q.inStep = false
		if q.done || !q.running {
			if q.done {
				s.finishLocked(q)
			}
			continue
		}
		q.computed += p.tokens[i]
		s.cacheFull(q)
		if q.computed < len(q.tokens) {
			continue
		}
		first := q.ready == 0
		since := now.Sub(q.lastToken)
		if first {
			since = now.Sub(q.arrived)
		}
		q.lastToken = now
		if s.observe != nil {
			s.observe(first, since)
		}
		q.ready++
		if q.prefillOnly {
			q.done, q.released = true, true // its blocks are the caller's (takeBlocks)
			s.running = slices.DeleteFunc(s.running, func(x *stepSeq) bool { return x == q })
		} else {
			q.awaiting = true
		}
		q.signal()
	}
}

// cacheFull caches the full blocks q has computed and not cached yet.
func (s *stepSched) cacheFull(q *stepSeq) {
	full := q.computed / BlockTokens
	if len(q.hashed) < full {
		q.hashed = append(q.hashed, s.c.hash.extend(q.hashed, q.tokens[:full*BlockTokens], q.lora, q.salt)...)
	}
	for len(q.held.blocks) < full && q.held.private > 0 {
		b := q.hashed[len(q.held.blocks)]
		if !s.c.pool.promote(b) {
			return // a duplicate of a cached block stays private, as in vLLM
		}
		q.held.blocks = append(q.held.blocks, b)
		q.held.private--
	}
}

// close fails every sequence.
func (s *stepSched) close() {
	s.c.mu.Lock()
	defer s.c.unlock()
	s.closed = true
	for _, q := range slices.Concat(s.waiting, s.running) {
		q.err = errCoreClosed
		q.aborted = true
		s.finishLocked(q)
	}
	s.kick()
}

// maxStepLag bounds what loop makes up for: timers wake up to about a
// millisecond late; a larger lag is a starved CPU, which the engine shows
// as slowness instead of a burst of short steps.
const maxStepLag = 2 * time.Millisecond

// loop runs steps until ctx ends. Steps that follow one another keep the
// cost model's pace on average: a step that ended late (timers wake late,
// by up to a millisecond here) shortens the next wait, until the loop
// idles.
func (s *stepSched) loop(ctx context.Context) {
	var lag time.Duration
	for {
		s.c.mu.Lock()
		var p *stepPlan
		if !s.pendingAccept() {
			p = s.schedule()
		}
		pending := p == nil
		s.c.unlock()
		if pending {
			select {
			case <-s.accepted:
			case <-ctx.Done():
				return
			}
			continue
		}
		if p.empty() {
			lag = 0
			select {
			case <-s.wake:
			case <-ctx.Done():
				return
			}
			continue
		}
		d := s.cost.Duration(p.prefillTokens, p.decodeSeqs, p.context)
		start := s.clock.Now()
		err := s.clock.Sleep(ctx, d-lag)
		lag = min(lag+s.clock.Now().Sub(start)-d, maxStepLag)
		s.c.mu.Lock()
		s.complete(p, s.clock.Now())
		s.c.unlock()
		if err != nil {
			return
		}
	}
}
