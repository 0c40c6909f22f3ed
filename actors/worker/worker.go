// Package worker is the actor that stands for one engine: it holds the
// engine's latest status and the time it arrived, and a liveness timer. It
// stops itself at exactly last + miss_limit × interval, telling its parent
// (the registry) first.
//
// The timer is protoactor's scheduler with a generation number per
// heartbeat: every heartbeat bumps the generation and schedules a check at
// the new deadline, and a check whose generation is stale is ignored, so a
// late timer can never evict a worker that heartbeated since.
package worker

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"

	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// Update is a new status for the worker, already validated, with its arrival
// time and the time to live (miss_limit × interval) that it grants.
type Update struct {
	Worker fleet.Worker
}

// Expired is sent to the parent when the worker's deadline passes with no
// newer heartbeat; the worker stops itself right after sending it.
type Expired struct {
	ID            string
	LastHeartbeat time.Time
	PID           *actor.PID
}

// Crash makes the actor panic; tests use it to exercise supervision.
type Crash struct{}

// check is the liveness timer's message.
type check struct{ gen uint64 }

// State is what survives a restart of the actor: the registry's producer
// keeps one State per worker, so a worker actor that panics comes back with
// its last status and its timer generation intact.
type State struct {
	Worker fleet.Worker
	gen    uint64
	cancel scheduler.CancelFunc
}

// Props returns the props of a worker actor over st, which must already hold
// the worker's first status.
func Props(st *State) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &workerActor{st: st} })
}

type workerActor struct{ st *State }

// Receive is the actor's thin switch.
func (a *workerActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.arm(ctx)
	case *Update:
		a.st.Worker = m.Worker
		a.arm(ctx)
	case *check:
		if m.gen != a.st.gen {
			return // a newer heartbeat re-armed the timer
		}
		if Expire(a.st.Worker, time.Now()) {
			ctx.Send(ctx.Parent(), &Expired{ID: a.st.Worker.ID, LastHeartbeat: a.st.Worker.LastHeartbeat, PID: ctx.Self()})
			ctx.Stop(ctx.Self())
			return
		}
		a.arm(ctx) // woke early: wait for the rest
	case *Crash:
		panic("worker: crash requested")
	case *actor.Stopping:
		if a.st.cancel != nil {
			a.st.cancel()
		}
	}
}

// Expire reports whether w must be evicted at now: now - last >= k·T.
func Expire(w fleet.Worker, now time.Time) bool { return !w.Live(now) }

// arm (re)schedules the liveness check at the current deadline.
func (a *workerActor) arm(ctx actor.Context) {
	if a.st.cancel != nil {
		a.st.cancel()
	}
	a.st.gen++
	delay := time.Until(a.st.Worker.Deadline)
	if delay < 0 {
		delay = 0
	}
	s := scheduler.NewTimerScheduler(ctx.ActorSystem().Root)
	a.st.cancel = s.SendOnce(delay, ctx.Self(), &check{gen: a.st.gen})
}
