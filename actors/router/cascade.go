package router

import (
	"errors"
	"time"

	"github.com/tlgate/tlgate/internal/routing/routes"
)

// resolveStep is the route and the request a cascade step asks: the
// step's model resolved like a request's, down to the last step of a step
// that is a cascade itself (validation forbids cycles; depth bounds it
// anyway).
func (s *State) resolveStep(r routes.Route, step int, req *Request) (routes.Route, *Request) {
	r = s.table.Resolve(r.Cascade[step].Model)
	req = stepRequest(req, r)
	for depth := 0; r.IsCascade() && depth < 8; depth++ {
		r = s.table.Resolve(r.Cascade[len(r.Cascade)-1].Model)
		req = stepRequest(req, r)
	}
	return r, req
}

// stepRequest is req as asked of a cascade step's route r: the step's
// model, r's last step if r is a cascade itself, every other field (the
// prompt, the key, the exclusions) as the client's request had it.
func stepRequest(req *Request, r routes.Route) *Request {
	next := *req
	next.Model, next.Step = r.Model, len(r.Cascade)-1
	return &next
}

// pickCascade picks workers for cascade route r from the request's step
// (lastStepFor), skipping the steps with
// no routable worker (Target.Skipped).
func (s *State) pickCascade(t Target, r routes.Route, req *Request, now time.Time) (Target, error) {
	t.Cascade, t.OnEscalationFailure = r.Cascade, r.OnEscalationFailure
	// A cascade step with no routable worker is skipped: the request goes
	// on to the next step rather than being refused while a later step
	// could answer. A step whose workers are all at their limit is not
	// skipped: the request waits for it (admission.go).
	step := lastStepFor(r, req)
	fullBefore := s.full
	defer func() { s.full = s.full || fullBefore }()
	var skipped []Skip
	for ; ; step++ {
		t.CascadeStep, t.CascadeSteps, t.AcceptIf = step, len(r.Cascade), r.Cascade[step].AcceptIf
		t.Rule, _ = s.table.Rule(r.Model, step)
		sr, sreq := s.resolveStep(r, step, req)
		s.full = false
		tg, err := s.pickRoute(t, sr, sreq, req.Model, now)
		if err == nil {
			tg.Skipped = skipped
			return tg, nil
		}
		var nc *NoCapacityError
		if step == len(r.Cascade)-1 || s.full || !errors.As(err, &nc) {
			if nc != nil && len(skipped) > 0 {
				nc.Skipped = skipped
			}
			return Target{}, err
		}
		skipped = append(skipped, Skip{Step: step, Model: r.Cascade[step].Model, Why: nc.Why})
	}
}

// lastStepFor is the step of cascade route r a pick for req starts at:
// its Step, or the last for a streamed, pooling or unjudged request.
func lastStepFor(r routes.Route, req *Request) int {
	if req.Stream || req.LeastLoaded || req.Unjudged {
		return len(r.Cascade) - 1
	}
	return min(max(req.Step, 0), len(r.Cascade)-1)
}
