package request

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// clientLeft is sent by the context.AfterFunc watching the client's
// context: the client went away.
type clientLeft struct{}

// watchClient tells the actor when the client's context ends, so a request
// waiting in the router's queue gives its place up at once.
func (a *requestActor) watchClient(ctx actor.Context) {
	self, root := ctx.Self(), ctx.ActorSystem().Root
	a.unwatch = context.AfterFunc(a.ex.Ctx, func() { root.Send(self, &clientLeft{}) })
}

// onClientLeft asks the router to drop the queued Route request, if one is
// outstanding. The router answers ErrLeft when it dropped it; when the
// answer was already on its way, that answer arrives instead and the
// attempt ends at once on the canceled context.
func (a *requestActor) onClientLeft(ctx actor.Context) {
	if a.routing && !a.leaving {
		a.leaving = true
		ctx.Send(a.d.Router, &router.Leave{PID: ctx.Self()})
	}
}

// stopWatching stops the client watch.
func (a *requestActor) stopWatching() {
	if a.unwatch != nil {
		a.unwatch()
		a.unwatch = nil
	}
}

// admissionAnswer handles the router's overload answers; it reports
// whether m was one.
func (a *requestActor) admissionAnswer(ctx actor.Context, m *router.RouteResult) bool {
	if o, ok := refusal(m, a.ex.Req.Model); ok {
		a.finish(ctx, o)
		return true
	}
	switch {
	case errors.Is(m.Err, router.ErrLeft):
		a.log.ClientGone = true
		a.finish(ctx, Outcome{Status: 499, Code: "client_closed", Message: "client closed the request"})
	case m.Err == nil && a.ex.Ctx.Err() != nil:
		// The answer crossed the client's leaving: give the slots back.
		ctx.Send(a.d.Router, &router.Release{WorkerID: m.Target.Worker.ID})
		if m.Target.Prefill != nil {
			ctx.Send(a.d.Router, &router.Release{WorkerID: m.Target.Prefill.ID})
		}
		a.log.ClientGone = true
		a.finish(ctx, Outcome{Status: 499, Code: "client_closed", Message: "client closed the request"})
	default:
		return false
	}
	return true
}

// refusal is the answer to a request admission control refused (m.Err:
// ErrOverloaded, ErrObjective, ErrSaturated), asked for model; ok is
// false for any other answer.
func refusal(m *router.RouteResult, model string) (o Outcome, ok bool) {
	if m.Err == nil {
		return Outcome{}, false
	}
	var (
		objective *router.ObjectiveError
		saturated *router.SaturatedError
	)
	switch {
	case errors.Is(m.Err, router.ErrOverloaded):
		return Outcome{Status: http.StatusServiceUnavailable, Code: openai.CodeOverloaded, Header: retryAfter(m.RetryAfter),
			Message: fmt.Sprintf("Every worker of model %q is at its concurrency limit and the request could not wait; retry later.", model)}, true
	case errors.As(m.Err, &objective):
		return Outcome{Status: http.StatusTooManyRequests, Code: openai.CodeObjectiveUnreachable,
			Header: retryAfter(m.RetryAfter), Message: objective.Message()}, true
	case errors.As(m.Err, &saturated):
		return Outcome{Status: http.StatusTooManyRequests, Code: openai.CodeSaturated,
			Header: retryAfter(m.RetryAfter), Message: saturated.Message()}, true
	}
	return Outcome{}, false
}

// retryAfter is the Retry-After header of d, in whole seconds rounded up,
// at least 1.
func retryAfter(d time.Duration) http.Header {
	secs := int((d + time.Second - 1) / time.Second)
	return http.Header{"Retry-After": {strconv.Itoa(max(secs, 1))}}
}

// reportFailure tells the router that an attempt on worker failed before
// its first byte, and why; the router decides whether the failure counts
// towards the worker's ejection (router.CountsForEjection).
func (a *requestActor) reportFailure(ctx actor.Context, worker, reason string, generating bool) {
	if a.reported == a.attempts {
		return // this attempt's outcome was already reported
	}
	a.reported = a.attempts
	ctx.Send(a.d.Router, &router.AttemptFailed{WorkerID: worker, Reason: reason, Generating: generating})
}

// reportFetched reports a non-streamed attempt's answer, of status (once
// per attempt).
func (a *requestActor) reportFetched(ctx actor.Context, status int) {
	a.reported = a.attempts
	reportAnswer(ctx.Send, a.d.Router, a.target, status, time.Since(a.attemptStart))
}

// reportAnswer tells the router that an attempt on t's worker got an
// answer of status. Every answer that reaches here is a success for
// passive health: the proxy turns a 5xx or a malformed answer into an
// attempt failure, which reportFailure reports. A 2xx also has the router
// record the prompt in its prefix index (t.Indexing): the engine computed
// its KV, and firstByte (the attempt's start to its first byte) in the
// recent TTFT of its queue's band. An error answer (a 4xx: a prompt too
// long, a bad field) leaves both as they were.
func reportAnswer(send func(pid *actor.PID, msg any), routerPID *actor.PID, t router.Target, status int, firstByte time.Duration) {
	m := &router.AttemptSucceeded{WorkerID: t.Worker.ID}
	if status >= 200 && status < 300 {
		m.Indexing = t.Indexing
		m.FirstByte, m.Queue, m.Priority = firstByte, t.Queue, t.Priority
	}
	send(routerPID, m)
}
