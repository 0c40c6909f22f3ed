package router

import (
	"errors"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// AttemptFailed reports an attempt on a worker that failed before its
// first byte, with the proxy's failure reason (refused, reset, timeout,
// status_503, status_5xx, bad_answer, eof, transport).
type AttemptFailed struct {
	WorkerID string
	Reason   string
	// Generating: a non-streamed attempt timed out before the engine's
	// first byte (proxy.IsGenerating); it counts only against a worker
	// that is not otherwise healthy (State.GenerationTimedOut).
	Generating bool
}

// AttemptSucceeded reports an attempt on a worker that reached its first
// byte (or a whole answer) that is not a 5xx: the worker's failure count
// starts again. Indexing is the pick's Target.Indexing when the answer is
// a 2xx (the worker computed the prompt's KV): it is recorded then.
// FirstByte, for a 2xx, is the time from the attempt's start to its first
// byte (a whole answer, not streamed): with the pick's Queue and Priority
// it feeds the recent TTFT that objectives are estimated by.
type AttemptSucceeded struct {
	WorkerID  string
	Indexing  Indexing
	FirstByte time.Duration
	Queue     string
	Priority  int
}

// Leave takes the Route request asked by PID out of its queue: its client
// went away. When it was waiting, the router answers it with ErrLeft; when
// it was not (its answer is already on its way), nothing.
type Leave struct{ PID *actor.PID }

// queueDeadline is a waiter's deadline timer.
type queueDeadline struct{ seq uint64 }

// ejectionEnded is the timer of an ejection's end: the worker's capacity
// is back, so waiters may be served.
type ejectionEnded struct{}

// Queue outcomes reported to Observer.OnQueueLeft, overload reasons to
// OnOverloaded, and admission outcomes to OnAdmission.
const (
	QueueServed     = "served"
	QueueOverloaded = "overloaded"
	QueueGone       = "gone"
	QueueShed       = "shed"
	QueueObjective  = "objective_unreachable"

	OverloadQueueFull    = "queue_full"
	OverloadQueueTimeout = "queue_timeout"

	AdmissionDispatched = "dispatched"
	AdmissionQueued     = "queued"
	AdmissionShed       = "shed"
	AdmissionObjective  = "objective_unreachable"
	AdmissionOverloaded = "overloaded"
	AdmissionGone       = "gone"
)

func (a *routerActor) route(ctx actor.Context, m *Route) {
	st := a.st
	start := time.Now()
	ad := st.Admit(&m.Request, m.Request.Key, ctx.Sender(), start)
	took := time.Since(start)
	if d := ad.Displaced; d != nil {
		a.overloaded(ctx, d, OverloadQueueFull, start)
	}
	for _, w := range ad.Shed {
		a.refuse(ctx, w, &SaturatedError{Model: w.Req.Model, Priority: w.Class.Priority}, start)
	}
	queue := st.queueName(m.Request.Model)
	if w := ad.Queued; w != nil {
		a.observeAdmission(queue, ad.Class.Priority, m.Request.Key, AdmissionQueued)
		a.arm(ctx, w, st.CheckAt(w, start), start)
		if ad.Joined {
			// It joined behind waiters without a pick of its own: serve
			// whatever there is room for.
			a.dispatch(ctx)
		}
		return
	}
	res := &RouteResult{Target: ad.Target, Err: ad.Err, Took: took, RetryAfter: ad.RetryAfter, Class: ad.Class}
	if ad.Err != nil {
		res.Route = st.routeOf(m.Request.Model, start)
	}
	switch {
	case ad.Err == nil:
		a.observeAdmission(queue, ad.Class.Priority, m.Request.Key, AdmissionDispatched)
	case errors.Is(ad.Err, ErrOverloaded):
		a.observeOverloaded(queue, OverloadQueueFull)
		a.observeAdmission(queue, ad.Class.Priority, m.Request.Key, AdmissionOverloaded)
	case errors.Is(ad.Err, ErrSaturated):
		a.observeAdmission(queue, ad.Class.Priority, m.Request.Key, AdmissionShed)
	case errors.Is(ad.Err, ErrObjective):
		a.observeAdmission(queue, ad.Class.Priority, m.Request.Key, AdmissionObjective)
	case errors.Is(ad.Err, ErrNoCapacity):
		res.RetryAfter = st.noCapacityRetryAfter()
	}
	ctx.Respond(res)
}

// arm sets waiter w's timer to fire at at.
func (a *routerActor) arm(ctx actor.Context, w *Waiter, at, now time.Time) {
	w.Cancel = a.timers.SendOnce(max(at.Sub(now), 0), ctx.Self(), &queueDeadline{seq: w.Seq})
}

// dispatch answers the waiters that a release or a new worker can serve.
func (a *routerActor) dispatch(ctx actor.Context) {
	now := time.Now()
	for _, d := range a.st.Dispatch(now) {
		w := d.W
		if w.Cancel != nil {
			w.Cancel()
		}
		switch {
		case errors.Is(d.Err, ErrOverloaded):
			a.answerOverloaded(ctx, w, OverloadQueueTimeout, now)
			continue
		case errors.Is(d.Err, ErrSaturated), errors.Is(d.Err, ErrObjective):
			a.refuse(ctx, w, d.Err, now)
			continue
		}
		a.left(w, QueueServed, now)
		if d.Err == nil {
			a.observeAdmission(w.Queue, w.Class.Priority, w.Key, AdmissionDispatched)
		}
		res := &RouteResult{Target: d.Target, Err: d.Err, Waited: now.Sub(w.Enqueued), Class: w.Class}
		if d.Err != nil {
			res.Route = w.Queue
		}
		if errors.Is(d.Err, ErrNoCapacity) {
			res.RetryAfter = a.st.noCapacityRetryAfter()
		}
		ctx.Send(w.From, res)
	}
}

func (a *routerActor) expire(ctx actor.Context, m *queueDeadline) {
	now := time.Now()
	x := a.st.Expire(m.seq, now)
	switch {
	case x.W == nil && !x.Again.IsZero():
		if w := a.st.waiters[m.seq]; w != nil {
			a.arm(ctx, w, x.Again, now)
		}
	case errors.Is(x.Err, ErrOverloaded):
		a.answerOverloaded(ctx, x.W, OverloadQueueTimeout, now)
	case x.Err != nil:
		a.refuse(ctx, x.W, x.Err, now)
	}
}

func (a *routerActor) leave(ctx actor.Context, m *Leave) {
	w := a.st.Leave(m.PID)
	if w == nil {
		return
	}
	if w.Cancel != nil {
		w.Cancel()
	}
	now := time.Now()
	a.left(w, QueueGone, now)
	a.observeAdmission(w.Queue, w.Class.Priority, w.Key, AdmissionGone)
	ctx.Send(w.From, &RouteResult{Err: ErrLeft, Waited: now.Sub(w.Enqueued), Class: w.Class, Route: w.Queue})
}

// overloaded answers a waiter pushed out of a full queue.
func (a *routerActor) overloaded(ctx actor.Context, w *Waiter, reason string, now time.Time) {
	if w.Cancel != nil {
		w.Cancel()
	}
	a.answerOverloaded(ctx, w, reason, now)
}

func (a *routerActor) answerOverloaded(ctx actor.Context, w *Waiter, reason string, now time.Time) {
	a.left(w, QueueOverloaded, now)
	a.observeOverloaded(w.Queue, reason)
	a.observeAdmission(w.Queue, w.Class.Priority, w.Key, AdmissionOverloaded)
	ctx.Send(w.From, &RouteResult{Err: ErrOverloaded, Waited: now.Sub(w.Enqueued), RetryAfter: a.st.RetryAfter(w.Queue, now), Class: w.Class, Route: w.Queue})
}

// refuse answers a waiter shed (ErrSaturated) or whose objective went out
// of reach (ErrObjective).
func (a *routerActor) refuse(ctx actor.Context, w *Waiter, err error, now time.Time) {
	if w.Cancel != nil {
		w.Cancel()
	}
	outcome, event := QueueShed, AdmissionShed
	retry := a.st.RetryAfter(w.Queue, now)
	if errors.Is(err, ErrObjective) {
		outcome, event = QueueObjective, AdmissionObjective
	}
	a.left(w, outcome, now)
	a.observeAdmission(w.Queue, w.Class.Priority, w.Key, event)
	ctx.Send(w.From, &RouteResult{Err: err, Waited: now.Sub(w.Enqueued), RetryAfter: retry, Class: w.Class, Route: w.Queue})
}

func (a *routerActor) attemptFailed(ctx actor.Context, m *AttemptFailed) {
	now := time.Now()
	var e Ejection
	if m.Generating {
		e = a.st.GenerationTimedOut(m.WorkerID, m.Reason, now)
	} else {
		e = a.st.AttemptFailed(m.WorkerID, m.Reason, now)
	}
	if !e.Ejected {
		return
	}
	a.timers.SendOnce(e.Until.Sub(now), ctx.Self(), &ejectionEnded{})
	if f := a.st.cfg.Observe.OnEject; f != nil {
		f(m.WorkerID, e.Model, e.Reason, e.Until)
	}
}

func (a *routerActor) left(w *Waiter, outcome string, now time.Time) {
	if f := a.st.cfg.Observe.OnQueueLeft; f != nil {
		f(w.Queue, outcome, now.Sub(w.Enqueued))
	}
}

func (a *routerActor) observeAdmission(queue string, prio int, key, outcome string) {
	if f := a.st.cfg.Observe.OnAdmission; f != nil {
		f(queue, prio, key, outcome)
	}
}

func (a *routerActor) observeOverloaded(queue, reason string) {
	if f := a.st.cfg.Observe.OnOverloaded; f != nil {
		f(queue, reason)
	}
}
