package router_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
	"github.com/tlgate/tlgate/internal/testkit/bubble"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

type env struct {
	t      *testing.T
	sys    *actor.ActorSystem
	reg    *actor.PID
	router *actor.PID
	rst    *router.State
}

func newEnv(t *testing.T, cfg router.Config, rs []routes.Route) *env {
	t.Helper()
	sys := actorsys.New(zerolog.Nop())
	reg := sys.Root.Spawn(registry.Props(registry.NewState(registry.Config{Interval: 2 * time.Second, MissLimit: 3})))
	table, err := routes.NewTable(rs)
	if err != nil {
		t.Fatal(err)
	}
	st := router.NewState(cfg, table, 1)
	rt := sys.Root.Spawn(router.Props(st, reg))
	t.Cleanup(func() {
		_ = sys.Root.StopFuture(rt).Wait()
		_ = sys.Root.StopFuture(reg).Wait()
		sys.Shutdown()
		time.Sleep(2 * time.Second) // let protoactor's dead-letter throttle finish
	})
	return &env{t: t, sys: sys, reg: reg, router: rt, rst: st}
}

func (e *env) beat(s *controlv1.WorkerStatus) {
	e.t.Helper()
	if _, err := e.sys.Root.RequestFuture(e.reg, &registry.Heartbeat{Status: s, Arrived: time.Now(), Source: fleet.SourceHeartbeat}, time.Second).Result(); err != nil {
		e.t.Fatal(err)
	}
	synctest.Wait() // the router has the change
}

func (e *env) route(req router.Request) (router.Target, error) {
	e.t.Helper()
	res, err := e.sys.Root.RequestFuture(e.router, &router.Route{Request: req}, time.Second).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	r := res.(*router.RouteResult)
	return r.Target, r.Err
}

func (e *env) mustRoute(req router.Request) router.Target {
	e.t.Helper()
	tg, err := e.route(req)
	if err != nil {
		e.t.Fatalf("route %+v: %v", req, err)
	}
	return tg
}

func (e *env) listed() []string {
	e.t.Helper()
	res, err := e.sys.Root.RequestFuture(e.reg, &registry.Snapshot{}, time.Second).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	var ids []string
	for _, w := range res.(*registry.SnapshotResult).Workers {
		ids = append(ids, w.ID)
	}
	return ids
}

func unified(id, model string, queue uint32) *controlv1.WorkerStatus {
	return &controlv1.WorkerStatus{WorkerId: id, Model: model, HttpAddress: "127.0.0.1:1", QueueDepth: queue, KvTotalBlocks: 10, Role: controlv1.Role_ROLE_UNIFIED}
}

// TestHandExample is section 3 of the design document, whole: queue depths
// a=2, b=0, c=1 under least_outstanding; r1 goes to b; with two in flight
// on b, r2 goes to c; a heartbeats at +2 s and +4 s; at +5.999 s all three
// are listed; at +6 s b and c are evicted and r3 goes to a.
func TestHandExample(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		e := newEnv(t, router.Config{Policy: policy.NameLeastOutstanding}, nil)
		t0 := time.Now()
		e.beat(unified("a", "smol", 2))
		e.beat(unified("b", "smol", 0))
		e.beat(unified("c", "smol", 1))
		req := router.Request{Model: "smol", RequestID: "r1"}
		if got := e.mustRoute(req).Worker.ID; got != "b" {
			t.Fatalf("r1 went to %s, want b (loads 2, 0, 1)", got)
		}
		// A second request lands on b too (loads 2, 1, 1: tie to the
		// smallest id), so two are in flight on b: loads 2, 2, 1.
		if got := e.mustRoute(router.Request{Model: "smol", RequestID: "r1b"}).Worker.ID; got != "b" {
			t.Fatalf("second request went to %s, want b", got)
		}
		if got := e.mustRoute(router.Request{Model: "smol", RequestID: "r2"}).Worker.ID; got != "c" {
			t.Fatalf("r2 went to %s, want c (loads 2, 2, 1)", got)
		}
		time.Sleep(time.Until(t0.Add(2 * time.Second)))
		e.beat(unified("a", "smol", 2))
		time.Sleep(time.Until(t0.Add(4 * time.Second)))
		e.beat(unified("a", "smol", 2))
		time.Sleep(time.Until(t0.Add(5999 * time.Millisecond)))
		synctest.Wait()
		if got := e.listed(); len(got) != 3 {
			t.Fatalf("at t0+5.999s listed %v, want a b c", got)
		}
		time.Sleep(time.Until(t0.Add(6 * time.Second)))
		// Liveness is checked at pick time: even before the eviction
		// messages are processed, r3 cannot go to b or c.
		if got := e.mustRoute(router.Request{Model: "smol", RequestID: "r3"}).Worker.ID; got != "a" {
			t.Fatalf("r3 went to %s, want a", got)
		}
		synctest.Wait()
		if got := e.listed(); len(got) != 1 || got[0] != "a" {
			t.Fatalf("at t0+6s listed %v, want a", got)
		}
	})
}

func TestModelNotFoundAndNoCapacity(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		e := newEnv(t, router.Config{Policy: policy.NameLeastOutstanding}, []routes.Route{{Model: "big"}})
		ready := func() bool {
			res, err := e.sys.Root.RequestFuture(e.router, &router.Ready{}, time.Second).Result()
			if err != nil {
				t.Fatal(err)
			}
			return res.(bool)
		}
		if ready() {
			t.Fatal("ready with no worker")
		}
		if _, err := e.route(router.Request{Model: "nope", RequestID: "x"}); !errors.Is(err, router.ErrModelNotFound) {
			t.Fatalf("unknown model: %v, want ErrModelNotFound", err)
		}
		if _, err := e.route(router.Request{Model: "big", RequestID: "x"}); !errors.Is(err, router.ErrNoCapacity) {
			t.Fatalf("routed model without workers: %v, want ErrNoCapacity", err)
		}
		e.beat(unified("w1", "smol", 0))
		if !ready() {
			t.Fatal("not ready with a routable worker")
		}
		// Known by its worker; once the worker is excluded, no capacity.
		if _, err := e.route(router.Request{Model: "smol", RequestID: "x", Exclude: map[string]bool{"w1": true}}); !errors.Is(err, router.ErrNoCapacity) {
			t.Fatalf("all excluded: %v, want ErrNoCapacity", err)
		}
		// A drained model is known but not routable.
		if _, err := e.sys.Root.RequestFuture(e.reg, &registry.Drain{Model: "smol", On: true}, time.Second).Result(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if _, err := e.route(router.Request{Model: "smol", RequestID: "x"}); !errors.Is(err, router.ErrNoCapacity) {
			t.Fatalf("drained: %v, want ErrNoCapacity", err)
		}
		if ready() {
			t.Fatal("ready with only a drained worker")
		}
	})
}

func TestRouterRestartKeepsViewAndInFlight(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		e := newEnv(t, router.Config{Policy: policy.NameLeastOutstanding}, nil)
		e.beat(unified("a", "smol", 0))
		e.beat(unified("b", "smol", 0))
		first := e.mustRoute(router.Request{Model: "smol", RequestID: "1"}).Worker.ID
		e.sys.Root.Send(e.router, &router.Crash{})
		synctest.Wait()
		res, err := e.sys.Root.RequestFuture(e.router, &router.ListWorkers{}, time.Second).Result()
		if err != nil {
			t.Fatal(err)
		}
		ws := res.(*router.WorkersResult).Workers
		if len(ws) != 2 {
			t.Fatalf("after restart the router knows %d workers, want 2", len(ws))
		}
		for _, w := range ws {
			want := 0
			if w.ID == first {
				want = 1
			}
			if w.InFlight != want {
				t.Fatalf("worker %s in flight %d after restart, want %d", w.ID, w.InFlight, want)
			}
		}
		// The in-flight request still counts: the next goes elsewhere.
		if got := e.mustRoute(router.Request{Model: "smol", RequestID: "2"}).Worker.ID; got == first {
			t.Fatalf("second request went to %s again", got)
		}
	})
}
