package enginesim

import (
	"context"
	"slices"
	"testing"
	"time"
)

// schedHarness drives a step scheduler by hand on a virtual clock: every
// step is planned, timed by the cost model and completed, and the ready
// tokens are sampled (a fixed token) and accepted at once, as requests'
// goroutines do.
type schedHarness struct {
	t     *testing.T
	c     *core
	s     *stepSched
	clock *VirtualClock
	seqs  []*stepSeq
	// times[q] are the clock readings when q's tokens became ready.
	times map[*stepSeq][]time.Time
}

func newSchedHarness(t *testing.T, blocks, budget, maxSeqs int, cost StepCost) *schedHarness {
	c := newCore(blocks, maxSeqs, time.Minute)
	c.hash = newHasher(DefaultHashSeed)
	clock := NewVirtualClock(time.Unix(1000, 0))
	c.sched = newStepSched(c, StepConfig{Cost: cost, MaxNumBatchedTokens: budget, Clock: clock}, maxSeqs)
	return &schedHarness{t: t, c: c, s: c.sched, clock: clock, times: map[*stepSeq][]time.Time{}}
}

// add submits a sequence of a prompt of n distinct tokens (from offset).
func (h *schedHarness) add(offset, n, maxTokens int) *stepSeq {
	h.t.Helper()
	q := &stepSeq{tokens: words(offset, n), promptLen: n, maxTokens: maxTokens}
	if err := h.s.submit(q, nil); err != nil {
		h.t.Fatalf("submit: %v", err)
	}
	h.seqs = append(h.seqs, q)
	return q
}

// step runs one step and returns its plan (nil when there was nothing to
// run).
func (h *schedHarness) step() *stepPlan {
	h.t.Helper()
	h.c.mu.Lock()
	if h.s.pendingAccept() {
		h.c.unlock()
		h.t.Fatal("a ready token was not accepted")
	}
	p := h.s.schedule()
	h.c.unlock()
	if p.empty() {
		return nil
	}
	h.clock.Sleep(context.Background(), h.s.cost.Duration(p.prefillTokens, p.decodeSeqs, p.context))
	now := h.clock.Now()
	h.c.mu.Lock()
	h.s.complete(p, now)
	var ready []*stepSeq
	for _, q := range h.seqs {
		if q.ready > q.taken {
			q.taken++
			ready = append(ready, q)
		}
	}
	h.c.unlock()
	for _, q := range ready {
		h.times[q] = append(h.times[q], now)
		h.s.accept(q, 300+uint32(len(h.times[q])), len(h.times[q]) == q.maxTokens)
	}
	return p
}

// tokensIn returns how many tokens q computes in p (0 if not in it).
func tokensIn(p *stepPlan, q *stepSeq) int {
	if i := slices.Index(p.seqs, q); i >= 0 {
		return p.tokens[i]
	}
	return 0
}

// TestStepSchedulerChunkedPrefill checks continuous batching with chunked
// prefill under max_num_batched_tokens: running sequences decode a token
// in every step, and a long prompt is prefilled in chunks of what the
// budget leaves them, its first token ready only after its last chunk.
func TestStepSchedulerChunkedPrefill(t *testing.T) {
	h := newSchedHarness(t, 256, 64, 16, StepCost{Fixed: time.Millisecond, PerPrefillToken: 10 * time.Microsecond})
	a, b := h.add(0, 20, 100), h.add(100, 30, 100)
	p := h.step() // both prompts fit the budget: prefilled in one step
	if tokensIn(p, a) != 20 || tokensIn(p, b) != 30 || p.prefillTokens != 50 || p.decodeSeqs != 0 {
		t.Fatalf("first step: %v %d prefill, %d decode", p.tokens, p.prefillTokens, p.decodeSeqs)
	}
	if got := h.step(); tokensIn(got, a) != 1 || tokensIn(got, b) != 1 || got.decodeSeqs != 2 {
		t.Fatalf("decode step: %v", got.tokens)
	}
	long := h.add(500, 200, 10)
	var chunks []int
	for len(h.times[long]) == 0 {
		p := h.step()
		if tokensIn(p, a) != 1 || tokensIn(p, b) != 1 {
			t.Fatalf("a decode sequence skipped a step while the long prompt prefilled: %v", p.tokens)
		}
		if p.prefillTokens+p.decodeSeqs > 64 {
			t.Fatalf("step of %d tokens over the budget of 64", p.prefillTokens+p.decodeSeqs)
		}
		chunks = append(chunks, tokensIn(p, long))
	}
	if !slices.Equal(chunks, []int{62, 62, 62, 14}) {
		t.Fatalf("prefill chunks %v, want [62 62 62 14]", chunks)
	}
	if p := h.step(); tokensIn(p, long) != 1 || p.decodeSeqs != 3 {
		t.Fatalf("after its prefill, the long prompt decodes: %v", p.tokens)
	}
	// A prompt of which a prefix is cached computes only the rest.
	for len(h.times[a]) < 100 || len(h.times[b]) < 100 || len(h.times[long]) < 10 {
		h.step()
	}
	again := h.add(500, 200, 1)
	p = h.step()
	if tokensIn(p, again) != 200-192 || again.cached != 192 {
		t.Fatalf("cached prefix: %d tokens computed, %d cached", tokensIn(p, again), again.cached)
	}
}

// TestStepSchedulerPreemptsWhenBlocksRunOut checks vLLM's preemption by
// recompute: blocks are allocated as sequences grow, and when they run
// out the newest running sequence is preempted (its blocks freed), queued
// first, and later recomputed in full; every sequence completes and no
// block is lost.
func TestStepSchedulerPreemptsWhenBlocksRunOut(t *testing.T) {
	h := newSchedHarness(t, 12, 512, 8, StepCost{Fixed: time.Millisecond})
	a, b, c := h.add(0, 16, 64), h.add(100, 16, 64), h.add(200, 16, 64)
	var victims []*stepSeq
	for range 1000 {
		before := map[*stepSeq]bool{}
		for _, q := range h.s.running {
			before[q] = true
		}
		p := h.step()
		if p == nil {
			break
		}
		for q := range before {
			if !q.running && !q.done {
				victims = append(victims, q)
				if q.computed != 0 || q.held.size() != 0 {
					t.Fatalf("a preempted sequence keeps %d computed tokens, %d blocks", q.computed, q.held.size())
				}
			}
		}
		for _, q := range h.s.running {
			if q.held.size() < blockCount(q.computed) {
				t.Fatalf("a sequence computed %d tokens on %d blocks", q.computed, q.held.size())
			}
		}
	}
	if len(victims) == 0 || h.s.preemptions != uint64(len(victims)) {
		t.Fatalf("%d preemptions counted, %d seen: 3 sequences of 5 blocks on 12 must preempt", h.s.preemptions, len(victims))
	}
	if victims[0] != c {
		t.Fatal("the first victim is not the newest sequence")
	}
	for _, q := range []*stepSeq{a, b, c} {
		if len(h.times[q]) != 64 || !q.done {
			t.Fatalf("a sequence made %d of 64 tokens", len(h.times[q]))
		}
	}
	if c.preemptedTimes == 0 || a.preemptedTimes != 0 {
		t.Fatalf("preempted: a %d, c %d times: the oldest must never be", a.preemptedTimes, c.preemptedTimes)
	}
	if ref := h.c.pool.referenced(); ref != 0 {
		t.Fatalf("%d blocks still referenced", ref)
	}
}

// TestLongPrefillSlowsDecodes checks that a long prefill admitted into a
// batch raises the running sequences' inter-token latency, as on vLLM: the
// steps that carry its chunks are longer than the decode-only steps
// before and after.
func TestLongPrefillSlowsDecodes(t *testing.T) {
	h := newSchedHarness(t, 4096, 2048, 64, PresetLlama8BH100.Step.Cost)
	var decoders []*stepSeq
	for i := range 8 {
		decoders = append(decoders, h.add(i*100, 100, 200))
	}
	for range 20 {
		h.step()
	}
	itl := func(q *stepSeq, from, to int) time.Duration { // mean over tokens (from, to]
		ts := h.times[q]
		return ts[to].Sub(ts[from]) / time.Duration(to-from)
	}
	mark := len(h.times[decoders[0]]) - 1
	long := h.add(5000, 6000, 5) // three chunks of the 2048-token budget
	for len(h.times[long]) == 0 {
		h.step()
	}
	during := len(h.times[decoders[0]]) - 1
	for range 10 {
		h.step()
	}
	after := len(h.times[decoders[0]]) - 1
	for _, q := range decoders {
		before, with, later := itl(q, mark-10, mark), itl(q, mark, during), itl(q, during+1, after)
		if !(with > before && with > later) {
			t.Fatalf("inter-token latency before %v, while the long prompt prefilled %v, after %v", before, with, later)
		}
	}
}

// TestStepSchedulerSlotTime checks the slot figures on the step scheduler
// (Stats.BusySlotTime, StalledSlotTime): busy integrates the running
// sequences over the scheduler's clock, stalled the free slots while the
// head of the queue did not fit the free KV blocks.
func TestStepSchedulerSlotTime(t *testing.T) {
	// Three blocks: a (two prompt blocks, four tokens: three blocks at its
	// end) leaves no room for b's two prompt blocks until it finishes.
	h := newSchedHarness(t, 3, 512, 4, StepCost{Fixed: time.Millisecond})
	a, b := h.add(0, 32, 4), h.add(100, 32, 4)
	for h.step() != nil {
	}
	if len(h.times[a]) != 4 || len(h.times[b]) != 4 {
		t.Fatalf("tokens: a %d, b %d, want 4 each", len(h.times[a]), len(h.times[b]))
	}
	h.c.mu.Lock()
	h.c.settleLocked()
	busy, stalled := h.c.slots.busy, h.c.slots.stalled
	h.c.unlock()
	// a runs steps 1-4 and b steps 5-8, one slot each; while a runs, b
	// waits on KV with three slots free.
	if busy != 8*time.Millisecond || stalled != 12*time.Millisecond {
		t.Fatalf("busy %v, stalled %v; want 8ms and 12ms", busy, stalled)
	}
}
