package enginesim

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// SimRequest is one request of a simulated load: its prompt and output
// lengths in tokens. An Output of 0 is a request the benchmark counted
// failed after its prompt was prefilled: it takes its share of the steps
// and is left out of the figures.
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
	// is the mean. Times are the client's: from the request's arrival at
	// the API server to each token leaving it.
	TTFT, MeanTTFT, TPOT, ITL time.Duration
	Duration                  time.Duration
	Steps, Preemptions        uint64
}

// simRequest is a request of a simulation in flight.
type simRequest struct {
	q      *stepSeq
	out    int // tokens the client receives; 0: failed after prefill
	arrive time.Time
	times  []time.Time // when each token reached the client
	// sending is set while a token is at the API server; pending while a
	// ready token waits for it (the live engine's request goroutine
	// accepts the next token once it has handed on the previous one).
	sending, pending bool
}

// simWork is an item of the API server's queue: a request to admit or a
// token to send.
type simWork struct {
	r     *simRequest
	token bool
}

// Simulate runs a load on the step scheduler of preset p on a virtual
// clock: deterministic, and as fast as the CPU allows whatever the
// simulated time. It is the engine's own curve, for calibration against
// published figures: the steps, and the API server stage beside them as
// the live engine runs it (one server in apiQueue's order; a sequence's
// next token computed once its previous one is handed on).
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
	api := cfg.APIServer
	start := clock.Now()

	var (
		active, done []*simRequest
		queue        apiQueue[simWork]
		serving      *simWork
		serveEnd     time.Time
		plan         *stepPlan // the step in flight
		stepEnd      time.Time
		next         int
		offset       uint32
		lastOut      = start
	)
	arrive := func(now time.Time) {
		for len(active) < load.Concurrency && next < len(load.Requests) {
			req := load.Requests[next]
			next++
			prompt := make([]uint32, max(req.Input, 1))
			for i := range prompt { // distinct prompts: no prefix cache hits
				prompt[i] = 256 + (offset+uint32(i))%4000
			}
			offset += uint32(len(prompt)) + 7
			r := &simRequest{q: &stepSeq{tokens: prompt, promptLen: len(prompt), maxTokens: max(req.Output, 1)}, out: req.Output, arrive: now}
			active = append(active, r)
			queue.push(simWork{r: r}, true)
		}
	}
	finish := func(r *simRequest, now time.Time) {
		active = slices.DeleteFunc(active, func(x *simRequest) bool { return x == r })
		if r.out > 0 {
			done = append(done, r)
		}
		arrive(now)
	}
	// accept takes r's ready token: the scheduler may compute the next,
	// and the token queues at the API server (a failed request ends).
	accept := func(r *simRequest, now time.Time) {
		taken := r.q.taken
		if r.out == 0 {
			s.accept(r.q, 300, true)
			finish(r, now)
			return
		}
		s.accept(r.q, 300, taken == r.out)
		r.sending = true
		queue.push(simWork{r: r, token: true}, false)
	}
	// served ends the API server's work in hand at now.
	served := func(now time.Time) error {
		w := *serving
		serving = nil
		r := w.r
		if !w.token {
			return s.submit(r.q, nil)
		}
		r.sending = false
		r.times = append(r.times, now)
		lastOut = now
		switch {
		case len(r.times) == r.out:
			finish(r, now)
		case r.pending:
			r.pending = false
			accept(r, now)
		}
		return nil
	}
	arrive(start)
	for {
		now := clock.Now()
		// The API server's work of zero duration is done at once.
		for {
			if serving == nil {
				if w, ok := queue.pop(); ok {
					serving = &w
					serveEnd = now.Add(api.of(!w.token))
				}
			}
			if serving == nil || serveEnd.After(now) {
				break
			}
			if err := served(now); err != nil {
				return SimResult{}, err
			}
		}
		if plan == nil {
			c.mu.Lock()
			if !s.pendingAccept() {
				if p := s.schedule(); !p.empty() {
					plan = p
					stepEnd = now.Add(s.cost.Duration(p.prefillTokens, p.decodeSeqs, p.context))
				}
			}
			c.unlock()
		}
		switch {
		case plan == nil && serving == nil:
			if len(active) > 0 {
				return SimResult{}, fmt.Errorf("enginesim: simulation stalled with %d requests in flight", len(active))
			}
		case plan != nil && (serving == nil || !serveEnd.Before(stepEnd)):
			// The step ends first (or with the server's work).
			_ = clock.Sleep(context.Background(), stepEnd.Sub(now))
			now = stepEnd
			c.mu.Lock()
			s.complete(plan, now)
			c.unlock()
			plan = nil
			for _, r := range slices.Clone(active) {
				if r.q.ready > r.q.taken {
					r.q.taken++
					if r.sending {
						r.pending = true
					} else {
						accept(r, now)
					}
				}
			}
			continue
		default:
			_ = clock.Sleep(context.Background(), serveEnd.Sub(now))
			now = serveEnd
			if err := served(now); err != nil {
				return SimResult{}, err
			}
			continue
		}
		break
	}
	var ttfts, tpots, itls []time.Duration
	tokens := 0
	var sumTTFT time.Duration
	for _, r := range done {
		ttft := r.times[0].Sub(r.arrive)
		ttfts = append(ttfts, ttft)
		sumTTFT += ttft
		tokens += len(r.times)
		if n := len(r.times); n > 1 {
			tpots = append(tpots, r.times[n-1].Sub(r.times[0])/time.Duration(n-1))
			for i := 1; i < n; i++ {
				itls = append(itls, r.times[i].Sub(r.times[i-1]))
			}
		}
	}
	if len(done) == 0 {
		return SimResult{}, fmt.Errorf("%w: every request of the load failed", ErrConfig)
	}
	d := lastOut.Sub(start)
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
