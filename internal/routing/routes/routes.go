// Package routes holds the route table: the mapping from a public model id
// and its aliases to what serves it (a weighted split over served model ids,
// a cascade of steps, or the model itself), its validation, the canary draw
// and the strict JSON form of the admin API. It is pure data: no I/O, no
// goroutines.
package routes

import (
	"math"

	"github.com/tlgate/tlgate/internal/routing/ring"
)

// The values of Route.Targets.
const (
	// TargetUnified serves the route on unified workers (the default).
	TargetUnified = "unified"
	// TargetDisaggregated runs prefill and decode on separate workers.
	TargetDisaggregated = "disaggregated"
)

// Backend is one served model id of a weighted split (a canary).
type Backend struct {
	Model  string  `toml:"model" json:"model"`
	Weight float64 `toml:"weight" json:"weight"`
}

// Step is one step of a cascade. Every step but the last has an AcceptIf
// rule (cascade.ParseAcceptIf grammar); the last has none.
type Step struct {
	Model    string `toml:"model" json:"model"`
	AcceptIf string `toml:"accept_if" json:"accept_if,omitempty"`
}

// The values of Route.OnEscalationFailure.
const (
	// EscalationAnswer: when a cascade's later step cannot run, the
	// client gets the last answer a step gave (not accepted), with the
	// X-TL-Cascade-Escalation header saying the escalation failed (the
	// default).
	EscalationAnswer = "answer"
	// EscalationError: the client gets the later step's error, naming
	// the step that could not run.
	EscalationError = "error"
)

// Route maps a public model id and its aliases to what serves it. At most
// one of Backends and Cascade is set; with neither the route serves its own
// Model. Targets is empty, ["unified"] or ["disaggregated"].
// OnEscalationFailure (cascades only) is empty, "answer" or "error".
type Route struct {
	Model    string    `toml:"model" json:"model"`
	Aliases  []string  `toml:"aliases" json:"aliases,omitempty"`
	Backends []Backend `toml:"backends" json:"backends,omitempty"`
	Cascade  []Step    `toml:"cascade" json:"cascade,omitempty"`
	Targets  []string  `toml:"targets" json:"targets,omitempty"`
	// Priority is the admission priority of the route's requests: higher
	// is dispatched first, negative is sheddable. A key's default or the
	// request's x-tlgate-priority header wins over it.
	Priority int `toml:"priority" json:"priority,omitempty"`
	// TTFTObjectiveMs is the time-to-first-token objective of the route's
	// requests in milliseconds (0: none); a key's default or the
	// request's x-slo-ttft-ms header wins over it.
	TTFTObjectiveMs     int    `toml:"ttft_objective_ms" json:"ttft_objective_ms,omitempty"`
	OnEscalationFailure string `toml:"on_escalation_failure" json:"on_escalation_failure,omitempty"`
}

// Bounds of a priority and of a TTFT objective (in milliseconds),
// wherever they are set: a route, a key, a request's header.
const (
	MaxPriority        = 1_000_000
	MaxTTFTObjectiveMs = 3_600_000
)

// IsCascade reports whether the route is a cascade.
func (r Route) IsCascade() bool { return len(r.Cascade) > 0 }

// IsDisaggregated reports whether the route asks for disaggregated prefill
// and decode.
func (r Route) IsDisaggregated() bool {
	return len(r.Targets) == 1 && r.Targets[0] == TargetDisaggregated
}

// Names returns the route's model followed by its aliases.
func (r Route) Names() []string {
	return append([]string{r.Model}, r.Aliases...)
}

// Clone returns a deep copy of r.
func (r Route) Clone() Route {
	c := r
	c.Aliases = cloneSlice(r.Aliases)
	c.Backends = cloneSlice(r.Backends)
	c.Cascade = cloneSlice(r.Cascade)
	c.Targets = cloneSlice(r.Targets)
	return c
}

func cloneSlice[T any](s []T) []T {
	if s == nil {
		return nil
	}
	return append(make([]T, 0, len(s)), s...)
}

// PickBackend returns the served model id for requestID: r.Model when the
// route has no backends, else the backend that the canary draw lands on.
// The draw is u = ring.Uniform(requestID) (Hash64's top 53 bits over 2^53,
// in [0, 1)) scaled to the total weight, then the first backend
// whose cumulative weight exceeds it; so one request id always gets the
// same backend and each backend its weight's share in expectation.
func PickBackend(r Route, requestID string) string {
	switch len(r.Backends) {
	case 0:
		return r.Model
	case 1:
		return r.Backends[0].Model
	}
	total := 0.0
	for _, b := range r.Backends {
		total += b.Weight
	}
	u := ring.Uniform(requestID) * total
	cum := 0.0
	for _, b := range r.Backends {
		cum += b.Weight
		if u < cum {
			return b.Model
		}
	}
	// Rounding in the cumulative sum can leave u at the very top: the last
	// backend with a positive weight owns it.
	for i := len(r.Backends) - 1; i >= 0; i-- {
		if b := r.Backends[i]; b.Weight > 0 && !math.IsNaN(b.Weight) {
			return b.Model
		}
	}
	return r.Backends[len(r.Backends)-1].Model
}
