package router

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// NoCapacityError is the ErrNoCapacity of a Pick, with what was missing.
type NoCapacityError struct {
	// Model is the model the request asked for.
	Model string
	// Why says what the route needs and what of it is there, e.g. "route
	// big-pd needs prefill and decode workers of big; 1 unified worker is
	// routable". It is empty when every worker was at its limit and the
	// request may wait in the queue.
	Why string
	// Skipped are the cascade steps passed over before the last one failed
	// too.
	Skipped []Skip
}

func (e *NoCapacityError) Error() string {
	if e.Why == "" {
		return fmt.Sprintf("router: %q: %v", e.Model, ErrNoCapacity)
	}
	return fmt.Sprintf("router: %q: %v: %s", e.Model, ErrNoCapacity, e.Why)
}

// Unwrap makes errors.Is(err, ErrNoCapacity) hold.
func (e *NoCapacityError) Unwrap() error { return ErrNoCapacity }

// Skip is a cascade step a pick passed over because it had no routable
// worker.
type Skip struct {
	Step  int
	Model string // the step's model
	Why   string // as NoCapacityError.Why
}

// String is the skip as the access log writes it.
func (k Skip) String() string {
	return fmt.Sprintf("step %d (%s): %s", k.Step, k.Model, k.Why)
}

// workerState is why a worker of a pool could, or could not, take the
// request, in the order the reason lists them.
type workerState int

const (
	stateRoutable workerState = iota
	stateFailed
	stateEjected
	stateAtLimit
	stateDraining
	stateDrained
	stateStale
	stateNoProtocol
	stateDown
	numStates
)

// verbs are each state's predicate, singular and plural.
var verbs = [numStates][2]string{
	stateRoutable: {"is routable", "are routable"},
	stateFailed:   {"failed this request", "failed this request"},
	stateEjected:  {"is ejected", "are ejected"},
	stateAtLimit:  {"is at its concurrency limit", "are at their concurrency limit"},
	stateDraining: {"is draining", "are draining"},
	stateDrained:  {"is drained by an operator", "are drained by an operator"},
	stateStale:    {"missed its heartbeats", "missed their heartbeats"},
	stateNoProtocol: {"is a probed engine of a kind that speaks no disaggregation protocol (vllm and sglang do)",
		"are probed engines of a kind that speaks no disaggregation protocol (vllm and sglang do)"},
	stateDown: {"is down (its probes fail)", "are down (their probes fail)"},
}

// stateOf is w's state for req; pair: the route is disaggregated, so a
// prefill or decode worker must speak a disaggregation protocol
// (fleet.Worker.Protocol).
func (s *State) stateOf(w *fleet.Worker, req *Request, now time.Time, pair bool) workerState {
	c := s.inflight[w.ID]
	switch {
	case pair && w.Role != fleet.RoleUnified && !speaks(w):
		return stateNoProtocol
	case !w.Live(now):
		return stateStale
	case w.Drained:
		return stateDrained
	case w.Draining:
		return stateDraining
	case req.Exclude[w.ID]:
		return stateFailed
	case c != nil && c.ejectedAt(now):
		return stateEjected
	case c != nil && c.atLimit():
		return stateAtLimit
	}
	return stateRoutable
}

// whyNoCapacity says what route r needs for req and what of it the fleet
// has: NoCapacityError.Why.
func (s *State) whyNoCapacity(r routes.Route, req *Request, now time.Time) string {
	served := []string{routes.PickBackend(r, req.RequestID)}
	if len(r.Backends) > 1 {
		served = append(served, fallbacks(r, served[0])...)
	}
	of := strings.Join(served, " or ")
	subject := "route " + r.Model
	if _, ok := s.table.Lookup(r.Model); !ok {
		subject = "model " + r.Model
	}
	need := fmt.Sprintf("%s needs unified workers of %s", subject, of)
	if r.IsDisaggregated() {
		need = fmt.Sprintf("%s needs prefill and decode workers of %s", subject, of)
	}
	roles := []fleet.Role{fleet.RoleUnified, fleet.RolePrefill, fleet.RoleDecode}
	counts := map[fleet.Role]*[numStates]int{}
	count := func(role fleet.Role, st workerState, n int) {
		if counts[role] == nil {
			counts[role] = &[numStates]int{}
		}
		counts[role][st] += n
	}
	for _, w := range s.workers {
		for _, m := range served {
			if w.Model == m {
				count(w.Role, s.stateOf(w, req, now, r.IsDisaggregated()), 1)
			}
		}
	}
	for _, m := range served {
		for role, n := range s.downOf(m) {
			count(role, stateDown, n)
		}
	}
	if len(counts) == 0 {
		return fmt.Sprintf("%s; no worker of %s is registered", need, of)
	}
	var parts []string
	for _, role := range roles {
		if c := counts[role]; c != nil {
			parts = append(parts, describe(role, c))
		}
	}
	why := need + "; " + strings.Join(parts, "; ")
	if p, d := counts[fleet.RolePrefill], counts[fleet.RoleDecode]; r.IsDisaggregated() && p != nil && d != nil &&
		p[stateRoutable] > 0 && d[stateRoutable] > 0 {
		why += "; " + s.whyNoPair(served, req, now)
	}
	return why
}

// speaks reports whether w speaks a disaggregation protocol.
func speaks(w *fleet.Worker) bool {
	_, ok := w.Protocol()
	return ok
}

// whyNoPair says why routable prefill and decode workers of the served
// models form no pair: with only heartbeating workers, their kv_formats
// differ; otherwise their protocols (engine kinds) do.
func (s *State) whyNoPair(served []string, req *Request, now time.Time) string {
	for _, w := range s.workers {
		if w.Role != fleet.RoleUnified && w.Source == fleet.SourceProbe && slices.Contains(served, w.Model) &&
			s.stateOf(w, req, now, true) == stateRoutable {
			return "no routable prefill worker speaks the protocol of a routable decode worker (a probed engine pairs only with engines of its kind, a heartbeating worker only with heartbeating workers of its kv_format)"
		}
	}
	return "no routable prefill worker shares a kv_format with a routable decode worker"
}

// describe is one role's workers by state: "1 unified worker is
// routable", "3 decode workers: 1 is ejected, 2 are draining".
func describe(role fleet.Role, c *[numStates]int) string {
	total, kinds, last := 0, 0, workerState(0)
	for st, n := range c {
		if n > 0 {
			total += n
			kinds++
			last = workerState(st)
		}
	}
	noun := "worker"
	if total != 1 {
		noun = "workers"
	}
	if kinds == 1 {
		return fmt.Sprintf("%d %s %s %s", total, role, noun, verb(last, total))
	}
	var each []string
	for st, n := range c {
		if n > 0 {
			each = append(each, fmt.Sprintf("%d %s", n, verb(workerState(st), n)))
		}
	}
	return fmt.Sprintf("%d %s %s: %s", total, role, noun, strings.Join(each, ", "))
}

func verb(st workerState, n int) string {
	if n == 1 {
		return verbs[st][0]
	}
	return verbs[st][1]
}

// noCapacityRetryAfter is the Retry-After of a no_capacity answer.
func (s *State) noCapacityRetryAfter() time.Duration {
	if d := s.cfg.NoCapacityRetryAfter; d > 0 {
		return d
	}
	return time.Second
}
