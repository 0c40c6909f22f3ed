package registry_test

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/testkit/bubble"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

func TestCheckBinding(t *testing.T) {
	t0 := time.Unix(1000, 0)
	bound := fleet.Worker{ID: "ea1", HTTPAddress: "10.0.0.1:8000", Source: fleet.SourceHeartbeat, StartedAt: t0}
	with := func(f func(w *fleet.Worker)) fleet.Worker { w := bound; f(&w); return w }
	for _, tc := range []struct {
		name string
		w    fleet.Worker
		ok   bool
	}{
		{"same engine", bound, true},
		{"status changes", with(func(w *fleet.Worker) { w.QueueDepth, w.Draining, w.Model = 9, true, "other" }), true},
		{"restart in place", with(func(w *fleet.Worker) { w.StartedAt = t0.Add(time.Minute) }), true},
		{"no started_at", with(func(w *fleet.Worker) { w.StartedAt = time.Time{} }), true},
		{"another http address", with(func(w *fleet.Worker) { w.HTTPAddress = "10.6.6.6:8000" }), false},
		{"restart elsewhere before eviction", with(func(w *fleet.Worker) { w.HTTPAddress, w.StartedAt = "10.0.0.2:8000", t0.Add(time.Minute) }), false},
		{"another grpc address", with(func(w *fleet.Worker) { w.GRPCAddress = "10.0.0.1:9000" }), false},
		{"another kv address", with(func(w *fleet.Worker) { w.KVAddress = "10.0.0.1:9100" }), false},
		{"older incarnation", with(func(w *fleet.Worker) { w.StartedAt = t0.Add(-time.Second) }), false},
		{"probe takes a heartbeated id", with(func(w *fleet.Worker) { w.Source = fleet.SourceProbe }), false},
	} {
		err := registry.CheckBinding(bound, tc.w)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, registry.ErrWorkerIDBound) {
			t.Errorf("%s: CheckBinding = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestOwnDrain(t *testing.T) {
	for _, tc := range []struct {
		name                                       string
		prevReported, prevByAck, reported, drained bool
		wantDraining, wantByAck                    bool
	}{
		{"not draining", false, false, false, false, false, false},
		{"engine's own drain", false, false, true, false, true, false},
		{"starts draining on the ack", false, false, true, true, true, true},
		{"already draining when drained", true, false, true, true, true, false},
		{"still draining on the ack", true, true, true, true, true, true},
		{"resumed, engine not told yet", true, true, true, false, false, true},
		{"resumed, engine stopped", true, true, false, false, false, false},
		{"engine's own drain outlives the resume", true, false, true, false, true, false},
	} {
		d, b := registry.OwnDrain(tc.prevReported, tc.prevByAck, tc.reported, tc.drained)
		if d != tc.wantDraining || b != tc.wantByAck {
			t.Errorf("%s: OwnDrain = %v, %v; want %v, %v", tc.name, d, b, tc.wantDraining, tc.wantByAck)
		}
	}
}

func (h *harness) ask(s *controlv1.WorkerStatus) any {
	h.t.Helper()
	res, err := h.sys.Root.RequestFuture(h.reg, &registry.Heartbeat{Status: s, Arrived: time.Now(), Source: fleet.SourceHeartbeat}, time.Second).Result()
	if err != nil {
		h.t.Fatalf("heartbeat: %v", err)
	}
	return res
}

func (h *harness) worker(id string) fleet.Worker {
	h.t.Helper()
	res, err := h.sys.Root.RequestFuture(h.reg, &registry.Snapshot{}, time.Second).Result()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, w := range res.(*registry.SnapshotResult).Workers {
		if w.ID == id {
			return w
		}
	}
	h.t.Fatalf("no worker %s", id)
	return fleet.Worker{}
}

// TestWorkerIDHijackRefused: a heartbeat naming a live worker's id with
// another address is refused (and reported), changes nothing, and does
// not extend the bound worker's life; after the bound worker's eviction
// the id is free.
func TestWorkerIDHijackRefused(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		refused := 0
		h := newHarnessWith(t, registry.Config{OnRefuse: func(fleet.Worker, error) { mu.Lock(); refused++; mu.Unlock() }})
		h.beat(status("ea1", "smol", 0))
		evil := status("ea1", "smol", 0)
		evil.HttpAddress, evil.Draining = "10.6.6.6:80", true
		r, ok := h.ask(evil).(*registry.Refused)
		if !ok || !errors.Is(r.Err, registry.ErrWorkerIDBound) {
			t.Fatalf("impostor heartbeat answered %#v, want Refused(ErrWorkerIDBound)", h.ask(evil))
		}
		mu.Lock()
		n := refused
		mu.Unlock()
		if n != 1 {
			t.Fatalf("OnRefuse called %d times, want 1", n)
		}
		if w := h.worker("ea1"); w.HTTPAddress != "127.0.0.1:1" || w.Draining {
			t.Fatalf("impostor changed the worker: %+v", w)
		}
		// The impostor keeps beating; the real engine stopped. At 6 s the
		// bound worker is evicted all the same, and the id is free.
		for range 5 {
			time.Sleep(time.Second)
			h.ask(evil)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := h.ids(false); len(got) != 0 {
			t.Fatalf("refused heartbeats kept the worker alive: %v", got)
		}
		if _, ok := h.ask(evil).(*controlv1.HeartbeatAck); !ok {
			t.Fatal("after the eviction the id is not free")
		}
	})
}

// TestMaxWorkers: beyond max_workers a new id is refused; known ids and
// probed engines still get through, and an eviction frees a place.
func TestMaxWorkers(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		h := newHarnessWith(t, registry.Config{MaxWorkers: 2})
		h.beat(status("a", "smol", 0))
		h.beat(status("b", "smol", 0))
		r, ok := h.ask(status("c", "smol", 0)).(*registry.Refused)
		if !ok || !errors.Is(r.Err, registry.ErrTooManyWorkers) {
			t.Fatalf("third worker answered %#v, want Refused(ErrTooManyWorkers)", r)
		}
		if _, ok := h.ask(status("a", "smol", 1)).(*controlv1.HeartbeatAck); !ok {
			t.Fatal("a known worker refused at the cap")
		}
		res, err := h.sys.Root.RequestFuture(h.reg, &registry.Heartbeat{Status: status("p", "smol", 0), Arrived: time.Now(), Source: fleet.SourceProbe}, time.Second).Result()
		if _, ok := res.(*controlv1.HeartbeatAck); err != nil || !ok {
			t.Fatalf("a probed engine refused at the cap: %v %v", res, err)
		}
		time.Sleep(6 * time.Second) // all evicted
		synctest.Wait()
		if _, ok := h.ask(status("c", "smol", 0)).(*controlv1.HeartbeatAck); !ok {
			t.Fatal("after evictions a new worker is still refused")
		}
	})
}

// TestResumeRoutableAtOnce: an engine that drained itself on the drain
// ack is routable as soon as the operator resumes, before it reports
// draining: false; a drain the engine started itself is left alone.
func TestResumeRoutableAtOnce(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.beat(status("a", "smol", 0))
		own := status("b", "smol", 0)
		own.Draining = true
		h.beat(own)
		if _, err := h.sys.Root.RequestFuture(h.reg, &registry.Drain{Model: "smol", On: true}, time.Second).Result(); err != nil {
			t.Fatal(err)
		}
		drained := status("a", "smol", 0)
		drained.Draining = true // a obeys the ack
		if ack := h.beat(drained); !ack.Drain {
			t.Fatal("ack does not say drain")
		}
		h.beat(own)
		if _, err := h.sys.Root.RequestFuture(h.reg, &registry.Drain{Model: "smol", On: false}, time.Second).Result(); err != nil {
			t.Fatal(err)
		}
		if got := h.ids(true); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("routable right after the resume: %v, want a", got)
		}
		// a's next heartbeat still says draining (it hears the resume on
		// this ack): it stays routable.
		if ack := h.beat(drained); ack.Drain {
			t.Fatal("ack after the resume says drain")
		}
		if got := h.ids(true); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("routable after a's late draining report: %v, want a", got)
		}
		h.beat(status("a", "smol", 0))
		drained.Draining = true // a drains itself now: its own doing
		h.beat(drained)
		if got := h.ids(true); len(got) != 0 {
			t.Fatalf("an engine's own drain is ignored: routable %v", got)
		}
	})
}

// batchedSubscriber subscribes, batched, an actor that never
// acknowledges a batch (the test does, by hand) and hands each one over.
func (h *harness) batchedSubscriber() (*actor.PID, chan *registry.Changes) {
	batches := make(chan *registry.Changes, 16)
	sub := h.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if b, ok := c.Message().(*registry.Changes); ok {
			batches <- b
		}
	}))
	h.sys.Root.Send(h.reg, &registry.Subscribe{PID: sub, Batched: true})
	return sub, batches
}

// TestBatchedSubscriber: a batched subscriber has at most one batch
// outstanding; what happens meanwhile is coalesced (one entry per worker,
// the latest), and the next batch comes only with the acknowledgement,
// updates of known workers before new ones.
func TestBatchedSubscriber(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		h := newHarness(t)
		sub, batches := h.batchedSubscriber()
		var lastGen uint64
		h.beat(status("a", "smol", 1))
		synctest.Wait()
		b := <-batches
		lastGen = b.Gen
		if len(b.Changed) != 1 || b.Changed[0].ID != "a" {
			t.Fatalf("first batch %+v", b)
		}
		for q := range uint32(5) {
			h.beat(status("a", "smol", q))
		}
		h.beat(status("b", "smol", 0))
		synctest.Wait()
		if len(batches) != 0 {
			t.Fatalf("a second batch before the acknowledgement: %+v", <-batches)
		}
		h.sys.Root.Send(h.reg, &registry.ChangesApplied{Gen: lastGen})
		synctest.Wait()
		b = <-batches
		if len(b.Changed) != 2 || b.Changed[0].ID != "a" || b.Changed[0].QueueDepth != 4 || b.Changed[1].ID != "b" {
			t.Fatalf("coalesced batch %+v, want a (latest, queue 4) then the new b", b.Changed)
		}
		_ = h.sys.Root.StopFuture(sub).Wait()
	})
}

// TestLateStampedHeartbeatKeepsWorker: a heartbeat the edge stamped before
// the deadline but that reaches the registry's mailbox behind the worker
// actor's expiry (the registry was busy: a loaded machine) keeps the
// worker; it is neither evicted nor registered anew.
func TestLateStampedHeartbeatKeepsWorker(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var mu sync.Mutex
		var registeredIDs, evictedIDs []string
		registered := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(registeredIDs) }
		evicted := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(evictedIDs) }
		h := newHarnessWith(t, registry.Config{
			OnRegister: func(w fleet.Worker) {
				mu.Lock()
				registeredIDs = append(registeredIDs, w.ID)
				mu.Unlock()
				if w.ID == "blocker" {
					<-gate // the registry is busy until the test says
				}
			},
			OnEvict: func(w fleet.Worker) { mu.Lock(); evictedIDs = append(evictedIDs, w.ID); mu.Unlock() },
		})
		t0 := time.Now()
		h.beat(status("a", "smol", 0))
		time.Sleep(5900 * time.Millisecond)
		h.sys.Root.Send(h.reg, &registry.Heartbeat{Status: status("blocker", "smol", 0), Arrived: time.Now(), Source: fleet.SourceHeartbeat})
		time.Sleep(time.Until(t0.Add(6*time.Second)) + time.Millisecond)
		synctest.Wait() // a's actor expired; its Expired and Terminated wait
		// a's heartbeat, stamped at 5.95 s, arrives only now.
		h.sys.Root.Send(h.reg, &registry.Heartbeat{Status: status("a", "smol", 3), Arrived: t0.Add(5950 * time.Millisecond), Source: fleet.SourceHeartbeat})
		close(gate)
		synctest.Wait()
		if len(evicted()) != 0 || !slices.Equal(registered(), []string{"a", "blocker"}) {
			t.Fatalf("evicted %v, registered %v; want no eviction and a registered once", evicted(), registered())
		}
		if w := h.worker("a"); w.QueueDepth != 3 {
			t.Fatalf("a after the late heartbeat: %+v", w)
		}
		// Its new deadline holds: evicted at 5.95 + 6 s.
		time.Sleep(time.Until(t0.Add(11950*time.Millisecond)) - time.Millisecond)
		synctest.Wait()
		if !slices.Equal(evicted(), []string{"blocker"}) {
			t.Fatalf("just before a's new deadline evicted %v, want only blocker (its own deadline was 11.9 s)", evicted())
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if !slices.Equal(evicted(), []string{"blocker", "a"}) {
			t.Fatalf("at a's new deadline evicted %v, want blocker then a", evicted())
		}
	})
}

// TestBatchedSubscriberSeesGoneAndBack: a worker evicted and registered
// again while a batch is unacknowledged reaches the subscriber as both
// gone and changed in the next batch, so that it forgets the old
// worker's state (its ejection, its cache entries) before it learns the
// new one; coalescing the two would lose the eviction.
func TestBatchedSubscriberSeesGoneAndBack(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		h := newHarness(t)
		sub, batches := h.batchedSubscriber()
		h.beat(status("a", "smol", 0))
		synctest.Wait()
		b := <-batches // a, not acknowledged yet
		// Past a's deadline (T = 2 s, k = 3): evicted.
		time.Sleep(7 * time.Second)
		synctest.Wait()
		if got := h.ids(false); len(got) != 0 {
			t.Fatalf("listed %v after the deadline, want none", got)
		}
		h.beat(status("a", "smol", 1)) // back
		synctest.Wait()
		h.sys.Root.Send(h.reg, &registry.ChangesApplied{Gen: b.Gen})
		synctest.Wait()
		b = <-batches
		if len(b.Gone) != 1 || b.Gone[0].ID != "a" || len(b.Changed) != 1 || b.Changed[0].ID != "a" || b.Changed[0].QueueDepth != 1 {
			t.Fatalf("batch %+v, want a gone and a changed (queue 1)", b)
		}
		_ = h.sys.Root.StopFuture(sub).Wait()
	})
}

// TestUnreportedStartKeepsTheProcess: a heartbeat without a start time (a
// probe whose read of the engine's metrics failed once) is the process
// known, not a new one: the worker keeps the start time it had, in the
// registry's view and in what its subscribers are told, so none takes it
// for a restart (the router would end its ejection and forget its
// caches); a later start time is a new process.
func TestUnreportedStartKeepsTheProcess(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		h := newHarness(t)
		changed := make(chan fleet.Worker, 16)
		sub := h.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if m, ok := c.Message().(*registry.WorkerChanged); ok {
				changed <- m.Worker
			}
		}))
		h.sys.Root.Send(h.reg, &registry.Subscribe{PID: sub})
		started := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
		for i, at := range []time.Time{started, {}, started.Add(time.Minute)} {
			s := status("a", "smol", 0)
			if !at.IsZero() {
				s.StartedAtUnixMs = uint64(at.UnixMilli())
			}
			h.beat(s)
			synctest.Wait()
			want := at
			if at.IsZero() {
				want = started
			}
			if w := <-changed; !w.StartedAt.Equal(want) {
				t.Fatalf("heartbeat %d: subscribers told started_at %s, want %s", i, w.StartedAt, want)
			}
			res, err := h.sys.Root.RequestFuture(h.reg, &registry.Snapshot{}, time.Second).Result()
			if err != nil {
				t.Fatal(err)
			}
			if w := res.(*registry.SnapshotResult).Workers[0]; !w.StartedAt.Equal(want) {
				t.Fatalf("heartbeat %d: listed started_at %s, want %s", i, w.StartedAt, want)
			}
		}
		_ = h.sys.Root.StopFuture(sub).Wait()
	})
}
