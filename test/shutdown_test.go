package test

import (
	"context"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
)

// TestCutOffStopWaitsForHandlers: a gateway stopped without letting its
// requests finish (Close with a context already done, as a kill or a
// shutdown past its deadline does) returns only once the handlers it cut
// off have returned: each sees its client gone and its request actor
// answers before the actors stop. Stopped the other way round, a handler
// that spawned its request actor as the actors stopped would wait for an
// answer, for good. Requests arrive without pause while the gateway
// closes, one held at the engine, so some are at every stage of a request.
func TestCutOffStopWaitsForHandlers(t *testing.T) {
	c := newCluster(t, "", nil, enginesim.Config{ID: "w1", Model: "m"},
		enginesim.Config{ID: "held", Model: "h", Faults: enginesim.Faults{StallMS: 60_000}})
	post := func(model string) error {
		hc := &http.Client{Timeout: 30 * time.Second}
		resp, err := hc.Post(c.url+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"`+model+`","prompt":"cut off","max_tokens":2}`))
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { _ = post("h") })
	var sent atomic.Int64
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = post("m")
				sent.Add(1)
			}
		})
	}
	eventually(t, 10*time.Second, func() bool {
		for _, w := range c.workers() {
			if w.ID == "held" && w.InFlight > 0 {
				return sent.Load() >= 20
			}
		}
		return false
	}, "the held request in flight, and requests flowing")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = c.gw.Close(ctx)
	h := handlersRunning()
	close(stop)
	if h != "" {
		t.Errorf("a handler still runs after the gateway closed:\n%s", h)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("clients were not let go when the gateway closed")
	}
}

// handlersRunning returns the stack of a goroutine still in the inference
// edge's handler, or "".
func handlersRunning() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "httpedge.(*Deps).run") {
			return g
		}
	}
	return ""
}
