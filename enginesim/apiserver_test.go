package enginesim

import (
	"context"
	"sync"
	"testing"
	"time"
)

// sleepLog is a virtual clock that records every sleep.
type sleepLog struct {
	*VirtualClock
	mu     sync.Mutex
	sleeps []time.Duration
}

func (c *sleepLog) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	c.mu.Unlock()
	return c.VirtualClock.Sleep(ctx, d)
}

// TestAPIServerServesRequestsFirst checks the API server stage's queue:
// a request's work goes before the tokens queued ahead of it, each kind
// in order, one item at a time.
func TestAPIServerServesRequestsFirst(t *testing.T) {
	clock := &sleepLog{VirtualClock: NewVirtualClock(time.Unix(0, 0))}
	a := newAPIServer(APIServerCost{PerRequest: 5 * time.Millisecond, PerOutputToken: time.Millisecond}, clock)
	var order []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	queue := func(name string, request bool) {
		d := a.cost.PerOutputToken
		if request {
			d = a.cost.PerRequest
		}
		w := apiWork{d: d, at: clock.Now(), done: make(chan struct{})}
		a.queue.push(w, request)
		wg.Go(func() {
			<-w.done
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
		})
	}
	queue("token 1", false)
	queue("token 2", false)
	queue("request", true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.run(ctx); close(done) }()
	wg.Wait()
	cancel()
	<-done
	want := []time.Duration{5 * time.Millisecond, time.Millisecond, time.Millisecond}
	if len(clock.sleeps) != len(want) {
		t.Fatalf("sleeps %v, want %v", clock.sleeps, want)
	}
	for i := range want {
		if clock.sleeps[i] != want[i] {
			t.Fatalf("sleeps %v, want %v", clock.sleeps, want)
		}
	}
	if got := clock.Now().Sub(time.Unix(0, 0)); got != 7*time.Millisecond {
		t.Fatalf("the server took %v, want 7ms", got)
	}
	if err := a.token(context.Background()); err != errCoreClosed {
		t.Fatalf("a token after the server stopped: %v, want %v", err, errCoreClosed)
	}
}

// TestAPIServerStageIsServed checks that an engine on the step scheduler
// runs every request and every output token through its API server
// stage, and that a stage of zero costs takes no time.
func TestAPIServerStageIsServed(t *testing.T) {
	for _, cost := range []APIServerCost{{PerRequest: time.Hour, PerOutputToken: 24 * time.Hour}, {}} {
		clock := NewVirtualClock(time.Unix(0, 0))
		step := StepConfig{Cost: StepCost{Fixed: time.Millisecond}, APIServer: cost, Clock: clock}
		e := startEngine(t, Config{Model: "m", Step: &step})
		g := complete(t, newClient(t), e.URL(), false, completionBody("m", "hello there", map[string]any{"max_tokens": 3, "seed": 1}))
		if g.Usage.CompletionTokens != 3 {
			t.Fatalf("%d tokens, want 3", g.Usage.CompletionTokens)
		}
		took := clock.Now().Sub(time.Unix(0, 0))
		if want := cost.PerRequest + 3*cost.PerOutputToken; took < want || took > want+time.Hour {
			t.Fatalf("cost %+v: the request took %v of engine time, want %v and its steps", cost, took, want)
		}
	}
}

// TestSimulateAPIServerCapsOutput checks the API server stage in the
// calibration simulator: output never exceeds one token per
// PerOutputToken, and beyond the GPU's own pace a larger batch only
// raises latency.
func TestSimulateAPIServerCapsOutput(t *testing.T) {
	p := PresetLlama8BH100
	p.Step.APIServer = APIServerCost{PerRequest: time.Millisecond, PerOutputToken: 2 * time.Millisecond}
	var prev SimResult
	for _, c := range []int{16, 64} {
		r, err := Simulate(p, chatbotShort(c))
		if err != nil {
			t.Fatal(err)
		}
		if r.OutputThroughput > 500 {
			t.Fatalf("concurrency %d: %.0f tok/s, above the server's 500", c, r.OutputThroughput)
		}
		if c == 64 && !(r.TPOT > 3*prev.TPOT && r.TTFT > prev.TTFT) {
			t.Fatalf("concurrency 16: %+v; 64: %+v", prev, r)
		}
		prev = r
	}
}

// lateClock is a virtual clock whose every wait overshoots by late, as
// real timers do.
type lateClock struct {
	*VirtualClock
	late time.Duration
}

func (c lateClock) Sleep(ctx context.Context, d time.Duration) error {
	if d > 0 {
		d += c.late
	}
	return c.VirtualClock.Sleep(ctx, d)
}

// TestAPIServerCatchesUpLateTimers checks that timers waking late do not
// slow the server down: ten tokens queued together take ten tokens' work
// and one late wake-up, not ten.
func TestAPIServerCatchesUpLateTimers(t *testing.T) {
	start := time.Unix(0, 0)
	clock := lateClock{VirtualClock: NewVirtualClock(start), late: time.Millisecond}
	a := newAPIServer(APIServerCost{PerOutputToken: 640 * time.Microsecond}, clock)
	var done []chan struct{}
	for range 10 {
		w := apiWork{d: a.cost.PerOutputToken, at: start, done: make(chan struct{})}
		a.queue.push(w, false)
		done = append(done, w.done)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.run(ctx)
	for _, d := range done {
		<-d
	}
	if took := clock.Now().Sub(start); took > 6400*time.Microsecond+2*clock.late {
		t.Fatalf("ten tokens took %v with timers 1ms late, want about 6.4ms", took)
	}
}

// TestStepLoopKeepsPaceWithLateTimers checks that the step loop makes up
// for timers that wake late: back-to-back steps take their cost model's
// time and one late wake-up, not one per step.
func TestStepLoopKeepsPaceWithLateTimers(t *testing.T) {
	start := time.Unix(0, 0)
	clock := lateClock{VirtualClock: NewVirtualClock(start), late: time.Millisecond}
	c := newCore(64, 4, time.Minute)
	c.hash = newHasher(DefaultHashSeed)
	s := newStepSched(c, StepConfig{Cost: StepCost{Fixed: 5 * time.Millisecond}, Clock: clock}, 4)
	c.sched = s
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.loop(ctx)
	q := &stepSeq{tokens: words(0, 40), promptLen: 40, maxTokens: 20}
	if err := s.submit(q, nil); err != nil {
		t.Fatal(err)
	}
	for i := range q.maxTokens {
		if err := s.next(ctx, q); err != nil {
			t.Fatal(err)
		}
		s.accept(q, 300, i == q.maxTokens-1)
	}
	c.mu.Lock()
	steps := s.steps
	c.unlock()
	if took, want := clock.Now().Sub(start), time.Duration(steps)*5*time.Millisecond; took > want+2*clock.late {
		t.Fatalf("%d steps of 5ms took %v with timers 1ms late, want about %v", steps, took, want)
	}
}
