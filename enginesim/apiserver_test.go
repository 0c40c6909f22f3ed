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
		w := apiWork{d: d, done: make(chan struct{})}
		if request {
			a.requests = append(a.requests, w)
		} else {
			a.tokens = append(a.tokens, w)
		}
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
