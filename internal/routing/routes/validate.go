package routes

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/tlgate/tlgate/internal/routing/cascade"
)

// MaxIDLen is the longest id the gateway accepts, in bytes: a model id,
// a stored response's id; fleet sync bounds the strings it carries (replica
// and worker ids, models) by it too.
const MaxIDLen = 256

// ErrInvalidRoutes is wrapped by every *FieldError of Validate, so callers
// can tell a bad table (400 invalid_routes) from other failures.
var ErrInvalidRoutes = errors.New("routes: invalid route table")

// FieldError is one validation error, naming the field by its path in the
// table ("routes[1].cascade[0].accept_if"). Callers that embed the table
// in a larger document prefix Path (config uses "gateway.").
type FieldError struct {
	Path string
	Msg  string
}

// Error returns "path: message".
func (e *FieldError) Error() string { return e.Path + ": " + e.Msg }

// Unwrap lets errors.Is(err, ErrInvalidRoutes) match.
func (e *FieldError) Unwrap() error { return ErrInvalidRoutes }

// CheckModelID reports whether id is a valid model id: 1 to MaxIDLen bytes of
// A-Z a-z 0-9 . _ : / -, whose "/"-separated segments are neither empty
// nor "." or "..", so the id is its own normal form as a URL path (the
// admin API and the console put it in one: /admin/v1/models/{model}:drain).
// The error says what is wrong, without a path.
func CheckModelID(id string) error {
	if id == "" {
		return errors.New("required")
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("must be at most %d bytes, got %d", MaxIDLen, len(id))
	}
	for i := 0; i < len(id); i++ {
		if !isModelIDByte(id[i]) {
			return fmt.Errorf("invalid model id %q: byte %d is %q (allowed: A-Z a-z 0-9 . _ : / -)", id, i+1, id[i])
		}
	}
	return CheckModelSegments(id)
}

// CheckModelSegments reports whether every "/"-separated segment of id is
// non-empty and neither "." nor "..": an id like "rogue/../m1", "a//b" or
// "/m1" names another model once a URL path is normalised, so it is
// refused wherever a model id comes in.
func CheckModelSegments(id string) error {
	for i, seg := range strings.Split(id, "/") {
		switch seg {
		case "":
			return fmt.Errorf("invalid model id %q: segment %d is empty (no leading, trailing or doubled \"/\")", id, i+1)
		case ".", "..":
			return fmt.Errorf("invalid model id %q: segment %d is %q", id, i+1, seg)
		}
	}
	return nil
}

func isModelIDByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	case c == '.', c == '_', c == ':', c == '/', c == '-':
		return true
	}
	return false
}

// Validate checks a route table and returns every problem found, joined
// with errors.Join; each is a *FieldError naming its field:
//
//   - model: required, a valid model id, unique among all models and aliases;
//   - aliases: valid, unique likewise;
//   - backends: a valid model each, weight finite and > 0, their sum
//     finite, no model twice; not together with cascade;
//   - cascade: at least 2 steps with valid models; accept_if required and
//     parseable on every step but the last, and absent on the last;
//   - targets: at most one, "unified" or "disaggregated"; none on a cascade
//     (each step's own route decides);
//   - cycles: a step's model resolves like a request (a route's model or
//     alias names that route, anything else is served as is); a step that
//     resolves to a cascade route is followed, and a path back to a route
//     already on it (a -> b -> a, or a -> a) is rejected naming the path.
func Validate(rs []Route) error {
	v := validator{owner: make(map[string]int)}
	for i := range rs {
		v.route(i, rs[i])
	}
	v.cycles(rs)
	return errors.Join(v.errs...)
}

type validator struct {
	errs  []error
	owner map[string]int // model or alias -> index of the route it names
}

func (v *validator) add(path, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// name checks a route's model or alias and records it.
func (v *validator) name(path, id string, i int) {
	if err := CheckModelID(id); err != nil {
		v.add(path, "%s", err)
		return
	}
	if j, dup := v.owner[id]; dup {
		v.add(path, "%q already names routes[%d]", id, j)
		return
	}
	v.owner[id] = i
}

func (v *validator) route(i int, r Route) {
	at := fmt.Sprintf("routes[%d]", i)
	v.name(at+".model", r.Model, i)
	for k, a := range r.Aliases {
		v.name(fmt.Sprintf("%s.aliases[%d]", at, k), a, i)
	}

	if len(r.Backends) > 0 && len(r.Cascade) > 0 {
		v.add(at, "backends and cascade are mutually exclusive")
	}
	seen := make(map[string]int, len(r.Backends))
	total, finite := 0.0, true
	for k, b := range r.Backends {
		bp := fmt.Sprintf("%s.backends[%d]", at, k)
		if err := CheckModelID(b.Model); err != nil {
			v.add(bp+".model", "%s", err)
		} else if j, dup := seen[b.Model]; dup {
			v.add(bp+".model", "%q repeats backends[%d]", b.Model, j)
		} else {
			seen[b.Model] = k
		}
		switch {
		case math.IsInf(b.Weight, 0):
			v.add(bp+".weight", "must be finite, got %v", b.Weight)
		case !(b.Weight > 0): // also NaN
			v.add(bp+".weight", "must be > 0, got %v", b.Weight)
		default:
			total += b.Weight
			continue
		}
		finite = false
	}
	// Each weight finite is not enough: the pick draws over the sum.
	if finite && math.IsInf(total, 0) {
		v.add(at+".backends", "the weights' sum must be finite, got %v", total)
	}

	if n := len(r.Cascade); n == 1 {
		v.add(at+".cascade", "needs at least 2 steps, got 1")
	}
	for k, s := range r.Cascade {
		sp := fmt.Sprintf("%s.cascade[%d]", at, k)
		if err := CheckModelID(s.Model); err != nil {
			v.add(sp+".model", "%s", err)
		}
		last := k == len(r.Cascade)-1
		switch {
		case last && s.AcceptIf != "":
			v.add(sp+".accept_if", "must be empty on the last step (its answer is always kept), got %q", s.AcceptIf)
		case !last && s.AcceptIf == "":
			v.add(sp+".accept_if", "required on every step but the last")
		case !last:
			if _, err := cascade.ParseAcceptIf(s.AcceptIf); err != nil {
				var se *cascade.SyntaxError
				if errors.As(err, &se) {
					v.add(sp+".accept_if", "%s", se.Detail())
				} else {
					v.add(sp+".accept_if", "%s", err)
				}
			}
		}
	}

	if r.Priority < -MaxPriority || r.Priority > MaxPriority {
		v.add(at+".priority", "must be from %d to %d, got %d", -MaxPriority, MaxPriority, r.Priority)
	}
	if r.TTFTObjectiveMs < 0 || r.TTFTObjectiveMs > MaxTTFTObjectiveMs {
		v.add(at+".ttft_objective_ms", "must be from 0 (none) to %d, got %d", MaxTTFTObjectiveMs, r.TTFTObjectiveMs)
	}
	switch e := r.OnEscalationFailure; {
	case e == "":
	case len(r.Cascade) == 0:
		v.add(at+".on_escalation_failure", "only a cascade route escalates, got %q on a route with no cascade", e)
	case e != EscalationAnswer && e != EscalationError:
		v.add(at+".on_escalation_failure", "must be %q or %q, got %q", EscalationAnswer, EscalationError, e)
	}

	switch {
	case len(r.Targets) > 1:
		v.add(at+".targets", "at most one target, got %d", len(r.Targets))
	case len(r.Targets) == 1 && len(r.Cascade) > 0:
		v.add(at+".targets", "not allowed on a cascade route (each step's own route decides)")
	}
	for k, t := range r.Targets {
		if t != TargetUnified && t != TargetDisaggregated {
			v.add(fmt.Sprintf("%s.targets[%d]", at, k), "must be %q or %q, got %q", TargetUnified, TargetDisaggregated, t)
		}
	}
}

// cycles reports every cascade step that closes a cycle of cascade routes,
// by depth-first search over the edges route -> route a step resolves to.
func (v *validator) cycles(rs []Route) {
	const (
		unvisited = iota
		onPath
		done
	)
	state := make([]int, len(rs))
	var path []int
	var visit func(i int)
	visit = func(i int) {
		state[i] = onPath
		path = append(path, i)
		for k, s := range rs[i].Cascade {
			j, ok := v.owner[s.Model]
			if !ok || !rs[j].IsCascade() {
				continue // served as is, or a route that ends the chain
			}
			switch state[j] {
			case onPath:
				names := make([]string, 0, len(path)+1)
				start := 0
				for p, r := range path {
					if r == j {
						start = p
						break
					}
				}
				for _, r := range path[start:] {
					names = append(names, rs[r].Model)
				}
				names = append(names, rs[j].Model)
				v.add(fmt.Sprintf("routes[%d].cascade[%d].model", i, k), "cascade cycle %s", strings.Join(names, " -> "))
			case unvisited:
				visit(j)
			}
		}
		path = path[:len(path)-1]
		state[i] = done
	}
	for i := range rs {
		if state[i] == unvisited && rs[i].IsCascade() {
			visit(i)
		}
	}
}
