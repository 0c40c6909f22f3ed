package loadgen

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Arrivals returns the arrival times, as offsets from the start, of a
// Poisson process of rate per second over [0, d): independent,
// exponentially distributed gaps of mean 1/rate. The same seed gives the
// same times; a rate or d that is not positive gives none.
func Arrivals(rate float64, d time.Duration, seed uint64) []time.Duration {
	if rate <= 0 || d <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(seed, 0x706f6973736f6e))
	out := make([]time.Duration, 0, int(rate*d.Seconds()*1.1)+8)
	var at float64 // seconds
	for {
		at += rng.ExpFloat64() / rate
		t := time.Duration(at * float64(time.Second))
		if t >= d {
			return out
		}
		out = append(out, t)
	}
}

// Session is one user's requests, sent one after another: a conversation's
// turns, or a single RAG question.
type Session struct{ Turns []Request }

// SessionsOf groups a workload's requests into sessions by their After
// links: a request without After opens a session, one with After joins the
// session of the request it follows. The sessions are in the order of their
// first requests.
func SessionsOf(w *Workload) []Session {
	var out []Session
	of := make([]int, len(w.Requests)) // request index → session index
	for i, r := range w.Requests {
		a := r.After - 1
		if a < 0 || a >= i {
			of[i] = len(out)
			out = append(out, Session{Turns: []Request{r}})
			continue
		}
		s := of[a]
		of[i] = s
		out[s].Turns = append(out[s].Turns, r)
	}
	return out
}

// Sessions is a run of sessions against a picked URL per request: each
// session sends its first turn when it starts and every further turn a
// think time after the previous one was answered (or failed).
//
// With Rate set, sessions start as a Poisson process of Rate per second
// (open loop: arrivals do not wait for answers). Otherwise Users sessions
// run at once and each starts the next when it ends (closed loop, used to
// find a fleet's capacity).
type Sessions struct {
	Rate  float64
	Users int
	// Duration is how long sessions start and turns are sent; a turn due
	// later is not sent and the run ends when the last answer is in.
	Duration time.Duration
	// Warmup: requests sent before it are not recorded; Result.Elapsed is
	// the recorded window, Duration - Warmup.
	Warmup time.Duration
	// Think is the mean think time, drawn evenly from [Think/2, 3·Think/2].
	Think time.Duration
	// Sessions are started in order; when they run out no more start.
	Sessions []Session
	// MaxInFlight bounds the outstanding requests (default 4096); a turn
	// beyond it is dropped, counted, and ends its session.
	MaxInFlight int
	Seed        uint64
	// InterToken times the gaps between a streamed answer's token events:
	// Result.ITL and Result.TPOT.
	InterToken bool
	// Observe, when set, is called with every recorded request's send
	// time (from the start), its time to first token and its error.
	Observe func(at, ttft time.Duration, err error)
	// Answered, when set, is called with every request's send time and
	// the time its answer ended (from the start), warmup or not, and its
	// error: what was served when, beside what was asked when.
	Answered func(sent, done time.Duration, err error)
}

// RunSessions runs the sessions against the URLs p picks, one pick per
// request. It returns when every started session has ended or ctx ended.
func RunSessions(ctx context.Context, c *http.Client, p Picker, cfg Sessions) *Result {
	var rec recorder
	if len(cfg.Sessions) == 0 || cfg.Duration <= 0 || cfg.Rate <= 0 && cfg.Users < 1 {
		return &rec.res
	}
	maxIn := cfg.MaxInFlight
	if maxIn < 1 {
		maxIn = 4096
	}
	start := time.Now()
	end := start.Add(cfg.Duration)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, maxIn)
	var mu sync.Mutex
	next := 0
	take := func() (Session, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next >= len(cfg.Sessions) {
			return Session{}, false
		}
		next++
		return cfg.Sessions[next-1], true
	}
	thinkRng := rand.New(rand.NewPCG(cfg.Seed, 0x7468696e6b))
	think := func() time.Duration {
		if cfg.Think <= 0 {
			return 0
		}
		mu.Lock()
		defer mu.Unlock()
		return cfg.Think/2 + time.Duration(thinkRng.Int64N(int64(cfg.Think)+1))
	}
	// run sends a session's turns; false when the run's time is over.
	run := func(s Session) bool {
		for k, r := range s.Turns {
			if k > 0 {
				if !sleepUntil(ctx, time.Now().Add(think())) {
					return false
				}
			}
			sent := time.Now()
			if !sent.Before(end) {
				return false
			}
			select {
			case sem <- struct{}{}:
			default:
				if sent.Sub(start) >= cfg.Warmup {
					rec.mu.Lock()
					rec.res.Dropped++
					rec.mu.Unlock()
				}
				return true
			}
			var gaps *[]time.Duration
			if cfg.InterToken && r.Stream {
				gaps = new([]time.Duration)
			}
			lat, ttft, err := do(ctx, c, p.Next(), r, gaps)
			<-sem
			if cfg.Answered != nil {
				cfg.Answered(sent.Sub(start), time.Since(start), err)
			}
			if err != nil && ctx.Err() != nil {
				return false
			}
			if at := sent.Sub(start); at >= cfg.Warmup {
				var g []time.Duration
				if gaps != nil {
					g = *gaps
					if g == nil {
						g = []time.Duration{} // timed, one token: no gap
					}
				}
				rec.addTimed(lat, ttft, r.Stream, g, err)
				if cfg.Observe != nil {
					cfg.Observe(at, ttft, err)
				}
			}
		}
		return true
	}
	var wg sync.WaitGroup
	if cfg.Rate > 0 {
		for _, at := range Arrivals(cfg.Rate, cfg.Duration, cfg.Seed) {
			if !sleepUntil(ctx, start.Add(at)) {
				break
			}
			s, ok := take()
			if !ok {
				break
			}
			wg.Go(func() { run(s) })
		}
	} else {
		for range cfg.Users {
			wg.Go(func() {
				for {
					s, ok := take()
					if !ok || !run(s) {
						return
					}
				}
			})
		}
	}
	wg.Wait()
	rec.res.Elapsed = cfg.Duration - cfg.Warmup
	return &rec.res
}

// sleepUntil waits until t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// WithinSLO counts the samples at or below slo.
func WithinSLO(samples []time.Duration, slo time.Duration) int {
	n := 0
	for _, s := range samples {
		if s <= slo {
			n++
		}
	}
	return n
}
