package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
)

// The drills' helpers: clients that never call t.Fatal (they run in
// goroutines) and report what they saw, a load generator, and views of
// the router's workers.

// drillRequestTimeout bounds a drill's request that has no deadline of its
// own: far longer than any drill request takes, far shorter than the
// package's timeout.
const drillRequestTimeout = 30 * time.Second

// drillKey is the harness's debug key (keys()): answers carry X-TL-Route.
const drillKey = "key-debug"

// withGateway adjusts the [gateway] table of a drill's cluster.
func drillGateway(f func(g *config.Gateway)) clusterOpt {
	return func(c *config.Config) { f(&c.Gateway) }
}

// drillOutcome is what one client request saw.
type drillOutcome struct {
	id      string
	status  int
	route   string // X-TL-Route (debug key only)
	body    []byte
	events  []string // SSE data payloads, for streams
	done    bool     // a stream ended with data: [DONE]
	errCode string   // the code of an error body or of a final SSE error event
	err     error    // transport error (client side)
	start   time.Time
	end     time.Time
}

func (o drillOutcome) String() string {
	b := o.body
	if len(b) > 200 {
		b = b[:200]
	}
	return fmt.Sprintf("%s: status %d route %q done %v code %q err %v events %d body %q",
		o.id, o.status, o.route, o.done, o.errCode, o.err, len(o.events), b)
}

// finishedOK reports a request that got its whole answer.
func (o drillOutcome) finishedOK(stream bool) bool {
	if o.err != nil || o.status != http.StatusOK || o.errCode != "" {
		return false
	}
	return !stream || o.done
}

// send runs one request and reads the whole answer; it never fails the
// test, so it may run in any goroutine.
func (c *cluster) drillSend(ctx context.Context, path, key, id string, body any) drillOutcome {
	return c.drillSendWatched(ctx, path, key, id, body, nil)
}

// drillSendWatched is drillSend that calls head with the answer's headers
// as soon as they arrive (for a stream: once the gateway committed it).
func (c *cluster) drillSendWatched(ctx context.Context, path, key, id string, body any, head func(h http.Header)) drillOutcome {
	if _, ok := ctx.Deadline(); !ok {
		// A request the gateway never answers fails the drill, not the
		// package's timeout.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, drillRequestTimeout)
		defer cancel()
	}
	o := drillOutcome{id: id, start: time.Now()}
	defer func() { o.end = time.Now() }()
	b, err := json.Marshal(body)
	if err != nil {
		o.err = err
		return o
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+path, bytes.NewReader(b))
	if err != nil {
		o.err = err
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		o.err = err
		o.end = time.Now()
		return o
	}
	defer resp.Body.Close()
	o.status, o.route = resp.StatusCode, resp.Header.Get("X-TL-Route")
	if head != nil {
		head(resp.Header)
	}
	o.body, o.err = io.ReadAll(resp.Body)
	o.end = time.Now()
	o.parse(resp.Header.Get("Content-Type"))
	return o
}

// parse fills events, done and errCode from the body.
func (o *drillOutcome) parse(contentType string) {
	if strings.HasPrefix(contentType, "text/event-stream") {
		o.events = sseEvents(o.body)
		if n := len(o.events); n > 0 {
			last := o.events[n-1]
			o.done = last == "[DONE]"
			if !o.done {
				o.errCode = drillCode([]byte(last))
			}
		}
		return
	}
	if o.status != http.StatusOK {
		o.errCode = drillCode(o.body)
	}
}

func drillCode(b []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	return e.Error.Code
}

// load runs clients that send requests back to back until stopped.
type drillLoad struct {
	cancel context.CancelFunc
	once   sync.Once
	stop   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	out    []drillOutcome
	open   map[string]string // request id → worker, for answers being read
}

// drillStartLoad starts n clients; client i sends body(i, seq) to path
// with a per-request deadline of perRequest (a request that hangs shows up
// as a deadline error). A test that ends without calling finish has its
// clients stopped, and their requests canceled, when it is cleaned up.
func (c *cluster) drillStartLoad(n int, path string, perRequest time.Duration, body func(client, seq int) any) *drillLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &drillLoad{cancel: cancel, stop: make(chan struct{}), open: map[string]string{}}
	c.t.Cleanup(func() {
		l.once.Do(func() { close(l.stop) })
		l.cancel()
		l.wg.Wait()
	})
	for i := range n {
		l.wg.Go(func() {
			for seq := 0; ; seq++ {
				select {
				case <-l.stop:
					return
				default:
				}
				rctx, rcancel := context.WithTimeout(ctx, perRequest)
				id := fmt.Sprintf("load-%d-%d", i, seq)
				o := c.drillSendWatched(rctx, path, drillKey, id, body(i, seq), func(h http.Header) {
					l.mu.Lock()
					l.open[id] = h.Get("X-TL-Route")
					l.mu.Unlock()
				})
				rcancel()
				l.mu.Lock()
				delete(l.open, id)
				l.out = append(l.out, o)
				l.mu.Unlock()
			}
		})
	}
	return l
}

// count returns how many requests finished so far that match keep.
func (l *drillLoad) count(keep func(drillOutcome) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.out {
		if keep(o) {
			n++
		}
	}
	return n
}

// reading counts the answers from worker being read now: for streams,
// those the gateway committed and has not finished.
func (l *drillLoad) reading(worker string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, w := range l.open {
		if w == worker {
			n++
		}
	}
	return n
}

// finish stops the clients after their current request and returns every
// drillOutcome. It does not cancel requests in flight: a hang shows up as the
// per-request deadline.
func (l *drillLoad) finish() []drillOutcome {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
	l.cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]drillOutcome(nil), l.out...)
}

// worker returns the router's view of worker id, if known.
func (c *cluster) drillWorker(id string) (router.WorkerView, bool) {
	for _, w := range c.workers() {
		if w.ID == id {
			return w, true
		}
	}
	return router.WorkerView{}, false
}

// inFlight is the router's in-flight count per known worker.
func (c *cluster) drillInFlight() map[string]int {
	m := map[string]int{}
	for _, w := range c.workers() {
		m[w.ID] = w.InFlight
	}
	return m
}

// waitIdle polls until the router holds no in-flight slot.
func (c *cluster) drillWaitIdle() {
	c.t.Helper()
	eventually(c.t, 10*time.Second, func() bool {
		for _, n := range c.drillInFlight() {
			if n != 0 {
				return false
			}
		}
		return true
	}, "no in-flight slot left: %v", c.drillInFlight())
}

// waitEvicted polls until worker id is gone from the router's view and
// checks that it was not evicted before last heartbeat + miss limit ×
// interval. It returns how long after that deadline the eviction was
// first seen.
func (c *cluster) drillWaitEvicted(id string, ttl time.Duration) time.Duration {
	c.t.Helper()
	var last time.Time
	eventually(c.t, 10*time.Second, func() bool {
		w, ok := c.drillWorker(id)
		if ok {
			last = w.LastHeartbeat
			return false
		}
		return true
	}, "worker %s evicted", id)
	seen := time.Now()
	if last.IsZero() {
		c.t.Fatalf("worker %s was never seen before its eviction", id)
	}
	if deadline := last.Add(ttl); seen.Before(deadline) {
		c.t.Fatalf("worker %s evicted at %v, before its deadline %v (last heartbeat %v)", id, seen, deadline, last)
	}
	return seen.Sub(last.Add(ttl))
}

// streamBody is a streamed completions body of n tokens.
func drillBody(model string, n int, stream bool) map[string]any {
	return map[string]any{"model": model, "prompt": "Tell me about gateways and the workers behind them.", "max_tokens": n, "stream": stream}
}

// openStream starts a streamed request and returns once its first event
// arrived; the caller reads the rest (or not) and closes it.
func (c *cluster) drillOpenStream(ctx context.Context, key, id string, body any) (*http.Response, *bufio.Reader, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, drillRequestTimeout)
		c.t.Cleanup(cancel)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("X-Request-Id", id)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, nil, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	c.t.Cleanup(func() { resp.Body.Close() }) // if the test ends early
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		resp.Body.Close()
		return nil, nil, errors.Join(fmt.Errorf("first line %q", line), err)
	}
	return resp, br, nil
}

// failIf reports every drillOutcome for which bad returns a reason, at most 10.
func drillFailIf(t *testing.T, outs []drillOutcome, bad func(drillOutcome) string) {
	t.Helper()
	n := 0
	for _, o := range outs {
		if why := bad(o); why != "" {
			n++
			if n <= 10 {
				t.Errorf("%s: %v", why, o)
			}
		}
	}
	if n > 10 {
		t.Errorf("... and %d more", n-10)
	}
}
