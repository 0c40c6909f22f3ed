package request

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// HeaderCascadeEscalation is set on the answer of a cascade whose
// escalation could not run: the answer is the last step's that did answer
// (its accept_if did not hold), and the header says which step failed and
// why: "failed; step=1; model=big; reason=no_capacity". Every key gets it:
// it says the answer is not what the route would have given.
const HeaderCascadeEscalation = "X-TL-Cascade-Escalation"

// keptAnswer is a cascade step's answer that was not accepted: the
// client's answer should every later step fail.
type keptAnswer struct {
	resp   *proxy.Response
	target router.Target
}

// keep records the answer of the current step, escalated from.
func (a *requestActor) keep(resp *proxy.Response) {
	a.kept = &keptAnswer{resp: resp, target: a.target}
}

// noteFailedStep records the cascade step a failed route was for: the
// step asked, past the steps the router skipped for want of a routable
// worker. (A failed attempt's step is its target's.)
func (a *requestActor) noteFailedStep(m *router.RouteResult) {
	a.failedStep = a.step
	var nc *router.NoCapacityError
	if errors.As(m.Err, &nc) {
		a.failedStep += len(nc.Skipped)
	}
}

// escalationFailed is what the client gets when a cascade escalated from
// an answer (kept) and a later step then failed with o: by default the
// kept answer, with HeaderCascadeEscalation; with on_escalation_failure
// "error", o, its message naming the step that could not run. Any other
// answer, and a cascade that kept none, is o as it is.
func (a *requestActor) escalationFailed(o Outcome) Outcome {
	k := a.kept
	if k == nil || o.Status < 500 || o.Streamed || a.ex.Committed() {
		return o
	}
	steps := k.target.Cascade
	step := min(max(a.failedStep, k.target.CascadeStep+1), len(steps)-1)
	model := steps[step].Model
	reason := o.Code
	if reason == "" { // an engine's own error, relayed
		reason = "http_" + strconv.Itoa(o.Status)
	}
	a.log.EscalationFailed = fmt.Sprintf("step %d (%s): %s", step, model, reason)
	if k.target.OnEscalationFailure == routes.EscalationError {
		if o.Code != "" {
			o.Message = fmt.Sprintf("Cascade %q: step %d (%s) answered but its answer was not accepted, and step %d (%s) could not run: %s",
				k.target.Route, k.target.CascadeStep, steps[k.target.CascadeStep].Model, step, model, o.Message)
		}
		return o
	}
	a.target = k.target
	a.log.Route, a.log.ServedModel, a.log.Worker, a.log.CascadeStep = k.target.Route, k.target.ServedModel, k.target.Worker.ID, k.target.CascadeStep
	h := http.Header{}
	if ct := k.resp.Header.Get("Content-Type"); ct != "" {
		h.Set("Content-Type", ct)
	}
	h.Set(HeaderCascadeEscalation, fmt.Sprintf("failed; step=%d; model=%s; reason=%s", step, model, reason))
	return Outcome{Status: k.resp.Status, Header: h, Body: a.unforced(&k.resp.Answer)}
}
