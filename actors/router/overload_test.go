package router_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
)

// TestEjectionEndsAfterBackoff: a refused worker is ejected for base_time
// (10 s), whatever its heartbeats say; it is picked again exactly when the
// ejection ends; its second ejection lasts 2 × base, its third is capped at
// max_time (25 s).
func TestEjectionEndsAfterBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ejections []time.Duration
		cfg := router.Config{Policy: policy.NameLeastOutstanding,
			Ejection: router.EjectionConfig{Failures: 3, Refused: 1, Base: 10 * time.Second, Max: 25 * time.Second, MaxPercent: 50}}
		cfg.Observe.OnEject = func(_, _, reason string, until time.Time) {
			if reason != "refused" {
				t.Errorf("reason %q", reason)
			}
			ejections = append(ejections, time.Until(until))
		}
		e := newEnv(t, cfg, nil)
		beat := func() {
			e.beat(unified("a", "m", 0))
			e.beat(unified("b", "m", 0))
		}
		beat()
		// pick routes once and releases; loads tie, so a wins when routable.
		pick := func() string {
			tg := e.mustRoute(router.Request{Model: "m", RequestID: "r"})
			e.sys.Root.Send(e.router, &router.Release{WorkerID: tg.Worker.ID})
			return tg.Worker.ID
		}
		if got := pick(); got != "a" {
			t.Fatalf("before any failure picked %s", got)
		}
		for round, want := range []time.Duration{10 * time.Second, 20 * time.Second, 25 * time.Second} {
			start := time.Now()
			e.sys.Root.Send(e.router, &router.AttemptFailed{WorkerID: "a", Reason: "refused"})
			synctest.Wait()
			// Heartbeats every 2 s keep both live; none ends the ejection.
			for time.Since(start) < want-2*time.Second {
				time.Sleep(2 * time.Second)
				beat()
				if got := pick(); got != "b" {
					t.Fatalf("round %d: %v into a %v ejection, picked %s", round, time.Since(start), want, got)
				}
			}
			time.Sleep(time.Until(start.Add(want - time.Millisecond)))
			beat()
			if got := pick(); got != "b" {
				t.Fatalf("round %d: 1 ms before the end picked %s", round, got)
			}
			time.Sleep(time.Millisecond)
			if got := pick(); got != "a" {
				t.Fatalf("round %d: at the end of the ejection picked %s, want a", round, got)
			}
		}
		if len(ejections) != 3 || ejections[0] != 10*time.Second || ejections[1] != 20*time.Second || ejections[2] != 25*time.Second {
			t.Fatalf("ejections %v", ejections)
		}
	})
}

// TestQueueDeadline: with every worker at its limit, a Route waits; a
// release serves the next waiter at once; a waiter that reaches
// queue_timeout gets ErrOverloaded with Retry-After.
func TestQueueDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var left []string
		cfg := router.Config{Policy: policy.NameLeastOutstanding,
			Admission: router.AdmissionConfig{Enabled: true, Worker: 1, QueueSize: 8, QueueTimeout: 30 * time.Second}}
		cfg.Observe.OnQueueLeft = func(_, outcome string, waited time.Duration) {
			left = append(left, outcome+":"+waited.String())
		}
		e := newEnv(t, cfg, nil)
		e.beat(unified("a", "m", 0))
		// a stays registered throughout (a worker gone answers its queue).
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Second):
					e.sys.Root.Send(e.reg, &registry.Heartbeat{Status: unified("a", "m", 0), Arrived: time.Now(), Source: fleet.SourceHeartbeat})
				}
			}
		}()
		first := e.mustRoute(router.Request{Model: "m", RequestID: "1", Key: "k"})
		ask := func(id string) *actor.Future {
			return e.sys.Root.RequestFuture(e.router, &router.Route{Request: router.Request{Model: "m", RequestID: id, Key: "k"}}, time.Hour)
		}
		served, late := ask("2"), ask("3")
		time.Sleep(5 * time.Second)
		e.sys.Root.Send(e.router, &router.Release{WorkerID: first.Worker.ID})
		res, err := served.Result()
		if err != nil {
			t.Fatal(err)
		}
		if r := res.(*router.RouteResult); r.Err != nil || r.Target.Worker.ID != "a" || r.Waited != 5*time.Second {
			t.Fatalf("served waiter: %+v", r)
		}
		start := time.Now()
		res, err = late.Result()
		if err != nil {
			t.Fatal(err)
		}
		r := res.(*router.RouteResult)
		if !errors.Is(r.Err, router.ErrOverloaded) || r.Waited != 30*time.Second || r.RetryAfter != time.Second {
			t.Fatalf("late waiter: %+v", r)
		}
		if d := time.Since(start); d != 25*time.Second {
			t.Fatalf("late waiter answered %v after the release, want 25 s", d)
		}
		if len(left) != 2 || left[0] != "served:5s" || left[1] != "overloaded:30s" {
			t.Fatalf("queue events %v", left)
		}
	})
}

// TestQueueAnsweredWhenLastWorkerGoes: a request waiting for the only
// worker of its model is answered no_capacity the moment that worker is
// gone, not overloaded at its queue timeout.
func TestQueueAnsweredWhenLastWorkerGoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := router.Config{Policy: policy.NameLeastOutstanding,
			Admission: router.AdmissionConfig{Enabled: true, Worker: 1, QueueSize: 8, QueueTimeout: 30 * time.Second}}
		e := newEnv(t, cfg, nil)
		e.beat(unified("a", "m", 0))
		e.mustRoute(router.Request{Model: "m", RequestID: "1", Key: "k"})
		waiting := e.sys.Root.RequestFuture(e.router, &router.Route{Request: router.Request{Model: "m", RequestID: "2", Key: "k"}}, time.Hour)
		time.Sleep(time.Second)
		start := time.Now()
		e.sys.Root.Send(e.router, &registry.WorkerGone{ID: "a"})
		res, err := waiting.Result()
		if err != nil {
			t.Fatal(err)
		}
		if r := res.(*router.RouteResult); !errors.Is(r.Err, router.ErrNoCapacity) || time.Since(start) != 0 {
			t.Fatalf("waiter answered %+v after %v, want no_capacity at once", r, time.Since(start))
		}
	})
}

// TestQueueServedWhenEjectionEnds: a request waiting because one worker is
// ejected and the other at its limit is served the moment the ejection
// ends, with no release or heartbeat to wake the queue.
func TestQueueServedWhenEjectionEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := router.Config{Policy: policy.NameLeastOutstanding,
			Ejection:  router.EjectionConfig{Failures: 3, Refused: 1, Base: 4 * time.Second, Max: time.Minute, MaxPercent: 50},
			Admission: router.AdmissionConfig{Enabled: true, Worker: 1, QueueSize: 8, QueueTimeout: 30 * time.Second}}
		e := newEnv(t, cfg, nil)
		e.beat(unified("a", "m", 0))
		e.beat(unified("b", "m", 0))
		start := time.Now()
		e.sys.Root.Send(e.router, &router.AttemptFailed{WorkerID: "a", Reason: "refused"})
		if got := e.mustRoute(router.Request{Model: "m", RequestID: "1"}).Worker.ID; got != "b" {
			t.Fatalf("first request went to %s, want b (a is ejected)", got)
		}
		waiting := e.sys.Root.RequestFuture(e.router, &router.Route{Request: router.Request{Model: "m", RequestID: "2"}}, time.Hour)
		res, err := waiting.Result()
		if err != nil {
			t.Fatal(err)
		}
		r := res.(*router.RouteResult)
		if r.Err != nil || r.Target.Worker.ID != "a" || time.Since(start) != 4*time.Second {
			t.Fatalf("waiter: %+v after %v, want a after 4 s", r, time.Since(start))
		}
	})
}
