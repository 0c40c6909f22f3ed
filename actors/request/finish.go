package request

import (
	"net/http"
	"strconv"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// releaseHeld returns the in-flight slots and the KV handle.
func (a *requestActor) releaseHeld(ctx actor.Context) {
	for _, id := range a.held {
		ctx.Send(a.d.Router, &router.Release{WorkerID: id})
	}
	a.held = a.held[:0]
	a.releaseHandle()
}

func (a *requestActor) finish(ctx actor.Context, o Outcome) {
	if a.finished {
		return
	}
	a.finished = true
	a.stopWatching()
	a.releaseHeld(ctx)
	a.endAttempt(ctx)
	a.pdEnd()
	o = a.escalationFailed(o)
	o = a.bridged(o)
	if o.Header == nil {
		o.Header = http.Header{}
	}
	if o.Code == openai.CodeNoCapacity && o.Header.Get("Retry-After") == "" {
		// Every no_capacity answer says when to come back: the clients
		// that read it retry then, not at once nor never.
		o.Header.Set("Retry-After", retryAfter(a.d.NoCapacityRetryAfter).Get("Retry-After"))
	}
	responseHeaders(o.Header, a.ex.RequestID, a.ex.Debug, a.log.Worker, cascadeStep(a.target, a.log.CascadeStep))
	o.Log = a.log
	a.traceEnd(o)
	a.ex.Done <- o
	ctx.Stop(ctx.Self())
}

// responseHeaders sets the headers every answer carries: the request id,
// and for keys with the debug scope the worker and, on a cascade route,
// the cascade step (step < 0: not a cascade).
func responseHeaders(h http.Header, requestID string, debug bool, worker string, step int) {
	h.Set("X-Request-Id", requestID)
	if debug && worker != "" {
		h.Set("X-TL-Route", worker)
		if step >= 0 {
			h.Set("X-TL-Cascade-Step", strconv.Itoa(step))
		}
	}
}

// cascadeStep is step when t is a target of a cascade route, else -1.
func cascadeStep(t router.Target, step int) int {
	if t.CascadeSteps > 1 {
		return step
	}
	return -1
}

// cleanup runs when the actor stops, normally or after a panic: whatever
// is still held is released and the edge is told, so nothing leaks and no
// client waits forever.
func (a *requestActor) cleanup(ctx actor.Context) {
	if a.finished {
		return
	}
	a.finished = true
	a.stopWatching()
	if a.routing {
		ctx.Send(a.d.Router, &router.Leave{PID: ctx.Self()})
	}
	a.releaseHeld(ctx)
	a.endAttempt(ctx)
	a.pdEnd()
	a.log.Committed = a.ex.Committed()
	o := Outcome{Status: http.StatusInternalServerError, Code: "internal_error",
		Message: "The gateway failed while handling the request.", Header: http.Header{"X-Request-Id": {a.ex.RequestID}}, Log: a.log}
	a.traceEnd(o)
	a.ex.Done <- o
}
