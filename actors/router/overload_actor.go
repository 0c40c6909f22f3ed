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
type AttemptSucceeded struct {
	WorkerID string
	Indexing Indexing
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

// Queue outcomes reported to Observer.OnQueueLeft, and overload reasons
// to OnOverloaded.
const (
	QueueServed     = "served"
	QueueOverloaded = "overloaded"
	QueueGone       = "gone"

	OverloadQueueFull    = "queue_full"
	OverloadQueueTimeout = "queue_timeout"
)

func (a *routerActor) route(ctx actor.Context, m *Route) {
	st := a.st
	start := time.Now()
	ad := st.Admit(&m.Request, m.Request.Key, ctx.Sender(), start)
	took := time.Since(start)
	if d := ad.Displaced; d != nil {
		a.overloaded(ctx, d, OverloadQueueFull, start)
	}
	if w := ad.Queued; w != nil {
		w.Cancel = a.timers.SendOnce(st.cfg.Admission.QueueTimeout, ctx.Self(), &queueDeadline{seq: w.Seq})
		return
	}
	res := &RouteResult{Target: ad.Target, Err: ad.Err, Took: took, RetryAfter: ad.RetryAfter}
	switch {
	case errors.Is(ad.Err, ErrOverloaded):
		a.observeOverloaded(st.queueName(m.Request.Model), OverloadQueueFull)
	case errors.Is(ad.Err, ErrNoCapacity):
		res.RetryAfter = st.noCapacityRetryAfter()
	}
	ctx.Respond(res)
}

// dispatch answers the waiters that a release or a new worker can serve.
func (a *routerActor) dispatch(ctx actor.Context) {
	now := time.Now()
	for _, d := range a.st.Dispatch(now) {
		w := d.W
		if w.Cancel != nil {
			w.Cancel()
		}
		if errors.Is(d.Err, ErrOverloaded) {
			a.answerOverloaded(ctx, w, OverloadQueueTimeout, now)
			continue
		}
		a.left(w, QueueServed, now)
		res := &RouteResult{Target: d.Target, Err: d.Err, Waited: now.Sub(w.Enqueued)}
		if errors.Is(d.Err, ErrNoCapacity) {
			res.RetryAfter = a.st.noCapacityRetryAfter()
		}
		ctx.Send(w.From, res)
	}
}

func (a *routerActor) expire(ctx actor.Context, m *queueDeadline) {
	now := time.Now()
	if w := a.st.Expire(m.seq, now); w != nil {
		a.answerOverloaded(ctx, w, OverloadQueueTimeout, now)
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
	ctx.Send(w.From, &RouteResult{Err: ErrLeft, Waited: now.Sub(w.Enqueued)})
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
	ctx.Send(w.From, &RouteResult{Err: ErrOverloaded, Waited: now.Sub(w.Enqueued), RetryAfter: a.st.RetryAfter(w.Queue, now)})
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

func (a *routerActor) observeOverloaded(queue, reason string) {
	if f := a.st.cfg.Observe.OnOverloaded; f != nil {
		f(queue, reason)
	}
}
