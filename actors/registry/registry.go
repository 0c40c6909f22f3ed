// Package registry is the actor that keeps the live set of workers. It spawns
// one worker actor per engine on its first heartbeat and forwards later ones,
// answers each heartbeat with the ack (drain flag, route epoch, interval),
// supervises its children (a crashing worker actor is restarted with its last
// status; its siblings are untouched), applies operator drains, and tells its
// subscribers (the router) of every change and eviction; the router gets
// them in coalesced, acknowledged batches (Changes), so a heartbeat flood
// never queues more than one batch ahead of the requests it routes.
//
// A worker id is bound to the engine that registered it until it is
// evicted (CheckBinding), and at most MaxWorkers workers register by
// heartbeat; a heartbeat that breaks either rule is answered *Refused.
//
// Its own logic is kept tiny, and its state lives outside the actor instance:
// if the registry itself is restarted (which stops all its children), it
// respawns a worker actor for every worker it knew, with the same status and
// deadline, so a registry fault never drops the fleet.
package registry

import (
	"fmt"
	"sort"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/worker"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// Heartbeat is one validated status from an engine (or a probe of one),
// stamped with its arrival time by the edge. The registry responds with a
// *controlv1.HeartbeatAck, or *Refused.
type Heartbeat struct {
	Status  *controlv1.WorkerStatus
	Arrived time.Time
	Source  string // fleet.SourceHeartbeat or fleet.SourceProbe
	Kind    string // the probed engine's kind, if any
	// BootstrapPort is a probed SGLang prefill engine's bootstrap port.
	BootstrapPort int
}

// Refused answers a heartbeat the registry did not take: Err wraps
// ErrWorkerIDBound or ErrTooManyWorkers and says why.
type Refused struct{ Err error }

// Drain starts (On) or ends (!On) an operator drain of the workers serving
// Model. The registry responds with DrainResult.
type Drain struct {
	Model string
	On    bool
}

// DrainResult says how many known workers serve the drained model.
type DrainResult struct{ Workers int }

// Snapshot asks for every live worker; the registry responds with
// *SnapshotResult. With RoutableOnly, only workers routable at the time of
// the answer are listed.
type Snapshot struct{ RoutableOnly bool }

// SnapshotResult lists workers sorted by id, with the route epoch.
type SnapshotResult struct {
	Workers []fleet.Worker
	Epoch   uint64
}

// SetEpoch tells the registry the route table's epoch, sent in every ack.
type SetEpoch struct{ Epoch uint64 }

// Subscribe registers PID for WorkerChanged and WorkerGone messages, or,
// with Batched, for *Changes; the registry first sends it a *SnapshotResult
// of every known worker so a (re)started subscriber can rebuild its view.
type Subscribe struct {
	PID     *actor.PID
	Batched bool
}

// WorkerChanged tells subscribers a worker's new snapshot.
type WorkerChanged struct{ Worker fleet.Worker }

// WorkerGone tells subscribers a worker was evicted.
type WorkerGone struct {
	ID     string
	Reason string
}

// Forget removes a worker at once (a probed engine taken out of the
// configuration); the registry responds with true if it knew the worker.
type Forget struct{ ID string }

// WorkerPID asks for the actor of worker ID; the registry responds with
// *actor.PID (nil when unknown). Drills use it to crash one worker actor.
type WorkerPID struct{ ID string }

// Crash makes the registry actor panic: drills use it to check that a
// registry restart keeps every worker.
type Crash struct{}

// Config holds the registry's liveness settings.
type Config struct {
	Interval  time.Duration // heartbeat interval T
	MissLimit int           // k
	Epoch     uint64        // initial route epoch
	// OnEvict, if set, is called (from the actor) for every eviction; the
	// composition root uses it for metrics and logs.
	OnEvict func(w fleet.Worker)
	// OnRegister, if set, is called for every worker's first heartbeat.
	OnRegister func(w fleet.Worker)
	// OnGone, if set, is called (from the actor) for every worker that
	// leaves the registry: evicted (after OnEvict) or forgotten.
	OnGone func(w fleet.Worker)
	// MaxWorkers caps the workers registered by heartbeat (probed engines,
	// bounded by the configuration, are not counted); a new id beyond it
	// is refused with ErrTooManyWorkers. 0 means no cap.
	MaxWorkers int
	// OnRefuse, if set, is called (from the actor) for every refused
	// heartbeat, with the status it carried and the reason.
	OnRefuse func(w fleet.Worker, err error)
}

// TTL is how long a heartbeat keeps a worker live: k·T.
func (c Config) TTL() time.Duration { return time.Duration(c.MissLimit) * c.Interval }

// State is the registry's state, kept outside the actor instance so that it
// survives the actor's restart.
type State struct {
	cfg         Config
	entries     map[string]*entry
	drained     map[string]bool
	epoch       uint64
	subscribers []*subscriber
	winding     bool   // restarting or stopping: children are going away
	heartbeated int    // entries that came by heartbeat, not by probe
	gens        uint64 // Subscribes so far: each gets the next generation
	// byPID maps a worker actor's PID id to its worker id, so that a
	// Terminated costs O(1), not a scan of every entry.
	byPID map[string]string
}

type entry struct {
	worker fleet.Worker
	pid    *actor.PID
	// reported is the draining flag of the engine's last status; byAck
	// says its drain is the gateway's doing (OwnDrain).
	reported, byAck bool
}

// NewState returns an empty registry state.
func NewState(cfg Config) *State {
	return &State{cfg: cfg, entries: map[string]*entry{}, drained: map[string]bool{}, epoch: cfg.Epoch, byPID: map[string]string{}}
}

// Props returns the registry actor's props over st. Its children are
// supervised one for one and restarted on a panic.
func Props(st *State) *actor.Props {
	return actor.PropsFromProducer(
		func() actor.Actor { return &registryActor{st: st} },
		actor.WithSupervisor(actor.NewOneForOneStrategy(10, time.Second, actor.DefaultDecider)),
	)
}

type registryActor struct{ st *State }

// Receive is the actor's thin switch.
func (a *registryActor) Receive(ctx actor.Context) {
	st := a.st
	switch m := ctx.Message().(type) {
	case *actor.Started:
		st.winding = false
		a.respawn(ctx)
	case *actor.Restarting, *actor.Stopping:
		// protoactor now stops every child; they must not be respawned
		// until the new incarnation starts.
		st.winding = true
	case *Heartbeat:
		ctx.Respond(a.heartbeat(ctx, m))
	case *worker.Expired:
		a.expired(ctx, m)
	case *reconsider:
		a.decide(ctx, m)
	case *Drain:
		ctx.Respond(a.drain(ctx, m))
	case *Snapshot:
		ctx.Respond(st.snapshot(m.RoutableOnly, time.Now()))
	case *SetEpoch:
		st.epoch = m.Epoch
	case *Subscribe:
		a.subscribe(ctx, m)
	case *ChangesApplied:
		a.applied(ctx, m)
	case *Forget:
		e, ok := st.entries[m.ID]
		if ok {
			ctx.Stop(e.pid)
			st.remove(m.ID)
			if st.cfg.OnGone != nil {
				st.cfg.OnGone(e.worker)
			}
			a.publish(ctx, &WorkerGone{ID: m.ID, Reason: "removed"})
		}
		ctx.Respond(ok)
	case *WorkerPID:
		var pid *actor.PID
		if e, ok := st.entries[m.ID]; ok {
			pid = e.pid
		}
		ctx.Respond(pid)
	case *Crash:
		panic("registry: crash requested")
	case *actor.Terminated:
		a.terminated(ctx, m.Who)
	}
}

// terminated handles a child that stopped. A worker that is no longer live
// is evicted; one that is still live (its actor exhausted its restarts, or
// a heartbeat arrived while it was stopping) gets a fresh actor, so one bad
// worker actor never loses the worker.
func (a *registryActor) terminated(ctx actor.Context, who *actor.PID) {
	if a.st.winding {
		return
	}
	id, ok := a.st.byPID[who.Id]
	delete(a.st.byPID, who.Id)
	e := a.st.entries[id]
	if !ok || e == nil || !e.pid.Equal(who) {
		return // an actor already replaced, or a worker already gone
	}
	if e.worker.Live(time.Now()) {
		e.pid = a.spawn(ctx, e.worker)
		return
	}
	ctx.Send(ctx.Self(), &reconsider{ID: id, PID: who, LastHeartbeat: e.worker.LastHeartbeat})
}

func (a *registryActor) heartbeat(ctx actor.Context, m *Heartbeat) any {
	st := a.st
	w := fleet.FromStatus(m.Status, m.Arrived, st.cfg.TTL(), m.Source)
	w.Kind, w.BootstrapPort = m.Kind, m.BootstrapPort
	w.Drained = st.drained[w.Model]
	e, known := st.entries[w.ID]
	var err error
	switch {
	case known:
		err = CheckBinding(e.worker, w)
	case st.cfg.MaxWorkers > 0 && w.Source != fleet.SourceProbe && st.heartbeated >= st.cfg.MaxWorkers:
		err = fmt.Errorf("%w: %d workers registered (max_workers); %q is refused until one is evicted", ErrTooManyWorkers, st.cfg.MaxWorkers, w.ID)
	}
	if err != nil {
		if st.cfg.OnRefuse != nil {
			st.cfg.OnRefuse(w, err)
		}
		return &Refused{Err: err}
	}
	if known {
		if w.StartedAt.IsZero() {
			// A report without a start time (a probe whose read of the
			// engine's metrics failed once) says nothing of the process:
			// it is the one known, for every subscriber (a new process
			// reports its own).
			w.StartedAt = e.worker.StartedAt
		}
		w.Draining, e.byAck = OwnDrain(e.reported, e.byAck, w.Draining, w.Drained)
		e.reported = m.Status.GetDraining()
		e.worker = w
		ctx.Send(e.pid, &worker.Update{Worker: w})
	} else {
		e = &entry{worker: w, reported: w.Draining}
		e.pid = a.spawn(ctx, w)
		st.add(e)
		if st.cfg.OnRegister != nil {
			st.cfg.OnRegister(w)
		}
	}
	a.publishAs(ctx, &WorkerChanged{Worker: w}, !known)
	return &controlv1.HeartbeatAck{
		Drain:      w.Drained,
		Epoch:      st.epoch,
		IntervalMs: uint32(st.cfg.Interval / time.Millisecond),
	}
}

// expired handles a worker actor's report that its deadline passed. If a
// newer heartbeat reached the registry meanwhile (it was forwarded to the
// stopping actor and lost), the worker is kept and a fresh actor spawned.
// The Terminated system message may overtake Expired; whichever comes
// first acts, and the other finds the entry gone or owned by a new actor.
func (a *registryActor) expired(ctx actor.Context, m *worker.Expired) {
	e, ok := a.st.entries[m.ID]
	if !ok || !e.pid.Equal(m.PID) {
		return // already handled when the actor terminated
	}
	if e.worker.LastHeartbeat.After(m.LastHeartbeat) {
		e.pid = a.spawn(ctx, e.worker)
		return
	}
	ctx.Send(ctx.Self(), &reconsider{ID: m.ID, PID: m.PID, LastHeartbeat: m.LastHeartbeat})
}

// reconsider is the eviction decision, sent by the registry to itself so
// that it comes after every message already in its mailbox: a heartbeat
// the edge stamped before the deadline but that reached the mailbox behind
// the worker actor's expiry (a loaded machine) keeps the worker, instead
// of evicting it and registering it anew a moment later.
type reconsider struct {
	ID            string
	PID           *actor.PID
	LastHeartbeat time.Time
}

// decide evicts the worker of m unless a heartbeat newer than the one that
// expired has come in meanwhile; then it gets a fresh actor.
func (a *registryActor) decide(ctx actor.Context, m *reconsider) {
	e, ok := a.st.entries[m.ID]
	if !ok || !e.pid.Equal(m.PID) {
		return // decided already (the other of Expired and Terminated)
	}
	if e.worker.LastHeartbeat.After(m.LastHeartbeat) && e.worker.Live(time.Now()) {
		e.pid = a.spawn(ctx, e.worker)
		return
	}
	a.evict(ctx, e)
}

func (a *registryActor) evict(ctx actor.Context, e *entry) {
	a.st.remove(e.worker.ID)
	if a.st.cfg.OnEvict != nil {
		a.st.cfg.OnEvict(e.worker)
	}
	if a.st.cfg.OnGone != nil {
		a.st.cfg.OnGone(e.worker)
	}
	a.publish(ctx, &WorkerGone{ID: e.worker.ID, Reason: "evicted"})
}

func (a *registryActor) drain(ctx actor.Context, m *Drain) *DrainResult {
	st := a.st
	if m.On {
		st.drained[m.Model] = true
	} else {
		delete(st.drained, m.Model)
	}
	var changed []fleet.Worker
	for _, e := range st.entries {
		if e.worker.Model != m.Model {
			continue
		}
		e.worker.Drained = m.On
		e.worker.Draining, e.byAck = OwnDrain(e.reported, e.byAck, e.reported, m.On)
		changed = append(changed, e.worker)
	}
	a.publishNow(ctx, changed)
	return &DrainResult{Workers: len(changed)}
}

// respawn runs on (re)start: after a restart the children are gone but the
// state is not, so each known worker gets a fresh actor with its last status.
func (a *registryActor) respawn(ctx actor.Context) {
	a.st.byPID = map[string]string{}
	for _, e := range a.st.entries {
		e.pid = a.spawn(ctx, e.worker)
	}
}

func (a *registryActor) spawn(ctx actor.Context, w fleet.Worker) *actor.PID {
	pid := ctx.SpawnPrefix(worker.Props(&worker.State{Worker: w}), "worker-"+w.ID+"-")
	ctx.Watch(pid)
	a.st.byPID[pid.Id] = w.ID
	return pid
}

func (a *registryActor) publish(ctx actor.Context, msg any) { a.publishAs(ctx, msg, false) }

// publishAs tells every subscriber msg; fresh says it registers a new
// worker (batched subscribers get such changes after the others).
func (a *registryActor) publishAs(ctx actor.Context, msg any, fresh bool) {
	for _, s := range a.st.subscribers {
		if !s.batched {
			ctx.Send(s.pid, msg)
			continue
		}
		s.add(msg, fresh)
		a.flush(ctx, s)
	}
}

// add and remove keep entries and the count of heartbeated workers (the
// cap's) together.
func (st *State) add(e *entry) {
	st.entries[e.worker.ID] = e
	if e.worker.Source != fleet.SourceProbe {
		st.heartbeated++
	}
}

func (st *State) remove(id string) {
	if e, ok := st.entries[id]; ok && e.worker.Source != fleet.SourceProbe {
		st.heartbeated--
	}
	delete(st.entries, id)
}

func (st *State) snapshot(routableOnly bool, now time.Time) *SnapshotResult {
	out := &SnapshotResult{Epoch: st.epoch, Workers: make([]fleet.Worker, 0, len(st.entries))}
	for _, e := range st.entries {
		if !e.worker.Live(now) || routableOnly && !e.worker.Routable(now) {
			continue
		}
		out.Workers = append(out.Workers, e.worker)
	}
	sort.Slice(out.Workers, func(i, j int) bool { return out.Workers[i].ID < out.Workers[j].ID })
	return out
}
