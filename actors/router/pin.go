package router

import (
	"errors"
	"fmt"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// ErrPinnedGone: the worker a pinned request must reach (Request.Pin) is
// not in the fleet any more, or no longer live.
var ErrPinnedGone = errors.New("pinned worker gone")

// pickPinned routes a request that only one worker can serve: the one
// that stores the state it refers to (a Responses follow-up of a stored
// response). A live worker that is draining still takes it: nobody else
// could. The model, when named, must be known; the target's served model
// is the first of the models the request names (itself, or its route's
// backends) that the worker serves, so a follow-up on a LoRA adapter is
// answered by the adapter; the worker's base model when it serves none.
func (s *State) pickPinned(req *Request, now time.Time) (Target, error) {
	w, ok := s.workers[req.Pin]
	if !ok || !w.Live(now) || w.Drained {
		return Target{}, fmt.Errorf("router: worker %q: %w", req.Pin, ErrPinnedGone)
	}
	if req.Model != "" && !s.Known(req.Model, now) {
		return Target{}, fmt.Errorf("router: %q: %w", req.Model, ErrModelNotFound)
	}
	if h := s.health[w.ID]; h != nil && now.Before(h.until) {
		return Target{}, &NoCapacityError{Model: w.Model,
			Why: fmt.Sprintf("worker %q, which stores it, is ejected until %s after %s", w.ID, h.until.UTC().Format(time.RFC3339), h.reason)}
	}
	if req.Exclude[w.ID] || s.held(s.load(w.ID), now) {
		return Target{}, fmt.Errorf("router: worker %q: %w", req.Pin, ErrNoCapacity)
	}
	route, names := w.Model, []string{req.Model}
	if r, ok := s.table.Lookup(req.Model); ok {
		route = r.Model
		names = append(names, routeBackends(r, req.RequestID)...)
	}
	served := pinnedServed(w, names...)
	t := Target{Worker: *w, Route: route, ServedModel: served, CascadeSteps: 1, Epoch: s.epoch,
		Reason: ReasonPinned, Policy: ReasonPinned, Candidates: 1}
	s.sent(w.ID)
	s.syncPicked(w.Model, w.ID) // its release is told too
	return t, nil
}

// ReasonPinned is the reason of a pinned pick.
const ReasonPinned = "pinned"

// pinnedServed is the first of models that w serves, else w's base model.
func pinnedServed(w *fleet.Worker, models ...string) string {
	for _, m := range models {
		if m != "" && w.Serves(m) {
			return m
		}
	}
	return w.Model
}

// routeBackends are the served models of route r in the order a request
// with id would try them: its drawn backend, then the others.
func routeBackends(r routes.Route, id string) []string {
	first := routes.PickBackend(r, id)
	return append([]string{first}, fallbacks(r, first)...)
}
