package admin

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Errors an admin answer can carry. Their texts are written for the
// operator: the HTTP edge sends err.Error() as the error message.
var (
	// ErrIfMatchRequired: a PUT without If-Match (428 if_match_required).
	ErrIfMatchRequired = errors.New("If-Match required")
	// ErrETagMismatch: If-Match names another epoch (412 etag_mismatch).
	ErrETagMismatch = errors.New("ETag mismatch")
	// ErrInvalidRoutes: the new table is malformed or fails validation
	// (400 invalid_routes); the message names the bad field.
	ErrInvalidRoutes = errors.New("invalid route table")
	// ErrModelNotFound: a drain names no route, no served model and no
	// worker's model (404 model_not_found).
	ErrModelNotFound = errors.New("model not found")
	// ErrEpochExhausted: the epoch is already the largest uint64, so no
	// new table can get a larger one (409 epoch_exhausted); it never wraps.
	ErrEpochExhausted = errors.New("route epoch exhausted")
)

// maxCascadeDepth bounds the walk through cascade steps; validation
// forbids cycles, so this only guards against a table built around it.
const maxCascadeDepth = 8

// ETag returns the route table's entity tag for epoch: the epoch in
// double quotes, `"5"`.
func ETag(epoch uint64) string { return `"` + strconv.FormatUint(epoch, 10) + `"` }

// CheckIfMatch checks an If-Match header value against the current epoch.
// Empty (or blank) is ErrIfMatchRequired. The value matches when one of its
// comma-separated entries is the current ETag, quoted (`"5"`, as GET sends
// it) or bare (`5`, as people type it), or is "*" (RFC 9110: any current
// table). A weak tag (W/"5") never matches: If-Match uses strong
// comparison. Anything else is ErrETagMismatch.
func CheckIfMatch(header string, epoch uint64) error {
	h := strings.TrimSpace(header)
	if h == "" {
		return fmt.Errorf("%w: send If-Match: %s, the ETag of GET /admin/v1/routes", ErrIfMatchRequired, ETag(epoch))
	}
	want := strconv.FormatUint(epoch, 10)
	for tag := range strings.SplitSeq(h, ",") {
		tag = strings.TrimSpace(tag)
		if tag == "*" {
			return nil
		}
		if strings.HasPrefix(tag, "W/") {
			continue
		}
		if len(tag) >= 2 && tag[0] == '"' && tag[len(tag)-1] == '"' {
			tag = tag[1 : len(tag)-1]
		}
		if tag == want {
			return nil
		}
	}
	return fmt.Errorf("%w: If-Match %s does not match the current ETag %s; GET /admin/v1/routes and apply the change again",
		ErrETagMismatch, clip(h), ETag(epoch))
}

// ParseTable decodes a PUT body ({"routes":[...]}, strictly) or, when body
// is nil, takes rs, and builds the validated table. Every failure wraps
// ErrInvalidRoutes with the field-naming message of routes.ParseJSON or
// routes.Validate (several problems joined with "; ").
func ParseTable(body []byte, rs []routes.Route) (*routes.Table, error) {
	if body != nil {
		var err error
		if rs, err = routes.ParseJSON(body); err != nil {
			return nil, &invalidError{msg: strings.TrimPrefix(err.Error(), routes.ErrBadJSON.Error()+": "), cause: err}
		}
	}
	t, err := routes.NewTable(rs)
	if err != nil {
		return nil, &invalidError{msg: strings.ReplaceAll(err.Error(), "\n", "; "), cause: err}
	}
	return t, nil
}

// invalidError is ParseTable's error: ErrInvalidRoutes with the message
// of its cause on one line, keeping the cause (its *routes.FieldError
// values) reachable by errors.As.
type invalidError struct {
	msg   string
	cause error
}

func (e *invalidError) Error() string   { return ErrInvalidRoutes.Error() + ": " + e.msg }
func (e *invalidError) Unwrap() []error { return []error{ErrInvalidRoutes, e.cause} }

// FieldPath returns the path of the first bad field an ErrInvalidRoutes
// error names ("routes[1].cascade[0].accept_if"), or "" when it names none
// (a body that is not JSON).
func FieldPath(err error) string {
	var fe *routes.FieldError
	if errors.As(err, &fe) {
		return fe.Path
	}
	return ""
}

// ServedModels returns the served model ids that the route named model (by
// its model or an alias) sends traffic to, in table order without repeats:
// its backends, or its own model when it has none; for a cascade, every
// step resolved the way the router resolves it (a step naming a route
// contributes that route's served models). ok is false when model names no
// route.
func ServedModels(t *routes.Table, model string) (served []string, ok bool) {
	r, ok := t.Lookup(model)
	if !ok {
		return nil, false
	}
	seen := map[string]bool{}
	add := func(m string) {
		if !seen[m] {
			seen[m] = true
			served = append(served, m)
		}
	}
	var walk func(r routes.Route, depth int)
	walk = func(r routes.Route, depth int) {
		switch {
		case r.IsCascade():
			if depth >= maxCascadeDepth {
				return
			}
			for _, s := range r.Cascade {
				walk(t.Resolve(s.Model), depth+1)
			}
		case len(r.Backends) > 0:
			for _, b := range r.Backends {
				add(b.Model)
			}
		default:
			add(r.Model)
		}
	}
	walk(r, 0)
	return served, true
}

// State is the admin actor's state: the current table, its epoch and the
// served models an operator has drained. It is kept outside the actor
// instance, so a restarted admin actor keeps it.
type State struct {
	table   *routes.Table
	epoch   uint64
	drained map[string]bool
	// tableRev is the store revision of the table in force (or of a newer
	// stored one refused), rev that of the last store snapshot applied and
	// drainRev that of the last drain this replica wrote; all 0 with the
	// file store.
	tableRev, rev, drainRev int64
	// storedEpoch is the highest epoch of a table seen stored, in force
	// here or refused for this replica's bounds: a PUT takes the epoch
	// after it, so that a table this replica writes over one it refused
	// is newer to the replicas that installed that one.
	storedEpoch uint64
	bounds      Bounds
}

// NewState returns the state for table (nil is an empty table) at epoch.
func NewState(table *routes.Table, epoch uint64) *State {
	if table == nil {
		table, _ = routes.NewTable(nil)
	}
	return &State{table: table, epoch: epoch, drained: map[string]bool{}}
}

// Routes returns the current table and epoch.
func (s *State) Routes() *RoutesResult {
	return &RoutesResult{Epoch: s.epoch, Routes: s.table.Routes()}
}

// Prepare checks a PUT against the state without changing it: If-Match
// first (a stale writer learns that before anything else), then the body
// and the bounds (gateway.max_routes, gateway.max_table_bytes). It returns
// the new table and the epoch it will have: the one after the table in
// force and any table seen stored (one this replica refused, which the
// PUT replaces, may have a later epoch).
func (s *State) Prepare(m *PutRoutes) (*routes.Table, uint64, error) {
	if !m.DryRun || m.IfMatch != "" {
		if err := CheckIfMatch(m.IfMatch, s.epoch); err != nil {
			return nil, 0, err
		}
	}
	t, err := ParseTable(m.Body, m.Routes)
	if err != nil {
		return nil, 0, err
	}
	if s.bounds.MaxRoutes > 0 && t.Len() > s.bounds.MaxRoutes {
		return nil, 0, fmt.Errorf("%w: routes: %d routes, at most %d (gateway.max_routes)", ErrInvalidRoutes, t.Len(), s.bounds.MaxRoutes)
	}
	last := max(s.epoch, s.storedEpoch)
	if last == math.MaxUint64 {
		return nil, 0, fmt.Errorf("%w: epoch %d is the largest; a new epoch would wrap to 0", ErrEpochExhausted, last)
	}
	// The table as it will be stored is held to the bound a stored table
	// is read with (at start, over the watch): a gateway never writes one
	// that it, or another replica, would refuse.
	if s.bounds.MaxTableBytes > 0 {
		body, err := store.EncodeTable(last+1, t.Routes())
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %w", ErrInvalidRoutes, err)
		}
		if len(body) > s.bounds.MaxTableBytes {
			return nil, 0, fmt.Errorf("%w: routes: the table is %d bytes stored, at most %d (gateway.max_table_bytes)", ErrInvalidRoutes, len(body), s.bounds.MaxTableBytes)
		}
	}
	return t, last + 1, nil
}

// Commit installs a prepared table at epoch.
func (s *State) Commit(t *routes.Table, epoch uint64) { s.table, s.epoch = t, epoch }

// Resolve says which served models a drain or resume of model acts on,
// from the state alone: the served models of the route model names; else,
// for a model some route serves (a backend, or a cascade step with no
// route of its own) or, on resume, one an operator drained, the model
// itself. ok is false when only the router can tell (a worker's model).
func (s *State) Resolve(model string, on bool) (served []string, ok bool) {
	if served, ok := ServedModels(s.table, model); ok {
		return served, true
	}
	if !on && s.drained[model] {
		return []string{model}, true
	}
	for _, name := range s.table.Models() {
		ms, _ := ServedModels(s.table, name)
		for _, m := range ms {
			if m == model {
				return []string{model}, true
			}
		}
	}
	return nil, false
}

// MarkDrained records served models as drained (on) or resumed.
func (s *State) MarkDrained(served []string, on bool) {
	for _, m := range served {
		if on {
			s.drained[m] = true
		} else {
			delete(s.drained, m)
		}
	}
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
