package router

import (
	"errors"
	"fmt"
	"time"
)

// ErrPinnedGone: the worker a pinned request must reach (Request.Pin) is
// not in the fleet any more, or no longer live.
var ErrPinnedGone = errors.New("pinned worker gone")

// pickPinned routes a request that only one worker can serve: the one
// that stores the state it refers to (a Responses follow-up of a stored
// response). A live worker that is draining still takes it: nobody else
// could. The model, when named, must be known; the target's served model
// is the worker's.
func (s *State) pickPinned(req *Request, now time.Time) (Target, error) {
	w, ok := s.workers[req.Pin]
	if !ok || !w.Live(now) || w.Drained {
		return Target{}, fmt.Errorf("router: worker %q: %w", req.Pin, ErrPinnedGone)
	}
	if req.Model != "" && !s.Known(req.Model) {
		return Target{}, fmt.Errorf("router: %q: %w", req.Model, ErrModelNotFound)
	}
	if h := s.health[w.ID]; h != nil && now.Before(h.until) {
		return Target{}, &NoCapacityError{Model: w.Model,
			Why: fmt.Sprintf("worker %q, which stores it, is ejected until %s after %s", w.ID, h.until.UTC().Format(time.RFC3339), h.reason)}
	}
	if req.Exclude[w.ID] || s.held(s.counter(w.ID), now) {
		return Target{}, fmt.Errorf("router: worker %q: %w", req.Pin, ErrNoCapacity)
	}
	route := w.Model
	if r, ok := s.table.Lookup(req.Model); ok {
		route = r.Model
	}
	t := Target{Worker: *w, Route: route, ServedModel: w.Model, CascadeSteps: 1, Epoch: s.epoch,
		Reason: ReasonPinned, Policy: ReasonPinned, Candidates: 1}
	s.sent(w.ID)
	s.syncPicked(w.Model, w.ID) // its release is told too
	return t, nil
}

// ReasonPinned is the reason of a pinned pick.
const ReasonPinned = "pinned"
