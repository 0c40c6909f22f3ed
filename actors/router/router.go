// Package router is the actor that picks a worker for each attempt. It owns
// the route table and its epoch, the routable view of the workers (fed by
// the registry's change and eviction messages), the gateway's in-flight
// count per worker, the weighted policy's counters and the hash rings. It
// answers Route with a Target and counts the pick as in flight until
// Release. Liveness is checked at pick time against the clock, so a late
// eviction message can never route to a dead worker.
//
// The decisions are the pure methods of State (table-tested); Receive is a
// thin switch over them.
package router

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Route asks for a target; the router responds with *RouteResult.
type Route struct{ Request Request }

// RouteResult is the answer to Route: a target, or an error wrapping
// ErrModelNotFound or ErrNoCapacity.
type RouteResult struct {
	Target Target
	Err    error
	// Took is how long the decision took inside the router.
	Took time.Duration
	// Waited is how long the request waited in its model's queue;
	// RetryAfter, with ErrOverloaded or ErrNoCapacity, is the Retry-After
	// to answer.
	Waited     time.Duration
	RetryAfter time.Duration
	// Class is the request's priority, objective and fairness id as
	// resolved from its ask, its key and its route.
	Class Class
	// Route, with Err, is the route the request matched though it got no
	// target (its metrics' route): the route's model, or the model asked
	// for when it is served without one; "" when the model is not known.
	Route string
}

// Release ends one in-flight request on a worker.
type Release struct{ WorkerID string }

// SetRoutes installs a new, validated route table with its epoch.
type SetRoutes struct {
	Table *routes.Table
	Epoch uint64
}

// ListWorkers asks for the admin view of the workers; the router responds
// with *WorkersResult.
type ListWorkers struct{}

// WorkersResult lists the workers with their in-flight counts and the epoch.
type WorkersResult struct {
	Epoch   uint64
	Workers []WorkerView
	// Queued is the number of requests waiting per model queue; Bands
	// the same per priority band and key.
	Queued map[string]int
	Bands  map[string][]QueueBand
}

// Ready asks whether any worker is routable; the router responds with bool.
type Ready struct{}

// ListModels asks for every model id clients may name (every model Known);
// the router responds with []string (sorted).
type ListModels struct{}

// ListAdapters asks for the LoRA adapters known workers serve; the router
// responds with map[string]string (adapter id -> base model).
type ListAdapters struct{}

// Known asks whether a model is known (State.Known): a route, a worker's
// model, a configured one, or one served recently; the router responds
// with bool.
type Known struct{ Model string }

// LiftEjection ends a worker's ejection on an operator's word, and has
// the peers end it too; the router responds with *LiftResult.
type LiftEjection struct{ Worker string }

// LiftResult is the answer to LiftEjection: whether the router knows the
// worker, whether it was ejected, and whether the peers were told (fleet
// sync on).
type LiftResult struct{ Known, Lifted, Told bool }

// Crash makes the router panic: drills use it to check a restarted router
// rebuilds its view from the registry and keeps its in-flight counts.
type Crash struct{}

// Props returns the router actor's props over st. On every start it
// subscribes to the registry, which answers with a full snapshot.
func Props(st *State, registryPID *actor.PID) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &routerActor{st: st, registry: registryPID} })
}

type routerActor struct {
	st       *State
	registry *actor.PID
	timers   *scheduler.TimerScheduler // queue deadlines
}

// Receive is the actor's thin switch.
func (a *routerActor) Receive(ctx actor.Context) {
	st := a.st
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.timers = scheduler.NewTimerScheduler(ctx.ActorSystem().Root)
		if a.registry != nil {
			ctx.Send(a.registry, &registry.Subscribe{PID: ctx.Self(), Batched: true})
		}
	case *Route:
		a.route(ctx, m)
	case *Release:
		st.Release(m.WorkerID)
		a.dispatch(ctx)
	case *AttemptFailed:
		a.attemptFailed(ctx, m)
	case *ejectionEnded:
		a.dispatch(ctx)
	case *AttemptSucceeded:
		now := time.Now()
		st.AttemptSucceeded(m.WorkerID)
		st.Indexed(m.Indexing, now)
		st.TTFTObserved(m.WorkerID, m.Queue, m.Priority, m.FirstByte, now)
	case *KVEvents:
		r := st.ApplyKV(m, time.Now())
		if m.Done != nil {
			m.Done()
		}
		if f := st.cfg.Observe.OnKVApplied; f != nil {
			f(r)
		}
	case *Leave:
		a.leave(ctx, m)
	case *queueDeadline:
		a.expire(ctx, m)
	case *registry.WorkerChanged:
		st.SetWorker(m.Worker)
		a.dispatch(ctx)
	case *registry.WorkerGone:
		st.RemoveWorker(m.ID)
		a.dispatch(ctx) // its waiters may have no worker left: answered now
	case *registry.Changes:
		for _, g := range m.Gone {
			st.RemoveWorker(g.ID)
		}
		for _, w := range m.Changed {
			st.SetWorker(w)
		}
		ctx.Respond(&registry.ChangesApplied{Gen: m.Gen})
		if len(m.Changed) > 0 || len(m.Gone) > 0 {
			a.dispatch(ctx)
		}
	case *registry.SnapshotResult:
		st.ResetWorkers(m.Workers)
		a.dispatch(ctx)
	case *SetRoutes:
		st.SetRoutes(m.Table, m.Epoch)
	case *ListWorkers:
		ctx.Respond(&WorkersResult{Epoch: st.epoch, Workers: st.Workers(time.Now()), Queued: st.QueueLengths(), Bands: st.QueueBands()})
	case *Ready:
		ctx.Respond(st.Ready(time.Now()))
	case *ListModels:
		ctx.Respond(st.Models(time.Now()))
	case *ListAdapters:
		ctx.Respond(st.Adapters())
	case *Known:
		ctx.Respond(st.Known(m.Model, time.Now()))
	case *Serving:
		ctx.Respond(st.ServingOf(m.Models, time.Now()))
	case *SetConfigured:
		st.SetConfigured(m.Models)
	case *SetDown:
		st.SetDown(m.Engines)
	case *SyncInbox:
		now := time.Now()
		for _, b := range m.Take() {
			a.applied(ctx, st.ApplyPeer(&b, now))
		}
	case *ApplySnapshot:
		if m.Snapshot != nil {
			a.applied(ctx, st.ApplySnapshot(m.Replica, m.Snapshot, time.Now()))
		}
	case *ApplyStored:
		a.applied(ctx, st.ApplyStored(m.Replica, m.Stored, time.Now()))
	case *SyncTick:
		if st.ExpirePeers(time.Now()) {
			a.dispatch(ctx)
		}
		st.ExpirePending(time.Now())
		if st.syncing() {
			st.cfg.Sync.Syncer.Tick(TickReport{Own: st.OwnLoad(), Peers: len(st.peers), Uncorroborated: st.Uncorroborated()})
		}
	case *SyncSnapshot:
		a.snapshotStep(ctx, snapshotStep{job: st.PlanSnapshot(m.MaxChunks, m.MaxBytes, time.Now()), to: ctx.Sender()})
	case snapshotStep:
		a.snapshotStep(ctx, m)
	case *LiftEjection:
		now := time.Now()
		known := st.workers[m.Worker] != nil
		res := &LiftResult{Known: known}
		if known {
			res.Lifted = st.LiftEjection(m.Worker, now)
			if st.syncing() {
				st.cfg.Sync.Syncer.Lifted(m.Worker)
				res.Told = true
			}
		}
		ctx.Respond(res)
		if res.Lifted {
			a.dispatch(ctx)
		}
	case *Crash:
		panic("router: crash requested")
	}
}

// snapshotStep is a snapshot being built for to.
type snapshotStep struct {
	job *SnapshotJob
	to  *actor.PID
}

// snapshotHashesPerStep bounds the index hashes one message copies into a
// snapshot: the router handles the messages that came meanwhile before
// the next share.
const snapshotHashesPerStep = 8192

// snapshotStep copies the next share of st's snapshot, then sends it to
// its asker when it is done, or the rest of the job to itself.
func (a *routerActor) snapshotStep(ctx actor.Context, st snapshotStep) {
	if a.st.FillSnapshot(st.job, snapshotHashesPerStep) {
		if st.to != nil {
			ctx.Send(st.to, st.job.Snapshot)
		}
		return
	}
	ctx.Send(ctx.Self(), st)
}

// applied reports what a peer's batch did, sets the timers of the
// ejections it applied and serves the waiters its releases allow.
func (a *routerActor) applied(ctx actor.Context, r PeerApplied) {
	if a.st.syncing() {
		a.st.cfg.Sync.Syncer.Applied(r)
	}
	now := time.Now()
	for _, until := range r.Ejected {
		a.timers.SendOnce(until.Sub(now), ctx.Self(), &ejectionEnded{})
	}
	if r.Released {
		a.dispatch(ctx)
	}
}
