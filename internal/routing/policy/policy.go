// Package policy holds the routing policies of the gateway as pure functions
// over a snapshot of candidate workers: least outstanding, smooth weighted
// round robin by KV capacity, and prefix affinity with bounded loads. They
// perform no I/O; the router actor filters the candidates (right model and
// role, routable, not excluded) and keeps the per-pool state.
package policy

import (
	"errors"
	"fmt"
)

// Candidate is one worker a policy may pick.
type Candidate struct {
	// ID is the worker id; ties are broken towards the smallest Tie, then
	// the smallest ID.
	ID string
	// Tie orders candidates the policy finds equal before their ID. 0 for
	// every candidate (a single gateway) leaves ties to the smallest ID;
	// replicas that share one view of the fleet (fleet sync) each set it
	// from a salt of their own, so that they do not all break a tie
	// towards the same worker at once.
	Tie uint64
	// Load is the gateway's in-flight count for the worker plus the queue
	// depth the worker last reported.
	Load int
	// Weight is the worker's capacity for the weighted policy: its
	// kv_total_blocks. A weight <= 0 counts as 1.
	Weight int
}

// Reasons a pick is reported with (X-TL-Route attributes, logs, metrics).
const (
	ReasonLeastOutstanding = "least_outstanding"
	ReasonWeighted         = "weighted"
	ReasonAffinity         = "affinity" // the owner of the prefix key
	ReasonLoad             = "load"     // the owner was over the cap, moved clockwise
)

// Name names a routing policy, as in the route_policy setting.
type Name string

// The routing policies.
const (
	NameLeastOutstanding Name = "least_outstanding"
	NameWeighted         Name = "weighted"
	NameAffinity         Name = "affinity"
)

var (
	// ErrUnknownPolicy is returned by ParsePolicy for a name that is not a
	// policy.
	ErrUnknownPolicy = errors.New("policy: unknown route policy")
)

// ParsePolicy returns the policy named s, which must be one of
// least_outstanding, weighted, affinity or cache_aware, exactly.
func ParsePolicy(s string) (Name, error) {
	switch n := Name(s); n {
	case NameLeastOutstanding, NameWeighted, NameAffinity, NameCacheAware:
		return n, nil
	}
	return "", fmt.Errorf("%w %q (want %s, %s, %s or %s)", ErrUnknownPolicy, s,
		NameLeastOutstanding, NameWeighted, NameAffinity, NameCacheAware)
}

// before reports whether c goes before o when a policy finds them equal:
// the smaller Tie, then the smaller ID.
func (c *Candidate) before(o *Candidate) bool {
	return c.Tie < o.Tie || c.Tie == o.Tie && c.ID < o.ID
}

// LeastOutstanding returns the index of the candidate with the smallest
// Load, ties going to the smallest Tie, then ID, or -1 when cands is
// empty.
func LeastOutstanding(cands []Candidate) int {
	best := -1
	for i := range cands {
		c := &cands[i]
		if best < 0 || c.Load < cands[best].Load || (c.Load == cands[best].Load && c.before(&cands[best])) {
			best = i
		}
	}
	return best
}
