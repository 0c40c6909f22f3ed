package registry_test

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/actors/worker"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
	"github.com/tlgate/tlgate/internal/testkit/bubble"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

type harness struct {
	t   *testing.T
	sys *actor.ActorSystem
	reg *actor.PID
}

func newHarness(t *testing.T) *harness {
	return newHarnessWith(t, registry.Config{})
}

// newHarnessWith starts a registry with cfg, T = 2 s and k = 3.
func newHarnessWith(t *testing.T, cfg registry.Config) *harness {
	sys := actorsys.New(zerolog.Nop())
	cfg.Interval, cfg.MissLimit = 2*time.Second, 3
	st := registry.NewState(cfg)
	pid := sys.Root.Spawn(registry.Props(st))
	t.Cleanup(func() {
		_ = sys.Root.StopFuture(pid).Wait()
		sys.Shutdown()
		// protoactor's dead-letter throttle parks a goroutine for one
		// interval; let the fake clock run it out before the bubble ends.
		time.Sleep(2 * time.Second)
	})
	return &harness{t: t, sys: sys, reg: pid}
}

func status(id, model string, queue uint32) *controlv1.WorkerStatus {
	return &controlv1.WorkerStatus{WorkerId: id, Model: model, HttpAddress: "127.0.0.1:1", QueueDepth: queue, Role: controlv1.Role_ROLE_UNIFIED}
}

func (h *harness) beat(s *controlv1.WorkerStatus) *controlv1.HeartbeatAck {
	h.t.Helper()
	res, err := h.sys.Root.RequestFuture(h.reg, &registry.Heartbeat{Status: s, Arrived: time.Now(), Source: fleet.SourceHeartbeat}, time.Second).Result()
	if err != nil {
		h.t.Fatalf("heartbeat: %v", err)
	}
	return res.(*controlv1.HeartbeatAck)
}

func (h *harness) ids(routable bool) []string {
	h.t.Helper()
	res, err := h.sys.Root.RequestFuture(h.reg, &registry.Snapshot{RoutableOnly: routable}, time.Second).Result()
	if err != nil {
		h.t.Fatalf("snapshot: %v", err)
	}
	var out []string
	for _, w := range res.(*registry.SnapshotResult).Workers {
		out = append(out, w.ID)
	}
	return out
}

// TestEvictionExactDeadline is the registry half of the design document's
// worked example: three workers heartbeat at t0, a keeps heartbeating every
// 2 s; at t0+5.999 s all three are listed, at t0+6 s b and c are gone.
func TestEvictionExactDeadline(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		h := newHarness(t)
		events := make(chan any, 16)
		sub := h.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			switch m := c.Message().(type) {
			case *registry.WorkerGone:
				events <- m
			}
		}))
		h.sys.Root.Send(h.reg, &registry.Subscribe{PID: sub})
		t0 := time.Now()
		h.beat(status("a", "smol", 2))
		h.beat(status("b", "smol", 0))
		h.beat(status("c", "smol", 1))
		time.Sleep(2 * time.Second)
		h.beat(status("a", "smol", 2))
		time.Sleep(2 * time.Second)
		h.beat(status("a", "smol", 2))
		time.Sleep(time.Until(t0.Add(5999 * time.Millisecond)))
		synctest.Wait()
		if got := h.ids(false); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Fatalf("at t0+5.999s listed %v, want a b c", got)
		}
		if len(events) != 0 {
			t.Fatalf("eviction before the deadline: %v", <-events)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := h.ids(false); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("at t0+6s listed %v, want a", got)
		}
		gone := map[string]bool{}
		for len(events) > 0 {
			gone[(<-events).(*registry.WorkerGone).ID] = true
		}
		if !gone["b"] || !gone["c"] || len(gone) != 2 {
			t.Fatalf("evictions published %v, want b and c", gone)
		}
		if d := time.Since(t0); d != 6*time.Second {
			t.Fatalf("fake clock at %v", d)
		}
		_ = h.sys.Root.StopFuture(sub).Wait()
	})
}

func TestWorkerActorRestartKeepsStatus(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.beat(status("a", "smol", 7))
		h.beat(status("b", "smol", 1))
		// Find a's actor among the registry's children and crash it.
		synctest.Wait()
		res, err := h.sys.Root.RequestFuture(h.reg, &registry.WorkerPID{ID: "a"}, time.Second).Result()
		if err != nil || res.(*actor.PID) == nil {
			t.Fatalf("no actor for worker a: %v", err)
		}
		h.sys.Root.Send(res.(*actor.PID), &worker.Crash{})
		synctest.Wait()
		res, err = h.sys.Root.RequestFuture(h.reg, &registry.Snapshot{}, time.Second).Result()
		if err != nil {
			t.Fatal(err)
		}
		ws := res.(*registry.SnapshotResult).Workers
		if len(ws) != 2 || ws[0].ID != "a" || ws[0].QueueDepth != 7 || ws[1].ID != "b" {
			t.Fatalf("after crash: %+v", ws)
		}
		// The restarted actor still evicts a on time: at 6 s both are gone
		// only because neither heartbeated; b's actor never noticed.
		time.Sleep(5999 * time.Millisecond)
		synctest.Wait()
		if got := h.ids(false); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("at 5.999s: %v", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := h.ids(false); len(got) != 0 {
			t.Fatalf("at 6s: %v", got)
		}
	})
}

func TestDrainAndSelfDraining(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.beat(status("a", "smol", 0))
		s := status("b", "smol", 0)
		s.Draining = true
		h.beat(s)
		h.beat(status("c", "big", 0))
		if got := h.ids(true); !slices.Equal(got, []string{"a", "c"}) {
			t.Fatalf("routable %v, want a c (b reports draining)", got)
		}
		res, _ := h.sys.Root.RequestFuture(h.reg, &registry.Drain{Model: "smol", On: true}, time.Second).Result()
		if n := res.(*registry.DrainResult).Workers; n != 2 {
			t.Fatalf("drain hit %d workers, want 2", n)
		}
		if ack := h.beat(status("a", "smol", 0)); !ack.Drain {
			t.Fatal("ack after drain does not say drain")
		}
		if ack := h.beat(status("c", "big", 0)); ack.Drain {
			t.Fatal("another model's ack says drain")
		}
		if got := h.ids(true); !slices.Equal(got, []string{"c"}) {
			t.Fatalf("routable %v, want c", got)
		}
		h.sys.Root.Send(h.reg, &registry.Drain{Model: "smol", On: false})
		if ack := h.beat(status("a", "smol", 0)); ack.Drain {
			t.Fatal("ack after resume still says drain")
		}
		if got := h.ids(true); !slices.Equal(got, []string{"a", "c"}) {
			t.Fatalf("routable after resume %v", got)
		}
	})
}

// TestRegistryRestartKeepsWorkers: a panic in the registry itself restarts
// it, which stops its children; the registry respawns them from its state.
func TestRegistryRestartKeepsWorkers(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.beat(status("a", "smol", 0))
		h.beat(status("b", "smol", 0))
		h.sys.Root.Send(h.reg, &registry.Crash{})
		synctest.Wait()
		if got := h.ids(false); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("after registry restart: %v", got)
		}
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if got := h.ids(false); len(got) != 0 {
			t.Fatalf("respawned workers not evicted on time: %v", got)
		}
	})
}
