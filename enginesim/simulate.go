package enginesim

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// SimRequest is one request of a simulated load: its prompt and output
// lengths in tokens.
type SimRequest struct {
	Input, Output int
}

// SimLoad is a closed-loop load: Concurrency requests in flight, the next
// of Requests starting when one ends (vLLM bench serve's
// --max-concurrency with --request-rate inf). Prompts are distinct, so
// the prefix cache never hits.
type SimLoad struct {
	Concurrency int
	Requests    []SimRequest
}

// SimResult is what vLLM's benchmark reports of a load, in simulated time.
type SimResult struct {
	// OutputThroughput is output tokens per second over the whole run.
	OutputThroughput float64
	// TTFT, TPOT (per request: its decode time over its tokens after the
	// first) and ITL (every gap between two tokens) are medians; MeanTTFT
	// is the mean.
	TTFT, MeanTTFT, TPOT, ITL time.Duration
	Duration                  time.Duration
	Steps, Preemptions        uint64
}

// Simulate runs a load on the step scheduler of preset p on a virtual
// clock: deterministic, and as fast as the CPU allows whatever the
// simulated time. It is the engine's own curve, for calibration against
// published figures.
func Simulate(p Preset, load SimLoad) (SimResult, error) {
	if load.Concurrency < 1 || len(load.Requests) == 0 {
		return SimResult{}, fmt.Errorf("%w: a load needs a concurrency and requests", ErrConfig)
	}
	c := newCore(p.KVBlocks, p.MaxRunning, time.Minute)
	c.hash = newHasher(DefaultHashSeed)
	clock := NewVirtualClock(time.Unix(0, 0))
	cfg := p.Step
	cfg.Clock = clock
	s := newStepSched(c, cfg, p.MaxRunning)
	c.sched = s
	start := clock.Now()

	type live struct {
		q      *stepSeq
		out    int
		times  []time.Time
		arrive time.Time
	}
	var active []*live
	var done []*live
	next := 0
	offset := uint32(0)
	admit := func() error {
		for len(active) < load.Concurrency && next < len(load.Requests) {
			r := load.Requests[next]
			next++
			prompt := make([]uint32, max(r.Input, 1))
			for i := range prompt { // distinct prompts: no prefix cache hits
				prompt[i] = 256 + (offset+uint32(i))%4000
			}
			offset += uint32(len(prompt)) + 7
			q := &stepSeq{tokens: prompt, promptLen: len(prompt), maxTokens: max(r.Output, 1)}
			if err := s.submit(q, nil); err != nil {
				return err
			}
			active = append(active, &live{q: q, out: max(r.Output, 1), arrive: clock.Now()})
		}
		return nil
	}
	if err := admit(); err != nil {
		return SimResult{}, err
	}
	for len(active) > 0 {
		c.mu.Lock()
		plan := s.schedule()
		c.unlock()
		if plan.empty() {
			return SimResult{}, fmt.Errorf("enginesim: simulation stalled with %d requests in flight", len(active))
		}
		clock.Sleep(context.Background(), s.cost.Duration(plan.prefillTokens, plan.decodeSeqs, plan.context))
		now := clock.Now()
		c.mu.Lock()
		s.complete(plan, now)
		c.unlock()
		var still []*live
		for _, l := range active {
			if l.q.ready > l.q.taken {
				l.q.taken++
				l.times = append(l.times, now)
				s.accept(l.q, 300, len(l.times) == l.out)
			}
			if len(l.times) == l.out {
				done = append(done, l)
			} else {
				still = append(still, l)
			}
		}
		active = still
		if err := admit(); err != nil {
			return SimResult{}, err
		}
	}
	var ttfts, tpots, itls []time.Duration
	tokens := 0
	var sumTTFT time.Duration
	for _, l := range done {
		ttft := l.times[0].Sub(l.arrive)
		ttfts = append(ttfts, ttft)
		sumTTFT += ttft
		tokens += len(l.times)
		if n := len(l.times); n > 1 {
			tpots = append(tpots, l.times[n-1].Sub(l.times[0])/time.Duration(n-1))
			for i := 1; i < n; i++ {
				itls = append(itls, l.times[i].Sub(l.times[i-1]))
			}
		}
	}
	d := clock.Now().Sub(start)
	return SimResult{
		OutputThroughput: float64(tokens) / d.Seconds(),
		TTFT:             median(ttfts), MeanTTFT: sumTTFT / time.Duration(len(done)),
		TPOT: median(tpots), ITL: median(itls), Duration: d,
		Steps: s.steps, Preemptions: s.preemptions,
	}, nil
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	if n := len(ds); n%2 == 0 {
		return (ds[n/2-1] + ds[n/2]) / 2
	}
	return ds[len(ds)/2]
}
