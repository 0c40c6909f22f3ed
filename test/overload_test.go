package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
)

// Outlier ejection and admission control, end to end: real gateways in
// front of reference engines or fake engines written by the test.

// overloadCfg sets admission control for a test cluster.
func overloadCfg(f func(a *config.Admission, e *config.Ejection)) clusterOpt {
	return func(c *config.Config) { f(&c.Gateway.Admission, &c.Gateway.Ejection) }
}

// overloadReply is what one client saw (safe to collect from goroutines).
type overloadReply struct {
	id         string
	status     int
	code       string
	retryAfter string
	err        error
}

// overloadSend posts a small completions request with request id id and
// API key key ("" for none); it never calls t.Fatal.
func (c *cluster) overloadSend(ctx context.Context, key, id string) overloadReply {
	return c.overloadSendWith(ctx, key, id, nil)
}

// overloadSendWith is overloadSend with the extra headers h.
func (c *cluster) overloadSendWith(ctx context.Context, key, id string, h http.Header) overloadReply {
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": "hello", "max_tokens": 2})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		return overloadReply{id: id, err: err}
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return overloadReply{id: id, err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	out := overloadReply{id: id, status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), err: err}
	if resp.StatusCode != http.StatusOK {
		out.code = drillCode(body)
	}
	return out
}

// queued returns the router's queue length for model m.
func (c *cluster) queued() int {
	res, err := c.gw.System().Root.RequestFuture(c.gw.Router, &router.ListWorkers{}, 2*time.Second).Result()
	if err != nil {
		return -1
	}
	return res.(*router.WorkersResult).Queued["m"]
}

// gatedEngine is a fake engine that holds every request until its gate
// opens, counting the requests it holds at once and recording the
// request ids in the order they arrived.
type gatedEngine struct {
	gate chan struct{}
	once sync.Once

	mu       sync.Mutex
	running  int
	maxSeen  int
	arrivals []string
}

func newGatedEngine() *gatedEngine { return &gatedEngine{gate: make(chan struct{})} }

func (g *gatedEngine) open() { g.once.Do(func() { close(g.gate) }) }

func (g *gatedEngine) holding() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running
}

func (g *gatedEngine) order() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.arrivals...)
}

func (g *gatedEngine) handler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	g.mu.Lock()
	g.running++
	g.maxSeen = max(g.maxSeen, g.running)
	g.arrivals = append(g.arrivals, r.Header.Get("X-Client-Request-Id"))
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.running--
		g.mu.Unlock()
	}()
	select {
	case <-g.gate:
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" hi","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}`)
}

// TestEjectAfterRefused: a worker that heartbeats but refuses HTTP gets no
// attempt after its first refused connection until its ejection ends; then
// it is tried once more, refuses again, and is ejected for twice as long.
// GET /admin/v1/workers shows ejected_until and the reason.
func TestEjectAfterRefused(t *testing.T) {
	var mu sync.Mutex
	type attempt struct {
		worker string
		at     time.Time
	}
	var attempts []attempt
	c := newClusterDeps(t, "", []clusterOpt{overloadCfg(func(a *config.Admission, e *config.Ejection) {
		a.Enabled = true
		e.BaseTime, e.MaxTime = config.D(time.Second), config.D(10*time.Second)
	})}, func(d *request.Deps) {
		prev := d.OnRouted
		d.OnRouted = func(ex *request.Exchange, tg router.Target, took time.Duration) {
			prev(ex, tg, took)
			mu.Lock()
			attempts = append(attempts, attempt{tg.Worker.ID, time.Now()})
			mu.Unlock()
		}
	}, enginesim.Config{ID: "a", Model: "m"}, enginesim.Config{ID: "b", Model: "m"}, enginesim.Config{ID: "c", Model: "m"})
	if err := c.engines["a"].SetFaults(enginesim.Faults{Refuse: true}); err != nil {
		t.Fatal(err)
	}
	onA := func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		var out []time.Time
		for _, a := range attempts {
			if a.worker == "a" {
				out = append(out, a.at)
			}
		}
		return out
	}
	view := func() router.WorkerView {
		v, ok := c.drillWorker("a")
		if !ok {
			t.Fatal("a is not listed")
		}
		return v
	}
	// The first request tries a (ties go to the smallest id), is refused
	// and completes on b.
	if r := c.overloadSend(context.Background(), "", "first"); r.status != http.StatusOK {
		t.Fatalf("first request: %+v", r)
	}
	if n := len(onA()); n != 1 {
		t.Fatalf("attempts on a after the first request: %d", n)
	}
	v := view()
	until := v.EjectedUntil
	if until.IsZero() || v.EjectionReason != "refused" || v.Ejections != 1 || v.Routable || !v.Live(time.Now()) {
		t.Fatalf("after one refusal: %+v (want ejected for refused, not routable, still heartbeating)", v)
	}

	// The admin API shows the ejection.
	var body struct {
		Workers []map[string]any `json:"workers"`
	}
	if err := json.Unmarshal(c.get("/admin/v1/workers", "").body, &body); err != nil {
		t.Fatal(err)
	}
	for _, w := range body.Workers {
		if w["id"] == "a" && (w["ejected_until"] == nil || w["ejection_reason"] != "refused") {
			t.Fatalf("admin view of a: %v", w)
		}
	}

	// Requests until a has been tried a second time (the ejection ended).
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; len(onA()) < 2; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("a was not tried again within 15 s; its ejection ran until %v", until)
		}
		if r := c.overloadSend(context.Background(), "", fmt.Sprintf("r%d", i)); r.status != http.StatusOK {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	second := onA()[1]
	if second.Before(until) {
		t.Fatalf("a was tried at %v, during its ejection (until %v)", second, until)
	}
	v = view()
	if v.Ejections != 2 || v.EjectedUntil.Sub(second) < 1500*time.Millisecond || v.EjectedUntil.Sub(second) > 2500*time.Millisecond {
		t.Fatalf("second ejection: %+v, tried at %v (want about 2 s)", v, second)
	}
	_, failovers, _ := c.hooks.snapshot()
	if len(failovers) != 2 || failovers[0] != "a:refused" || failovers[1] != "a:refused" {
		t.Fatalf("failovers %v", failovers)
	}
}

// TestQueueWhenSaturated: a burst of 10× capacity (two workers with a
// limit of 2, a queue of 8, 40 requests): 4 run, 8 wait, 28 are answered
// 503 overloaded with Retry-After at once; when the engines answer, every
// waiting request is served. None is lost and no engine ever holds more
// than its limit.
func TestQueueWhenSaturated(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{overloadCfg(func(a *config.Admission, _ *config.Ejection) {
		a.Enabled, a.LimitScope, a.WorkerConcurrency, a.QueueSize = true, config.LimitScopeWorker, 2, 8
	})})
	f1, f2 := newGatedEngine(), newGatedEngine()
	c.addFake("f1", "m", f1.handler)
	c.addFake("f2", "m", f2.handler)
	t.Cleanup(func() { f1.open(); f2.open() })

	const burst = 40
	out := make(chan overloadReply, burst)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range burst {
		go func() { out <- c.overloadSend(ctx, "", fmt.Sprintf("b%d", i)) }()
	}
	var got []overloadReply
	overloaded := 0
	eventually(t, 10*time.Second, func() bool {
		for {
			select {
			case r := <-out:
				got = append(got, r)
				if r.status == http.StatusServiceUnavailable && r.code == "overloaded" {
					overloaded++
				}
				continue
			default:
			}
			return overloaded == burst-4-8 && c.queued() == 8 && f1.holding()+f2.holding() == 4
		}
	}, "28 overloaded, 8 queued, 4 running (overloaded %d, queued %d, running %d+%d)", overloaded, c.queued(), f1.holding(), f2.holding())
	f1.open()
	f2.open()
	for len(got) < burst {
		got = append(got, <-out)
	}
	served := 0
	for _, r := range got {
		switch {
		case r.err != nil:
			t.Errorf("%s: %v", r.id, r.err)
		case r.status == http.StatusOK:
			served++
		case r.status == http.StatusServiceUnavailable && r.code == "overloaded":
			if r.retryAfter == "" {
				t.Errorf("%s: 503 overloaded without Retry-After", r.id)
			}
		default:
			t.Errorf("%s: status %d code %q", r.id, r.status, r.code)
		}
	}
	if served != 12 {
		t.Errorf("served %d, want 12 (4 running + 8 queued)", served)
	}
	if f1.maxSeen > 2 || f2.maxSeen > 2 {
		t.Errorf("engines held %d and %d at once, limit 2", f1.maxSeen, f2.maxSeen)
	}
	c.drillWaitIdle()
}

// TestQueueFairAcrossKeys: key A floods the queue with 100 requests, then
// key B sends 10; the engine (limit 1) serves B's 10 before A's tail: the
// queue takes turns across keys.
func TestQueueFairAcrossKeys(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{
		withKeys(config.APIKey{Name: "A", Key: "key-a", Scopes: []string{"inference"}},
			config.APIKey{Name: "B", Key: "key-b", Scopes: []string{"inference"}}),
		overloadCfg(func(a *config.Admission, _ *config.Ejection) {
			a.Enabled, a.EngineConcurrency, a.QueueSize = true, map[string]int{"f": 1}, 200
		})})
	f := newGatedEngine()
	c.addFake("f", "m", f.handler)
	t.Cleanup(f.open)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make(chan overloadReply, 110)
	for i := range 100 {
		go func() { out <- c.overloadSend(ctx, "key-a", fmt.Sprintf("A%d", i)) }()
	}
	eventually(t, 10*time.Second, func() bool { return c.queued() == 99 && f.holding() == 1 }, "A's 99 queued (queued %d)", c.queued())
	for i := range 10 {
		go func() { out <- c.overloadSend(ctx, "key-b", fmt.Sprintf("B%d", i)) }()
	}
	eventually(t, 10*time.Second, func() bool { return c.queued() == 109 }, "B's 10 queued too (queued %d)", c.queued())
	f.open()
	for range 110 {
		if r := <-out; r.status != http.StatusOK {
			t.Errorf("%s: %+v", r.id, r)
		}
	}
	order := f.order()
	lastB, aBeforeLastB := -1, 0
	for i, id := range order {
		if strings.HasPrefix(id, "B") {
			lastB = i
		}
	}
	for _, id := range order[:lastB+1] {
		if strings.HasPrefix(id, "A") {
			aBeforeLastB++
		}
	}
	t.Logf("%d of A's requests served before B's last", aBeforeLastB)
	// One A was running; then turns alternate A, B: B's last is served
	// after at most 11 of A's, long before A's tail of 89.
	if len(order) != 110 || aBeforeLastB > 11 {
		t.Fatalf("%d of A's requests were served before B's last (order %v)", aBeforeLastB, order)
	}
}

// TestQueueClientGone: a client that leaves while queued frees its place
// at once: with a queue of one, the next request waits instead of being
// refused, and the engine never sees the request that left.
func TestQueueClientGone(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{overloadCfg(func(a *config.Admission, _ *config.Ejection) {
		a.Enabled, a.WorkerConcurrency, a.QueueSize = true, 1, 1
	})})
	f := newGatedEngine()
	c.addFake("f", "m", f.handler)
	t.Cleanup(f.open)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := make(chan overloadReply, 1)
	go func() { first <- c.overloadSend(ctx, "", "running") }()
	eventually(t, 10*time.Second, func() bool { return f.holding() == 1 }, "the first request at the engine")

	leaveCtx, leave := context.WithCancel(ctx)
	gone := make(chan overloadReply, 1)
	go func() { gone <- c.overloadSend(leaveCtx, "", "leaver") }()
	eventually(t, 10*time.Second, func() bool { return c.queued() == 1 }, "the leaver queued")
	// The queue is full: a third request is refused.
	if r := c.overloadSend(ctx, "", "refused"); r.status != http.StatusServiceUnavailable || r.code != "overloaded" || r.retryAfter == "" {
		t.Fatalf("third request with a full queue: %+v", r)
	}
	leave()
	if r := <-gone; r.err == nil {
		t.Fatalf("the leaver got an answer: %+v", r)
	}
	eventually(t, 5*time.Second, func() bool { return c.queued() == 0 }, "the leaver's place freed (queued %d)", c.queued())
	next := make(chan overloadReply, 1)
	go func() { next <- c.overloadSend(ctx, "", "next") }()
	eventually(t, 10*time.Second, func() bool { return c.queued() == 1 }, "the next request queued in the freed place")
	f.open()
	for _, ch := range []chan overloadReply{first, next} {
		if r := <-ch; r.status != http.StatusOK {
			t.Fatalf("%s: %+v", r.id, r)
		}
	}
	for _, id := range f.order() {
		if id == "leaver" {
			t.Fatal("the engine received the request whose client left")
		}
	}
	c.drillWaitIdle()
}

// TestAdmissionLimitFromEngine: with no limit configured, a worker's limit
// is learned from its reports: an engine running 2 sequences at most that
// reports a queue gets the limit 2 + 1, and then holds at most one request
// in its queue.
func TestAdmissionLimitFromEngine(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{overloadCfg(func(a *config.Admission, _ *config.Ejection) { a.Enabled = true })},
		enginesim.Config{ID: "e", Model: "m", MaxRunning: 2, DecodePerToken: 10 * time.Millisecond})
	e := c.engines["e"]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	maxWaiting := 0
	var mu sync.Mutex
	for i := range 8 {
		wg.Go(func() {
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				c.drillSend(ctx, "/v1/completions", "", fmt.Sprintf("l%d-%d", i, seq), drillBody("m", 10, false))
			}
		})
	}
	eventually(t, 10*time.Second, func() bool {
		v, ok := c.drillWorker("e")
		return ok && v.ConcurrencyLimit == 3
	}, "the limit learned from the engine's queue")
	// Once the requests sent before the limit drained, the engine holds at
	// most limit − running = 1 waiting.
	eventually(t, 10*time.Second, func() bool { return c.drillInFlight()["e"] <= 3 }, "in flight on e down to the limit")
	eventually(t, 10*time.Second, func() bool { return e.Stats().Waiting <= 1 }, "the engine's queue down to one")
	for range 50 {
		mu.Lock()
		maxWaiting = max(maxWaiting, e.Stats().Waiting)
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if maxWaiting > 1 {
		t.Fatalf("the engine queued %d requests under a learned limit of 3 (2 running)", maxWaiting)
	}
	c.drillWaitIdle()
}
