package routes

import (
	"fmt"
	"sort"

	"github.com/tlgate/tlgate/internal/routing/cascade"
)

// Table is a validated, immutable route table indexed by model and alias.
// It is safe for concurrent use. Routes handed out by Lookup and Resolve
// share memory with the table and must be treated as read-only; Routes
// returns deep copies.
type Table struct {
	routes []Route
	index  map[string]int     // model or alias -> route
	rules  [][]cascade.Accept // per route: parsed accept_if of each step but the last
	models []string           // sorted models and aliases
}

// NewTable validates rs (see Validate) and builds a table from a deep copy
// of it. A nil or empty rs is a valid, empty table: every model is then its
// own route.
func NewTable(rs []Route) (*Table, error) {
	if err := Validate(rs); err != nil {
		return nil, err
	}
	t := &Table{
		routes: make([]Route, len(rs)),
		index:  make(map[string]int),
		rules:  make([][]cascade.Accept, len(rs)),
	}
	for i, r := range rs {
		t.routes[i] = r.Clone()
		for _, name := range r.Names() {
			t.index[name] = i
			t.models = append(t.models, name)
		}
		if n := len(r.Cascade); n > 0 {
			t.rules[i] = make([]cascade.Accept, n-1)
			for k, s := range r.Cascade[:n-1] {
				a, err := cascade.ParseAcceptIf(s.AcceptIf)
				if err != nil { // Validate parsed it already
					return nil, fmt.Errorf("routes: routes[%d].cascade[%d].accept_if: %w", i, k, err)
				}
				t.rules[i][k] = a
			}
		}
	}
	sort.Strings(t.models)
	return t, nil
}

// Lookup returns the route that model names, by its model or an alias.
func (t *Table) Lookup(model string) (Route, bool) {
	i, ok := t.index[model]
	if !ok {
		return Route{}, false
	}
	return t.routes[i], true
}

// Resolve returns the route that model names, or, for a model with no
// route, the implicit route that serves model as is.
func (t *Table) Resolve(model string) Route {
	if r, ok := t.Lookup(model); ok {
		return r
	}
	return Route{Model: model}
}

// Rule returns the parsed accept_if of step of the cascade route named
// model (by model or alias). ok is false when model names no cascade route
// or step is not one of its steps but the last (the last step has no rule:
// its answer is always kept).
func (t *Table) Rule(model string, step int) (rule cascade.Accept, ok bool) {
	i, found := t.index[model]
	if !found || step < 0 || step >= len(t.rules[i]) {
		return cascade.Accept{}, false
	}
	return t.rules[i][step], true
}

// Routes returns a deep copy of the table's routes in their order.
func (t *Table) Routes() []Route {
	out := make([]Route, len(t.routes))
	for i, r := range t.routes {
		out[i] = r.Clone()
	}
	return out
}

// Models returns every route model and alias, sorted.
func (t *Table) Models() []string {
	return append([]string(nil), t.models...)
}

// Len returns the number of routes.
func (t *Table) Len() int { return len(t.routes) }

// IsDisaggregated reports whether r asks for disaggregated prefill and
// decode (targets = ["disaggregated"]).
func (t *Table) IsDisaggregated(r Route) bool { return r.IsDisaggregated() }

// Served returns the served model id for a request on route r: PickBackend.
func (t *Table) Served(r Route, requestID string) string { return PickBackend(r, requestID) }
