package test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
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

// TestDrainKeepsProbing: a graceful stop drains the requests in flight
// before it stops probing the engines that do not heartbeat. Stopped the
// other way round, a probed engine was forgotten (its reports missed) a
// few probe intervals into the drain, and a request waiting in its queue
// was answered 503 no_capacity instead of served.
func TestDrainKeepsProbing(t *testing.T) {
	e := newProbedEngine(t, config.KindVLLM, "m")
	release := make(chan struct{})
	var n atomic.Int64
	e.set(func(e *probedEngine) {
		e.completions = func(w http.ResponseWriter, _ map[string]any) {
			if n.Add(1) == 1 {
				select { // the first request is held until the drain is under way
				case <-release:
				case <-e.quit:
				}
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":"ok","logprobs":null,"finish_reason":"stop"}]}`)
		}
	})
	c := newCluster(t, e.toml("p1", "m"), []clusterOpt{func(c *config.Config) {
		c.Gateway.Admission.EngineConcurrency = map[string]int{"p1": 1}
	}})
	c.waitRoutable("p1")
	send := func() chan reply {
		ch := make(chan reply, 1)
		go func() { ch <- c.post("/v1/completions", "", completion("m", false)) }()
		return ch
	}
	held := send()
	eventually(t, 5*eventuallyUnit, func() bool { return n.Load() == 1 }, "the first request at the engine")
	queued := send()
	eventually(t, 5*eventuallyUnit, func() bool { return c.queued() == 1 }, "the second request in the queue")
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		closed <- c.gw.Close(ctx)
	}()
	// The listener closes as the drain begins; the engine is still probed.
	eventually(t, 5*eventuallyUnit, func() bool {
		conn, err := net.DialTimeout("tcp", strings.TrimPrefix(c.url, "http://"), time.Second)
		if err == nil {
			conn.Close()
		}
		return err != nil
	}, "the listener closed")
	checks := e.checks.Load()
	eventually(t, 5*eventuallyUnit, func() bool { return e.checks.Load() >= checks+2 }, "probes during the drain")
	close(release)
	for _, ch := range []chan reply{held, queued} {
		if r := <-ch; r.status != http.StatusOK {
			t.Fatalf("a request in the drain: %d %s, want 200", r.status, r.body)
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
