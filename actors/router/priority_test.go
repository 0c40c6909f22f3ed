package router

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

func intp(n int) *int { return &n }

// prioState is a state with admission on: n workers of model m, each
// limited to limit, a queue of size.
func prioState(t *testing.T, n, limit, size int, rs []routes.Route) *State {
	t.Helper()
	s := state(t, policy.NameLeastOutstanding, rs)
	s.cfg.Admission = AdmissionConfig{Enabled: true, Worker: limit, QueueSize: size, QueueTimeout: 30 * time.Second}
	for i := range n {
		s.SetWorker(w(fmt.Sprint("w", i), "m", fleet.RoleUnified, 0, 0))
	}
	return s
}

// req is a request of key for model m with priority p (the key's
// default) and the rest of its ask.
func req(p int, ask Ask) *Request {
	ask.Key.Priority = intp(p)
	return &Request{Model: "m", Ask: ask}
}

// fill admits n requests that take every slot.
func fill(t *testing.T, s *State, n int) {
	t.Helper()
	for i := range n {
		if ad := s.Admit(&Request{Model: "m"}, "fill", pid(fmt.Sprint("fill", i)), now); ad.Err != nil || ad.Queued != nil {
			t.Fatalf("fill %d: %+v", i, ad)
		}
	}
}

// serveOne releases worker id and dispatches; it returns the waiters that
// left, named by their PIDs.
func serveOne(s *State, id string, at time.Time) []string {
	s.Release(id)
	var out []string
	for _, d := range s.Dispatch(at) {
		name := d.W.From.Id
		if d.Err != nil {
			name += "!" + errName(d.Err)
		}
		out = append(out, name)
	}
	return out
}

func errName(err error) string {
	switch {
	case errors.Is(err, ErrSaturated):
		return "saturated"
	case errors.Is(err, ErrObjective):
		return "objective"
	case errors.Is(err, ErrOverloaded):
		return "overloaded"
	}
	return err.Error()
}

// TestPriorityDispatchedFirst: the highest band leaves the queue first,
// whatever arrived before it; a later arrival of a lower priority joins
// the queue rather than passing a waiter; and over random runs of
// arrivals and releases, no request is dispatched while one of a higher
// priority waits in its queue, with limits per pool and per worker.
func TestPriorityDispatchedFirst(t *testing.T) {
	s := prioState(t, 1, 1, 16, nil)
	fill(t, s, 1)
	for _, a := range []struct {
		name string
		p    int
	}{{"low1", 0}, {"low2", 0}, {"shed", -1}, {"high", 5}, {"mid", 2}} {
		if ad := s.Admit(req(a.p, Ask{}), a.name, pid(a.name), now); ad.Queued == nil {
			t.Fatalf("%s not queued: %+v", a.name, ad)
		}
	}
	// A later low arrival joins behind the waiters, without a pick.
	if ad := s.Admit(req(0, Ask{}), "late", pid("late"), now); ad.Queued == nil || !ad.Joined {
		t.Fatalf("late low arrival: %+v", ad)
	}
	var got []string
	for range 6 {
		got = append(got, serveOne(s, "w0", now)...)
	}
	if want := "high mid low1 low2 late shed"; strings.Join(got, " ") != want {
		t.Fatalf("dispatch order %q, want %q", strings.Join(got, " "), want)
	}

	for _, perWorker := range []bool{false, true} {
		for seed := range uint64(20) {
			t.Run(fmt.Sprintf("perWorker=%v/seed=%d", perWorker, seed), func(t *testing.T) {
				s := prioState(t, 3, 2, 8, nil)
				s.cfg.Admission.PerWorker = perWorker
				r := rand.New(rand.NewPCG(seed, 7))
				randomAdmissions(t, s, r, func(i int) (*Request, int) {
					p := r.IntN(5) - 2
					return req(p, Ask{FairnessID: fmt.Sprint(r.IntN(2))}), p
				})
			})
		}
	}
}

// randomAdmissions runs 400 steps of random arrivals (next makes each
// request and gives its priority) and releases on s, checking after every
// request that leaves for a worker that none of a higher priority waits
// in any queue.
func randomAdmissions(t *testing.T, s *State, r *rand.Rand, next func(i int) (*Request, int)) {
	t.Helper()
	var held []string // workers of requests in flight
	prio := map[string]int{}
	check := func(p int, what string) {
		for name, mq := range s.queues {
			if hi, ok := mq.q.Highest(); ok && hi > p {
				t.Fatalf("%s of priority %d dispatched while priority %d waits in %s", what, p, hi, name)
			}
		}
	}
	for i := range 400 {
		at := now.Add(time.Duration(i) * time.Millisecond)
		if r.IntN(3) > 0 || len(held) == 0 {
			name := fmt.Sprint("r", i)
			rq, p := next(i)
			prio[name] = p
			ad := s.Admit(rq, fmt.Sprint("k", r.IntN(3)), pid(name), at)
			if ad.Err == nil && ad.Queued == nil {
				check(p, name)
				held = append(held, ad.Target.Worker.ID)
			}
			continue
		}
		k := r.IntN(len(held))
		s.Release(held[k])
		held = append(held[:k], held[k+1:]...)
		for _, d := range s.Dispatch(at) {
			if d.Err == nil {
				check(prio[d.W.From.Id], d.W.From.Id)
				held = append(held, d.Target.Worker.ID)
			}
		}
	}
}

// TestPriorityAcrossRoutesOfOneModel: two routes served by the same
// workers wait in queues of their own; when a slot frees, the waiter of
// the higher priority goes first whichever queue it is in, and over
// random runs over both routes and the model itself no request is
// dispatched while one of a higher priority waits in any queue.
func TestPriorityAcrossRoutesOfOneModel(t *testing.T) {
	rs := []routes.Route{
		{Model: "batch", Backends: []routes.Backend{{Model: "m", Weight: 1}}, Priority: -1},
		{Model: "interactive", Backends: []routes.Backend{{Model: "m", Weight: 1}}, Priority: 5},
	}
	s := prioState(t, 1, 1, 16, rs)
	fill(t, s, 1)
	for _, name := range []string{"interactive", "batch"} {
		if ad := s.Admit(&Request{Model: name}, name, pid(name), now); ad.Queued == nil {
			t.Fatalf("%s not queued: %+v", name, ad)
		}
	}
	if got := serveOne(s, "w0", now); strings.Join(got, " ") != "interactive" {
		t.Fatalf("dispatched %v, want the interactive route's waiter first", got)
	}

	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			s := prioState(t, 2, 2, 8, rs)
			r := rand.New(rand.NewPCG(seed, 11))
			models := []string{"m", "batch", "interactive"}
			randomAdmissions(t, s, r, func(int) (*Request, int) {
				m := models[r.IntN(len(models))]
				return &Request{Model: m}, s.Classify(&Request{Model: m}).Priority
			})
		})
	}
}

// TestWaitEstimateAfterIdleQueue: a queue that emptied without a dispatch
// (its waiter left) and waits again 5 s later measures no 5-second
// dispatch interval: a request with a 2 s objective then waits instead of
// being refused with a Retry-After of 5 s.
func TestWaitEstimateAfterIdleQueue(t *testing.T) {
	s := prioState(t, 1, 1, 16, nil)
	fill(t, s, 1)
	for _, name := range []string{"a", "b"} {
		if ad := s.Admit(req(0, Ask{}), name, pid(name), now); ad.Queued == nil {
			t.Fatalf("%s: %+v", name, ad)
		}
	}
	serveOne(s, "w0", now.Add(100*time.Millisecond)) // a leaves, b is left waiting
	s.Leave(pid("b"))
	later := now.Add(5 * time.Second) // within the worker's heartbeat deadline
	if ad := s.Admit(req(0, Ask{}), "c", pid("c"), later); ad.Queued == nil {
		t.Fatalf("c: %+v", ad)
	}
	serveOne(s, "w0", later.Add(time.Millisecond))
	ad := s.Admit(req(0, Ask{Objective: 2 * time.Second}), "d", pid("d"), later.Add(2*time.Millisecond))
	if ad.Err != nil || ad.Queued == nil {
		t.Fatalf("d: %+v (retry after %s): the idle time was taken for a dispatch interval", ad, ad.RetryAfter)
	}
}

// TestSheddableRefusedFirstWhenSaturated: while a model's workers are full
// only by the gateway's limits, a sheddable request waits (behind every
// other band); once every worker's engine reports itself saturated (a
// queue of saturation_queue_depth), the sheddable waiters are refused as
// soon as a request of a higher priority has to wait, a sheddable arrival
// is refused at once (429 saturated, saying why) while a non-sheddable
// one waits, and nothing is dispatched until the reports clear. A full
// queue pushes a sheddable waiter out before it refuses a higher priority.
func TestSheddableRefusedFirstWhenSaturated(t *testing.T) {
	s := prioState(t, 2, 1, 16, nil)
	s.cfg.Admission.Saturation = SaturationConfig{QueueDepth: 5}
	fill(t, s, 2)
	batch := s.Admit(req(-1, Ask{}), "batch", pid("batch1"), now)
	if batch.Queued == nil {
		t.Fatalf("full by limits only: the sheddable request should wait: %+v", batch)
	}
	for _, id := range []string{"w0", "w1"} {
		s.SetWorker(w(id, "m", fleet.RoleUnified, 6, 0))
	}
	chat := s.Admit(req(0, Ask{}), "chat", pid("chat1"), now)
	if chat.Queued == nil || len(chat.Shed) != 1 || chat.Shed[0] != batch.Queued {
		t.Fatalf("saturated: the chat request should wait and shed the batch waiter: %+v", chat)
	}
	late := s.Admit(req(-3, Ask{}), "batch", pid("batch2"), now)
	var se *SaturatedError
	if !errors.As(late.Err, &se) || late.Queued != nil || late.RetryAfter < time.Second {
		t.Fatalf("sheddable arrival while saturated: %+v", late)
	}
	if msg := se.Message(); !strings.Contains(msg, "w0: 6 queued") || !strings.Contains(msg, "priority -3") {
		t.Errorf("message %q does not say why", msg)
	}
	// The engines' own queues are full: a release frees a gateway slot
	// but the pool stays saturated, so nothing leaves.
	if got := serveOne(s, "w0", now); len(got) != 0 {
		t.Fatalf("dispatched while saturated: %v", got)
	}
	s.SetWorker(w("w0", "m", fleet.RoleUnified, 0, 0))
	if got := serveOne(s, "w0", now); strings.Join(got, " ") != "chat1" {
		t.Fatalf("after the reports cleared: %v", got)
	}

	// A full queue: a higher priority pushes the sheddable waiter out.
	s = prioState(t, 1, 1, 1, nil)
	fill(t, s, 1)
	shed := s.Admit(req(-1, Ask{}), "batch", pid("b"), now)
	if ad := s.Admit(req(0, Ask{}), "chat", pid("c"), now); ad.Queued == nil || ad.Displaced != shed.Queued {
		t.Fatalf("full queue: %+v", ad)
	}
	if ad := s.Admit(req(-1, Ask{}), "batch", pid("b2"), now); !errors.Is(ad.Err, ErrOverloaded) {
		t.Fatalf("a sheddable arrival at a full queue of higher priorities: %+v", ad)
	}

	// Saturated by the KV cache and the recent TTFT too, when configured.
	s = prioState(t, 1, 0, 16, nil)
	s.cfg.Admission.Saturation = SaturationConfig{KVUse: 0.9, TTFT: time.Second}
	kv := w("w0", "m", fleet.RoleUnified, 0, 0)
	kv.KVTotalBlocks, kv.KVFreeBlocks = 100, 50
	s.SetWorker(kv)
	if ad := s.Admit(req(-1, Ask{}), "batch", pid("kv1"), now); ad.Err != nil {
		t.Fatalf("half the KV cache used is not saturated: %+v", ad)
	}
	kv.KVFreeBlocks = 5
	s.SetWorker(kv)
	if ad := s.Admit(req(-1, Ask{}), "batch", pid("kv2"), now); !errors.As(ad.Err, &se) || !strings.Contains(se.Why, "KV cache 95% used") {
		t.Fatalf("95%% of the KV cache used: %+v", ad)
	}
	kv.KVFreeBlocks = 50
	s.SetWorker(kv)
	s.TTFTObserved("w0", "m", 0, 1500*time.Millisecond, now)
	if ad := s.Admit(req(-1, Ask{}), "batch", pid("ttft"), now); !errors.As(ad.Err, &se) || !strings.Contains(se.Why, "recent TTFT 1.5s") {
		t.Fatalf("a slow recent TTFT: %+v", ad)
	}
	kv.LastHeartbeat, kv.Deadline = now.Add(20*time.Second), now.Add(26*time.Second)
	s.SetWorker(kv)
	if ad := s.Admit(req(-1, Ask{}), "batch", pid("ttft2"), now.Add(20*time.Second)); ad.Err != nil || ad.Queued != nil {
		t.Fatalf("a TTFT sample 20 s old is not believed: %+v", ad)
	}
}

// TestDeadlineOrderWithinBand: inside one key's flow in one band, waiters
// leave by deadline (arrival + TTFT objective; a waiter without one by
// its queue deadline), not by arrival.
func TestDeadlineOrderWithinBand(t *testing.T) {
	s := prioState(t, 1, 1, 16, nil)
	fill(t, s, 1)
	late := Ask{Key: KeyClass{ServeLate: true}}
	for _, a := range []struct {
		name      string
		at        time.Duration
		objective time.Duration
	}{
		{"a900", 0, 900 * time.Millisecond},
		{"none", 0, 0},
		{"c100", 10 * time.Millisecond, 100 * time.Millisecond},
		{"d500", 20 * time.Millisecond, 500 * time.Millisecond},
		{"e150", 300 * time.Millisecond, 150 * time.Millisecond},
		{"f900", 0, 900 * time.Millisecond},
	} {
		ask := late
		ask.Objective = a.objective
		if ad := s.Admit(req(0, ask), "k", pid(a.name), now.Add(a.at)); ad.Queued == nil {
			t.Fatalf("%s: %+v", a.name, ad)
		}
	}
	var got []string
	for range 6 {
		got = append(got, serveOne(s, "w0", now.Add(time.Second))...)
	}
	if want := "c100 e150 d500 a900 f900 none"; strings.Join(got, " ") != want {
		t.Fatalf("order %q, want %q", strings.Join(got, " "), want)
	}
}

// TestObjectiveUnreachableRefusedEarly: a request whose objective the
// estimate (the queue ahead of it at the queue's recent dispatch
// interval, plus the recent TTFT of its band) already misses is refused at
// once, 429 objective_unreachable saying why, unless its key is served
// late; a waiter is refused the moment its objective goes out of reach
// (its timer, or a dispatch that finds it so) instead of being served
// late; with no estimate yet nothing is refused.
func TestObjectiveUnreachableRefusedEarly(t *testing.T) {
	s := prioState(t, 1, 1, 16, nil)
	fill(t, s, 1)
	chat := Ask{Objective: 500 * time.Millisecond}
	if ad := s.Admit(req(10, chat), "chat", pid("cold"), now); ad.Queued == nil {
		t.Fatalf("with no estimate yet, a request with an objective waits: %+v", ad)
	}
	s.Leave(pid("cold"))
	// Teach the queue a dispatch interval of 100 ms and the band a TTFT
	// of 200 ms.
	for i := range 4 {
		s.Admit(req(0, Ask{}), "bg", pid(fmt.Sprint("bg", i)), now)
	}
	for i := 1; i <= 3; i++ {
		serveOne(s, "w0", now.Add(time.Duration(i)*100*time.Millisecond))
	}
	s.TTFTObserved("w0", "m", 10, 200*time.Millisecond, now)
	at := now.Add(300 * time.Millisecond)

	// Three waiters of the band ahead (due earlier): (3+1) × 100 ms +
	// 200 ms > 500 ms.
	for i := range 3 {
		if ad := s.Admit(req(10, Ask{Objective: 100 * time.Millisecond, Key: KeyClass{ServeLate: true}}), "chat", pid(fmt.Sprint("ahead", i)), at); ad.Queued == nil {
			t.Fatalf("ahead %d: %+v", i, ad)
		}
	}
	ad := s.Admit(req(10, chat), "chat", pid("refused"), at)
	var oe *ObjectiveError
	if !errors.As(ad.Err, &oe) || ad.Queued != nil || oe.Ahead != 3 || oe.Wait != 400*time.Millisecond || oe.TTFT != 200*time.Millisecond {
		t.Fatalf("unreachable objective: %+v (%+v)", ad, oe)
	}
	if msg := oe.Message(); !strings.Contains(msg, "objective of 500ms") || !strings.Contains(msg, "estimates 600ms") || !strings.Contains(msg, "behind 3 requests") {
		t.Errorf("message %q", msg)
	}
	served := s.Admit(req(10, Ask{Objective: 500 * time.Millisecond, Key: KeyClass{ServeLate: true}}), "chat", pid("late"), at)
	if served.Queued == nil {
		t.Fatalf("a key served late waits: %+v", served)
	}
	// One of another key ahead only (round robin): 2 × 100 + 200 < 500.
	ok := s.Admit(req(10, chat), "solo", pid("solo"), at)
	if ok.Queued == nil {
		t.Fatalf("reachable objective: %+v", ok)
	}
	// Its timer fires when waited + TTFT reaches the objective.
	check := s.CheckAt(ok.Queued, at)
	if want := at.Add(300 * time.Millisecond); !check.Equal(want) {
		t.Fatalf("check at %v, want %v", check, want)
	}
	if x := s.Expire(ok.Queued.Seq, check); x.W != nil || !x.Again.Equal(check.Add(time.Millisecond)) {
		t.Fatalf("at the edge it still waits: %+v", x)
	}
	if x := s.Expire(ok.Queued.Seq, check.Add(time.Millisecond)); x.W != ok.Queued || !errors.Is(x.Err, ErrObjective) {
		t.Fatalf("past the edge: %+v", x)
	}
	// A dispatch passes over a waiter out of reach, refusing it.
	gone := s.Admit(req(20, Ask{Objective: 350 * time.Millisecond}), "chat", pid("gone"), at)
	if gone.Queued == nil {
		t.Fatalf("gone: %+v", gone)
	}
	got := serveOne(s, "w0", at.Add(200*time.Millisecond))
	if strings.Join(got, " ") != "gone!objective ahead0" {
		t.Fatalf("dispatch: %v", got)
	}
}

// TestFairnessIDWithinKey: a key's fairness ids take turns inside the
// key's share: its end users alternate, and the other key still gets every
// other turn, however many ids the first one uses.
func TestFairnessIDWithinKey(t *testing.T) {
	s := prioState(t, 1, 1, 16, nil)
	fill(t, s, 1)
	for _, a := range []struct{ name, key, id string }{
		{"u1", "a", "u"}, {"u2", "a", "u"}, {"u3", "a", "u"}, {"v1", "a", "v"}, {"x1", "a", "x"},
		{"b1", "b", ""}, {"b2", "b", ""}, {"b3", "b", ""},
	} {
		if ad := s.Admit(req(0, Ask{FairnessID: a.id}), a.key, pid(a.name), now); ad.Queued == nil {
			t.Fatalf("%s: %+v", a.name, ad)
		}
	}
	var got []string
	for range 8 {
		got = append(got, serveOne(s, "w0", now)...)
	}
	if want := "u1 b1 v1 b2 x1 b3 u2 u3"; strings.Join(got, " ") != want {
		t.Fatalf("order %q, want %q", strings.Join(got, " "), want)
	}
}

// TestClassify: where a request's priority and objective come from.
func TestClassify(t *testing.T) {
	s := state(t, policy.NameLeastOutstanding, []routes.Route{{Model: "chat", Priority: 10, TTFTObjectiveMs: 500}, {Model: "batch", Priority: -1}})
	cases := []struct {
		name      string
		model     string
		ask       Ask
		prio      int
		objective time.Duration
	}{
		{"route", "chat", Ask{}, 10, 500 * time.Millisecond},
		{"no route", "other", Ask{}, 0, 0},
		{"key default over route", "chat", Ask{Key: KeyClass{Priority: intp(3), Objective: time.Second}}, 3, time.Second},
		{"header within the key's max", "batch", Ask{Priority: intp(7), Key: KeyClass{MaxPriority: intp(8)}}, 7, 0},
		{"header above the key's max", "batch", Ask{Priority: intp(9), Key: KeyClass{MaxPriority: intp(8)}}, 8, 0},
		{"no max: header cannot raise", "batch", Ask{Priority: intp(5)}, -1, 0},
		{"no max: header may lower", "chat", Ask{Priority: intp(-2)}, -2, 500 * time.Millisecond},
		{"max caps the route", "chat", Ask{Key: KeyClass{MaxPriority: intp(4)}}, 4, 500 * time.Millisecond},
		{"trusted: uncapped", "batch", Ask{Priority: intp(50), Key: KeyClass{Trusted: true}}, 50, 0},
		{"header objective first", "chat", Ask{Objective: 80 * time.Millisecond, Key: KeyClass{Objective: time.Second}}, 10, 80 * time.Millisecond},
	}
	for _, c := range cases {
		got := s.Classify(&Request{Model: c.model, Ask: c.ask})
		if got.Priority != c.prio || got.Objective != c.objective {
			t.Errorf("%s: priority %d objective %s, want %d %s", c.name, got.Priority, got.Objective, c.prio, c.objective)
		}
	}
}

// TestAttemptSucceededFeedsTTFT: the router actor records the first byte
// a request actor reports of a 2xx attempt in its queue's band, its
// queue's and its worker's recent TTFT (what an objective's estimate and
// saturation_ttft read); a report without one (an error answer) leaves
// them as they were.
func TestAttemptSucceededFeedsTTFT(t *testing.T) {
	st := state(t, policy.NameLeastOutstanding, nil, w("w0", "m", fleet.RoleUnified, 0, 0))
	sys := actor.NewActorSystem()
	t.Cleanup(sys.Shutdown)
	pid := sys.Root.Spawn(Props(st, nil))
	settle := func() {
		t.Helper()
		if _, err := sys.Root.RequestFuture(pid, &Ready{}, 10*time.Second).Result(); err != nil {
			t.Fatal(err)
		}
	}
	sys.Root.Send(pid, &AttemptSucceeded{WorkerID: "w0"})
	settle()
	if d := st.ttftEstimate("m", 3, time.Now()); d != 0 {
		t.Fatalf("TTFT %s after an answer without a first byte, want none", d)
	}
	sys.Root.Send(pid, &AttemptSucceeded{WorkerID: "w0", FirstByte: 1500 * time.Millisecond, Queue: "m", Priority: 3})
	settle()
	now := time.Now()
	for _, prio := range []int{3, 0} {
		if d := st.ttftEstimate("m", prio, now); d != 1500*time.Millisecond {
			t.Errorf("TTFT of band %d: %s, want 1.5s", prio, d)
		}
	}
	if d, ok := st.workerTTFT["w0"].at(now); !ok || d != 1500*time.Millisecond {
		t.Errorf("w0's TTFT %s %v, want 1.5s", d, ok)
	}
}

// TestTTFTBandsBounded: a queue keeps the TTFT of at most maxTTFTBands
// priority bands apart, whatever priorities its clients choose; a band
// past them is estimated by the queue's TTFT over every band.
func TestTTFTBandsBounded(t *testing.T) {
	s := state(t, policy.NameLeastOutstanding, nil)
	now := time.Now()
	for prio := range maxTTFTBands + 10 {
		s.TTFTObserved("w0", "m", -prio, time.Duration(prio+1)*time.Millisecond, now)
	}
	if n := len(s.bandTTFT); n != maxTTFTBands+1 {
		t.Fatalf("%d TTFTs kept for one queue, want %d bands and the queue's", n, maxTTFTBands)
	}
	if d := s.ttftEstimate("m", -(maxTTFTBands + 5), now); d != s.ttftEstimate("m", anyBand, now) || d == 0 {
		t.Fatalf("a band past the bound: %s, want the queue's %s", d, s.ttftEstimate("m", anyBand, now))
	}
	if d := s.ttftEstimate("m", -2, now); d != 3*time.Millisecond {
		t.Fatalf("a kept band: %s, want its own 3ms", d)
	}
}
