package router

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

func admitState(t *testing.T, limit, size int) *State {
	t.Helper()
	s := state(t, policy.NameLeastOutstanding, nil)
	s.cfg.Admission = AdmissionConfig{Enabled: limit > 0, Worker: limit, QueueSize: size, QueueTimeout: 30 * time.Second}
	s.SetWorker(w("a", "m", fleet.RoleUnified, 0, 0))
	s.SetWorker(w("b", "m", fleet.RoleUnified, 0, 0))
	return s
}

func pid(n string) *actor.PID { return actor.NewPID("local", n) }

func TestAdmitQueuesWhenSaturated(t *testing.T) {
	s := admitState(t, 1, 2)
	for i := range 2 {
		if ad := s.Admit(&Request{Model: "m"}, "k", pid("p"+string(rune('0'+i))), now); ad.Err != nil || ad.Queued != nil {
			t.Fatalf("admit %d: %+v", i, ad)
		}
	}
	q1 := s.Admit(&Request{Model: "m"}, "k", pid("q1"), now)
	q2 := s.Admit(&Request{Model: "m"}, "k", pid("q2"), now.Add(1500*time.Millisecond))
	if q1.Queued == nil || q2.Queued == nil {
		t.Fatalf("not queued: %+v %+v", q1, q2)
	}
	full := s.Admit(&Request{Model: "m"}, "k", pid("q3"), now.Add(2*time.Second))
	if !errors.Is(full.Err, ErrOverloaded) || full.RetryAfter != 2*time.Second {
		t.Fatalf("full queue: %+v", full)
	}
	// Another key displaces the heaviest key's newest waiter.
	other := s.Admit(&Request{Model: "m"}, "other", pid("o1"), now.Add(2*time.Second))
	if other.Queued == nil || other.Displaced != q2.Queued {
		t.Fatalf("other key: %+v", other)
	}
	if got := s.QueueLengths()["m"]; got != 2 {
		t.Fatalf("queued %d", got)
	}
	// Nothing frees: dispatch serves nobody.
	if d := s.Dispatch(now.Add(2 * time.Second)); len(d) != 0 {
		t.Fatalf("dispatched %+v", d)
	}
	s.Release("a")
	d := s.Dispatch(now.Add(3 * time.Second))
	if len(d) != 1 || d[0].W != q1.Queued || d[0].Err != nil || d[0].Target.Worker.ID != "a" {
		t.Fatalf("dispatch after a release: %+v", d)
	}
	// The other key's waiter leaves (client gone): the queue empties.
	if w := s.Leave(pid("o1")); w != other.Queued || s.Leave(pid("o1")) != nil {
		t.Fatal("leave")
	}
	if len(s.QueueLengths()) != 0 {
		t.Fatalf("queues left: %v", s.QueueLengths())
	}
}

func TestAdmitExpiresAndUnknownModel(t *testing.T) {
	s := admitState(t, 1, 4)
	s.Admit(&Request{Model: "m"}, "k", nil, now)
	s.Admit(&Request{Model: "m"}, "k", nil, now)
	q := s.Admit(&Request{Model: "m"}, "k", nil, now).Queued
	if x := s.Expire(q.Seq, now.Add(29*time.Second)); x.W != nil || !x.Again.Equal(q.Deadline) {
		t.Fatalf("expired before its deadline: %+v", x)
	}
	if x := s.Expire(q.Seq, now.Add(30*time.Second)); x.W != q || !errors.Is(x.Err, ErrOverloaded) {
		t.Fatalf("expire: %+v", x)
	}
	if x := s.Expire(q.Seq, now.Add(31*time.Second)); x.W != nil || !x.Again.IsZero() {
		t.Fatalf("expired twice: %+v", x)
	}
	// A model with no worker at all is refused at once, not queued.
	if ad := s.Admit(&Request{Model: "nope"}, "k", nil, now); ad.Queued != nil || !errors.Is(ad.Err, ErrModelNotFound) {
		t.Fatalf("unknown model: %+v", ad)
	}
	// Admission off: no limits, no queue.
	s = admitState(t, 0, 4)
	s.Admit(&Request{Model: "m"}, "k", nil, now)
	s.Admit(&Request{Model: "m"}, "k", nil, now)
	if ad := s.Admit(&Request{Model: "m"}, "k", nil, now); ad.Err != nil || ad.Queued != nil {
		t.Fatalf("admission off: %+v", ad)
	}
}

func TestLimitRules(t *testing.T) {
	s := state(t, policy.NameLeastOutstanding, nil)
	s.cfg.Admission = AdmissionConfig{Enabled: true, Model: map[string]int{"big": 4}, Engine: map[string]int{"e1": 2}}
	x := w("x", "m", fleet.RoleUnified, 0, 0)
	x.Running = 8
	s.SetWorker(x)
	if got := s.Limit(s.workers["x"]); got != 0 {
		t.Fatalf("no queue reported yet: limit %d, want none", got)
	}
	steps := []struct{ queue, running, want int }{
		{3, 6, 7}, // queueing at 6: capacity 6, one more allowed
		{0, 2, 7}, // less load: nothing learned
		{0, 7, 8}, // ran 7 without a queue: capacity 7
		{2, 4, 5}, // queueing at 4 now (KV short): capacity 4
	}
	for _, st := range steps {
		x.QueueDepth, x.Running = st.queue, st.running
		s.SetWorker(x)
		if got := s.Limit(s.workers["x"]); got != st.want {
			t.Fatalf("after queue %d running %d: limit %d, want %d", st.queue, st.running, got, st.want)
		}
	}
	x.StartedAt, x.QueueDepth = now.Add(time.Minute), 0 // restarted: forgotten
	s.SetWorker(x)
	if got := s.Limit(s.workers["x"]); got != 0 {
		t.Fatalf("after a restart: %d", got)
	}
	s.SetWorker(w("e1", "big", fleet.RoleUnified, 0, 0))
	s.SetWorker(w("e2", "big", fleet.RoleUnified, 0, 0))
	if a, b := s.Limit(s.workers["e1"]), s.Limit(s.workers["e2"]); a != 2 || b != 4 {
		t.Fatalf("engine override %d (want 2), model override %d (want 4)", a, b)
	}
	s.cfg.Admission.Worker = 5
	if got := s.Limit(s.workers["x"]); got != 5 {
		t.Fatalf("worker_concurrency: %d", got)
	}
}

// warmAdmitState is cache_aware with admission control: workers a and b,
// each allowed one request at a time.
func warmAdmitState(t *testing.T, size int) *State {
	t.Helper()
	s := caState(t, policy.DefaultCacheAware(), "a", "b")
	s.cfg.Admission = AdmissionConfig{Enabled: true, Worker: 1, QueueSize: size, QueueTimeout: 30 * time.Second}
	for _, id := range []string{"a", "b"} {
		s.SetWorker(caWorker(id)) // the limit is copied at a worker's update
	}
	return s
}

// TestDispatchPrefersWarmWaiter: under cache_aware, the slot that frees on
// a worker goes to the waiter whose prompt that worker holds, not to the
// one that waited longest; keys keep their turns, and a passed-over head
// leaves after at most WarmWindow later waiters.
func TestDispatchPrefersWarmWaiter(t *testing.T) {
	sysA, sysB := words("alpha", 2000)+"\n", words("beta", 2000)+"\n"
	admit := func(s *State, prompt, key string) Admission {
		t.Helper()
		return s.Admit(&Request{Model: "m", Prompt: prompt}, key, nil, now)
	}
	t.Run("warm waiter first", func(t *testing.T) {
		s := warmAdmitState(t, 8)
		if ad := admit(s, sysA+"first", "k"); ad.Target.Worker.ID != "a" {
			t.Fatalf("first request on %q, want a", ad.Target.Worker.ID)
		} else {
			answered(s, ad.Target)
		}
		if ad := admit(s, sysB+"second", "k"); ad.Target.Worker.ID != "b" {
			t.Fatalf("second request on %q, want b", ad.Target.Worker.ID)
		} else {
			answered(s, ad.Target)
		}
		coldOnA := admit(s, sysB+"wants b", "k").Queued
		warmOnA := admit(s, sysA+"wants a", "k").Queued
		if coldOnA == nil || warmOnA == nil {
			t.Fatal("not queued")
		}
		s.Release("a")
		d := s.Dispatch(now)
		if len(d) != 1 || d[0].W != warmOnA || d[0].Target.Worker.ID != "a" || d[0].Target.MatchedTokens < 400 {
			t.Fatalf("after a's release: %+v, want the waiter a holds the prompt of, on a with its prefix matched", d)
		}
		s.Release("b")
		d = s.Dispatch(now)
		if len(d) != 1 || d[0].W != coldOnA || d[0].Target.Worker.ID != "b" {
			t.Fatalf("after b's release: %+v, want the head on b", d)
		}
	})
	t.Run("keys keep their turns", func(t *testing.T) {
		s := warmAdmitState(t, 8)
		admit(s, sysA+"first", "k1")
		admit(s, sysB+"second", "k1")
		k1 := admit(s, sysB+"k1 wants b", "k1").Queued
		admit(s, sysA+"k2 wants a", "k2")
		s.Release("a")
		if d := s.Dispatch(now); len(d) != 1 || d[0].W != k1 {
			t.Fatalf("after a's release: %+v, want k1's waiter (its key's turn)", d)
		}
	})
	t.Run("never past a waiter with an objective", func(t *testing.T) {
		s := warmAdmitState(t, 8)
		answered(s, admit(s, sysA+"first", "k").Target)
		answered(s, admit(s, sysB+"second", "k").Target)
		admit(s, "cold head, no objective", "k") // due at its deadline, now + 30 s
		// Due after the head (now + 30.5 s), so behind it in the flow.
		timed := s.Admit(&Request{Model: "m", Prompt: "cold, with an objective", Ask: Ask{Objective: 29500 * time.Millisecond}}, "k", nil, now.Add(time.Second)).Queued
		warm := s.Admit(&Request{Model: "m", Prompt: sysA + "warm on a"}, "k", nil, now.Add(2*time.Second)).Queued
		if warm == nil || timed == nil {
			t.Fatal("not queued")
		}
		s.Release("a")
		if d := s.Dispatch(now.Add(2 * time.Second)); len(d) != 1 || d[0].W == warm {
			t.Fatalf("after a's release: %+v, want no warm waiter passing one with an objective", d)
		}
	})
	t.Run("head passed over at most WarmWindow times", func(t *testing.T) {
		s := warmAdmitState(t, 4*WarmWindow)
		answered(s, admit(s, sysA+"first", "k").Target)
		answered(s, admit(s, sysB+"second", "k").Target)
		head := admit(s, "cold prompt held by no worker", "k").Queued
		for i := range 2 * WarmWindow {
			if admit(s, sysA+fmt.Sprint("warm ", i), "k").Queued == nil {
				t.Fatal("not queued")
			}
		}
		for n := 1; n <= WarmWindow+1; n++ {
			s.Release("a")
			d := s.Dispatch(now)
			if len(d) != 1 {
				t.Fatalf("dispatch %d: %+v", n, d)
			}
			if d[0].W == head {
				if n != WarmWindow+1 {
					t.Fatalf("head left at dispatch %d, want %d", n, WarmWindow+1)
				}
				return
			}
		}
		t.Fatalf("head still waiting after %d dispatches", WarmWindow+1)
	})
}

// TestDispatchAfterDeadlineBeforeExpire: a slot frees (a Release) after a
// waiter's deadline but before its deadline timer ran Expire: Dispatch
// refuses that waiter with overloaded and gives it no target, and the
// slot stays free for the next request.
func TestDispatchAfterDeadlineBeforeExpire(t *testing.T) {
	s := admitState(t, 1, 4)
	s.cfg.Admission.QueueTimeout = 2 * time.Second
	s.Admit(&Request{Model: "m"}, "k", pid("p0"), now)
	s.Admit(&Request{Model: "m"}, "k", pid("p1"), now)
	q := s.Admit(&Request{Model: "m"}, "k", pid("q"), now).Queued
	if q == nil {
		t.Fatal("not queued")
	}
	s.Release("a")
	d := s.Dispatch(now.Add(2 * time.Second))
	if len(d) != 1 || d[0].W != q || !errors.Is(d[0].Err, ErrOverloaded) || d[0].Target.Worker.ID != "" {
		t.Fatalf("dispatch past the deadline: %+v, want the waiter refused overloaded with no target", d)
	}
	if s.InFlight("a") != 0 {
		t.Fatalf("a has %d in flight: the refused waiter took the slot", s.InFlight("a"))
	}
	if x := s.Expire(q.Seq, now.Add(2*time.Second)); x.W != nil {
		t.Fatal("the deadline timer found the waiter still queued")
	}
}

// TestFullQueueRefusesKeyOneShortOfHeaviest: at a full queue, a key with
// one waiter fewer than the heaviest key is refused, not let in by
// displacing the heaviest's newest (that would only swap which key is
// heaviest); a key two short displaces.
func TestFullQueueRefusesKeyOneShortOfHeaviest(t *testing.T) {
	s := admitState(t, 1, 3)
	s.Admit(&Request{Model: "m"}, "k", pid("p0"), now)
	s.Admit(&Request{Model: "m"}, "k", pid("p1"), now)
	for i, key := range []string{"heavy", "heavy", "light"} {
		if ad := s.Admit(&Request{Model: "m"}, key, pid(fmt.Sprint("w", i)), now); ad.Queued == nil {
			t.Fatalf("waiter %d not queued: %+v", i, ad)
		}
	}
	ad := s.Admit(&Request{Model: "m"}, "light", pid("light2"), now)
	if !errors.Is(ad.Err, ErrOverloaded) || ad.Queued != nil || ad.Displaced != nil {
		t.Fatalf("a key one short of the heaviest at a full queue: %+v, want refused overloaded", ad)
	}
	if got := s.QueueLengths()["m"]; got != 3 {
		t.Fatalf("queue holds %d, want 3", got)
	}
	if ad := s.Admit(&Request{Model: "m"}, "new", pid("new"), now); ad.Queued == nil || ad.Displaced == nil || ad.Displaced.Key != "heavy" {
		t.Fatalf("a key two short: %+v, want it to displace heavy's newest", ad)
	}
}

// TestDispatchLooksPastHeadItCannotServe: a waiter that cannot use the
// worker that has room (a failover retry that excludes it, a cascade
// request for another step, one drawn for another backend of a canary
// route, a follow-up pinned to a busy worker) does
// not hold back the waiters behind it that can; it keeps its place and
// leaves first once a worker it can use frees.
func TestDispatchLooksPastHeadItCannotServe(t *testing.T) {
	cascade := []routes.Route{{Model: "auto", Cascade: []routes.Step{{Model: "smol", AcceptIf: "mean_logprob > -1"}, {Model: "big"}}}}
	cases := []struct {
		name    string
		rs      []routes.Route
		workers []fleet.Worker
		fill    []Request // one per worker, taking its only slot
		head    Request   // waits first, for a worker that stays busy
		behind  Request   // waits behind it, for the worker that frees
		frees   string
		stays   string // the worker the head waits for
		// perWorker: limits bind on each worker (limit_scope = "worker"),
		// which a pinned request waits for.
		perWorker bool
	}{
		{
			name:    "failover retry",
			workers: []fleet.Worker{w("a", "m", fleet.RoleUnified, 0, 0), w("b", "m", fleet.RoleUnified, 0, 0)},
			fill:    []Request{{Model: "m"}, {Model: "m"}},
			head:    Request{Model: "m", RequestID: "retry", Exclude: map[string]bool{"b": true}},
			behind:  Request{Model: "m", RequestID: "new"},
			frees:   "b", stays: "a",
		},
		{
			name:    "cascade steps",
			rs:      cascade,
			workers: []fleet.Worker{w("s1", "smol", fleet.RoleUnified, 0, 0), w("b1", "big", fleet.RoleUnified, 0, 0)},
			fill:    []Request{{Model: "auto"}, {Model: "auto", Stream: true}},
			head:    Request{Model: "auto", RequestID: "streamed", Stream: true}, // the last step's
			behind:  Request{Model: "auto", RequestID: "first step"},
			frees:   "s1", stays: "b1",
		},
		{
			name:    "canary backends",
			rs:      []routes.Route{{Model: "smol", Backends: []routes.Backend{{Model: "v3", Weight: 0.5}, {Model: "v4", Weight: 0.5}}}},
			workers: []fleet.Worker{w("a", "v3", fleet.RoleUnified, 0, 0), w("b", "v4", fleet.RoleUnified, 0, 0)},
			fill:    []Request{{Model: "smol", RequestID: "c0"}, {Model: "smol", RequestID: "c2"}}, // drawn for v3, v4
			head:    Request{Model: "smol", RequestID: "c1"},                                       // v3
			behind:  Request{Model: "smol", RequestID: "c5"},                                       // v4
			frees:   "b", stays: "a",
		},
		{
			name:    "pinned follow-up",
			workers: []fleet.Worker{w("a", "m", fleet.RoleUnified, 0, 0), w("b", "m", fleet.RoleUnified, 0, 0)},
			fill:    []Request{{Model: "m"}, {Model: "m"}},
			head:    Request{Model: "m", RequestID: "follow-up", Pin: "a"},
			behind:  Request{Model: "m", RequestID: "new"},
			frees:   "b", stays: "a", perWorker: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := state(t, policy.NameLeastOutstanding, tc.rs)
			s.cfg.Admission = AdmissionConfig{Enabled: true, PerWorker: tc.perWorker, Worker: 1, QueueSize: 8, QueueTimeout: 30 * time.Second}
			for _, x := range tc.workers {
				s.SetWorker(x)
			}
			for i, r := range tc.fill {
				if ad := s.Admit(&r, "k", pid(fmt.Sprint("fill", i)), now); ad.Err != nil || ad.Queued != nil {
					t.Fatalf("fill %d: %+v", i, ad)
				}
			}
			head := s.Admit(&tc.head, "k", pid("head"), now).Queued
			behind := s.Admit(&tc.behind, "k", pid("behind"), now.Add(time.Millisecond))
			if head == nil || behind.Queued == nil {
				t.Fatalf("not queued: head %v, behind %+v", head, behind)
			}
			if d := s.Dispatch(now.Add(time.Millisecond)); len(d) != 0 {
				t.Fatalf("dispatched with every worker busy: %+v", d)
			}
			s.Release(tc.frees)
			d := s.Dispatch(now.Add(2 * time.Millisecond))
			if len(d) != 1 || d[0].W != behind.Queued || d[0].Err != nil || d[0].Target.Worker.ID != tc.frees {
				t.Fatalf("after %s frees: %+v, want the waiter behind the head on %s", tc.frees, d, tc.frees)
			}
			if !head.entry.Queued() {
				t.Fatal("the head left the queue")
			}
			s.Release(tc.stays)
			d = s.Dispatch(now.Add(3 * time.Millisecond))
			if len(d) != 1 || d[0].W != head || d[0].Err != nil || d[0].Target.Worker.ID != tc.stays {
				t.Fatalf("after %s frees: %+v, want the head on %s", tc.stays, d, tc.stays)
			}
			if n := len(s.QueueLengths()); n != 0 {
				t.Fatalf("queues left: %v", s.QueueLengths())
			}
		})
	}
}

// canaryState has route smol split 0.9 to v3 (worker a) and 0.1 to v4
// (worker b), each worker allowed one request, and a queue of size.
func canaryState(t *testing.T, size int) *State {
	t.Helper()
	s := state(t, policy.NameLeastOutstanding,
		[]routes.Route{{Model: "smol", Backends: []routes.Backend{{Model: "v3", Weight: 0.9}, {Model: "v4", Weight: 0.1}}}})
	s.cfg.Admission = AdmissionConfig{Enabled: true, Worker: 1, QueueSize: size, QueueTimeout: 30 * time.Second}
	s.SetWorker(w("a", "v3", fleet.RoleUnified, 0, 0))
	s.SetWorker(w("b", "v4", fleet.RoleUnified, 0, 0))
	return s
}

// TestCanaryKeepsItsShareWhenFull: under admission control, a request
// drawn for a canary route's backend whose workers are all at their
// limit waits for them; it does not spill onto the other backend, which
// would give a 0.1 canary the overflow of the 0.9 one.
func TestCanaryKeepsItsShareWhenFull(t *testing.T) {
	s := canaryState(t, 100)
	stable := drawnFor(s.table.Resolve("smol"), "v3", "req-", 3)
	if ad := s.Admit(&Request{Model: "smol", RequestID: stable[0]}, "k", pid("first"), now); ad.Err != nil || ad.Target.ServedModel != "v3" {
		t.Fatalf("first request: %+v", ad)
	}
	for _, id := range stable[1:] {
		ad := s.Admit(&Request{Model: "smol", RequestID: id}, "k", pid(id), now)
		if ad.Queued == nil {
			t.Fatalf("request %s drawn for v3 while v3 is full: served by %q (err %v), want it queued", id, ad.Target.ServedModel, ad.Err)
		}
	}
	// A backend with no routable worker left still falls back.
	s.RemoveWorker("a")
	if d := s.Dispatch(now); len(d) != 1 || d[0].Err != nil || d[0].Target.ServedModel != "v4" {
		t.Fatalf("v3 gone: %+v, want the first waiter served by v4", d)
	}
}

// drawnFor returns n request ids that route r draws for backend, the
// first from the id prefix+i with i from 0.
func drawnFor(r routes.Route, backend, prefix string, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if id := fmt.Sprint(prefix, i); routes.PickBackend(r, id) == backend {
			out = append(out, id)
		}
	}
	return out
}

// TestFullCanaryHoldsNoOtherBackend: a canary backend whose workers are
// full fills its route's queue with its waiters; a request drawn for the
// other backend, whose worker is idle, is served at once: it neither
// joins behind them, nor is refused because their queue is full, nor
// counts them in its wait.
func TestFullCanaryHoldsNoOtherBackend(t *testing.T) {
	s := canaryState(t, 4)
	r := s.table.Resolve("smol")
	for i, id := range drawnFor(r, "v4", "canary", 5) { // one on b, four waiting: the queue is full
		ad := s.Admit(&Request{Model: "smol", RequestID: id}, "k", pid(id), now)
		if i == 0 && ad.Target.Worker.ID != "b" || i > 0 && ad.Queued == nil {
			t.Fatalf("canary request %d: %+v", i, ad)
		}
	}
	objective := Ask{Objective: time.Millisecond}
	for i, id := range drawnFor(r, "v3", "stable", 3) {
		ad := s.Admit(&Request{Model: "smol", RequestID: id, Ask: objective}, "k", pid(id), now)
		if ad.Err != nil || ad.Queued != nil || ad.Target.Worker.ID != "a" {
			t.Fatalf("stable request %d, a idle: %+v, want it served on a", i, ad)
		}
		s.Release("a")
	}
}
