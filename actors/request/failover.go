package request

import (
	"errors"
	"slices"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// failed handles an attempt that failed before the first byte: exclude the
// worker(s) and route again, within MaxAttempts.
func (a *requestActor) failed(ctx actor.Context, err error, phase string) {
	phase, err = a.pdFailure(phase, err)
	reason := "error"
	var ae *proxy.AttemptError
	if errors.As(err, &ae) {
		reason = string(ae.Reason)
	}
	a.traceAttemptEnd(OutcomeFailed, reason, err)
	generating := proxy.IsGenerating(err)
	if generating || proxy.ReasonOf(err) == proxy.FailCanceled {
		a.chargeAbandoned(phase == PhasePrefill)
	}
	if a.ex.Ctx.Err() != nil {
		a.log.ClientGone = true
		a.finish(ctx, Outcome{Status: 499, Code: "client_closed", Message: "client closed the request"})
		return
	}
	if a.pin != "" {
		a.log.Failures = append(a.log.Failures, reason)
		a.log.LastError, a.lastErr = err.Error(), err
		a.reportFailure(ctx, a.pin, reason, generating)
		if ans := proxy.EngineAnswer(err); ans != nil {
			// The engine's own error is the client's answer: no other
			// worker could be asked, and its words say what went wrong.
			a.engineAnswer = ans
			a.relayEngineAnswer(ctx)
			return
		}
		a.finish(ctx, pinnedFailed(a.storedID(), a.pin, err))
		return
	}
	if a.target.Disaggregated() {
		a.log.Phase = phase
		if a.d.OnKV != nil {
			a.d.OnKV("failure:"+phase, 0)
		}
	}
	a.log.Failures = append(a.log.Failures, reason)
	a.log.LastError = err.Error()
	a.lastErr = err
	if proxy.ReasonOf(err) == proxy.FailTooLarge {
		// Any worker's answer would be as large: none is asked again.
		a.finish(ctx, tooLarge(a.ex.Req.Model, err))
		return
	}
	a.failedStep = a.target.CascadeStep
	if a.d.OnFailover != nil {
		a.d.OnFailover(a.ex, a.target, reason)
	}
	blamed := ExcludeAfter(a.target, phase, a.prefillFailed)
	if a.exclude == nil { // the request's first failure
		a.exclude = map[string]bool{}
	}
	a.exclude[blamed] = true
	if also := a.pdFailed(phase, reason, blamed); also != "" {
		a.exclude[also] = true
	}
	a.reportFailure(ctx, blamed, reason, generating)
	if a.engineAnswered(ctx, err, blamed) {
		return
	}
	if generating {
		if a.generations++; a.generations >= MaxGenerationTimeouts {
			a.releaseHeld(ctx)
			a.finish(ctx, generationTimedOut(a.ex.Req.Model, a.generations))
			return
		}
	}
	if phase == PhasePrefill {
		a.prefillFailed = append(a.prefillFailed, a.target.Prefill.ID)
	}
	a.releaseHeld(ctx)
	if escalatesOnFailure(a.target, err) {
		if a.d.OnCascade != nil {
			a.d.OnCascade(a.ex, a.target.Route, a.target.CascadeStep, false)
		}
		a.log.Escalations++
		a.step = a.target.CascadeStep + 1
	}
	if a.failures() >= a.d.MaxAttempts {
		a.finish(ctx, exhausted(a.ex.Req.Model, a.failures(), err))
		return
	}
	a.route(ctx)
}

// failures is the number of attempts that failed or answered an error:
// those a cascade step answered and escalated are not failures.
func (a *requestActor) failures() int { return a.attempts - a.judged }

// ExcludeAfter returns the worker to exclude after an attempt failed in
// phase. Under the engines' protocols each leg is one engine's request: a
// failed prefill leg blames the prefill worker, any other the decode
// worker. Under tlgate's contract, tokenize runs on the prefill worker
// alone, so it is the one to blame; a failed Prefill may be the prefill
// worker's fault or the decode worker's (P pushes the KV to D), so D is
// excluded first and P only when it fails a second time, with another D.
func ExcludeAfter(t router.Target, phase string, prefillFailed []string) string {
	switch {
	case t.Prefill == nil:
		return t.Worker.ID
	case t.Protocol() != fleet.ProtocolTLGate:
		// The engines' protocols: each leg is one engine's request.
		if phase == PhasePrefill {
			return t.Prefill.ID
		}
		return t.Worker.ID
	case phase == PhaseTokenize:
		return t.Prefill.ID
	case phase == PhasePrefill && slices.Contains(prefillFailed, t.Prefill.ID):
		return t.Prefill.ID
	}
	return t.Worker.ID
}
