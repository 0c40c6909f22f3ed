// Package admin is the actor that serialises the operator's writes: route
// table replacements (optimistic concurrency on the epoch, sent as the
// ETag) and model drains. A new table is validated whole, written to the
// store (state_dir, or etcd shared by several replicas), and only then
// installed: the router gets it with its epoch and the registry the epoch
// it puts in every heartbeat ack. A drain names a route or a model and is
// turned into registry drains of the served models behind it; with a
// shared store it is written there first. Every replica watching a shared
// store installs the tables and drains the others wrote (store.go).
//
// The decisions (If-Match, parsing and validation, which served models a
// drain reaches) are pure functions of the state and the message,
// table-tested in state.go; Receive is a thin switch over them.
package admin

import (
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// GetRoutes asks for the current table; the admin responds with
// *RoutesResult.
type GetRoutes struct{}

// RoutesResult is the current table (deep copies) and its epoch; the ETag
// is ETag(Epoch).
type RoutesResult struct {
	Epoch  uint64
	Routes []routes.Route
}

// PutRoutes replaces the whole table. Body is the admin API's JSON body
// ({"routes":[...]}, parsed strictly); when Body is nil, Routes is used.
// IfMatch is the request's If-Match header (several headers joined with
// ", "); KeyName is the caller's API key name, for the log. The admin
// responds with *PutResult.
type PutRoutes struct {
	Body    []byte
	Routes  []routes.Route
	IfMatch string
	KeyName string
	// DryRun checks the table and answers what it would change, changing
	// nothing; If-Match is then optional (when given, it is checked).
	DryRun bool

	// warnings are the table's (checked once with the router), warned
	// that they were.
	warnings []routes.Warning
	warned   bool
}

// PutResult is the answer to PutRoutes. On success Epoch is the new epoch
// and Routes the installed table; on failure Err wraps ErrIfMatchRequired,
// ErrETagMismatch, ErrInvalidRoutes or ErrStoreUnavailable (the table not
// written, or the outcome unknown: the message says which), or is a
// persistence error, and Epoch and Routes are the ones in force here.
type PutResult struct {
	Epoch  uint64
	Routes []routes.Route
	Err    error
	// Warnings are what the table likely gets wrong (routes.Unserved:
	// models no worker serves), on success.
	Warnings []routes.Warning
	// DryRun: nothing was changed; Routes is the table as it would be,
	// Epoch the one in force, Changes what the table would change.
	DryRun  bool
	Changes []routes.Change
}

// Drain starts (On) or ends (!On) an operator drain of Model: a route's
// model or alias (its served models are drained), or a served model. The
// admin responds with *DrainResult once the registry has applied it, so
// the router's view already shows the change to anyone who asks after.
type Drain struct {
	Model   string
	On      bool
	KeyName string
}

// DrainResult lists the served models drained (or resumed) and how many
// known workers serve them. Err wraps ErrModelNotFound when Model is
// unknown, or reports a router or registry that did not answer.
type DrainResult struct {
	Models  []string
	Workers int
	Err     error
}

// DefaultAskTimeout bounds the admin's questions to the router and the
// registry when Deps.AskTimeout is zero.
const DefaultAskTimeout = 2 * time.Second

// Deps is what the admin actor needs.
type Deps struct {
	// Router gets SetRoutes and answers Known; Registry gets SetEpoch and
	// Drain. Either may be nil (tests), which skips its messages.
	Router, Registry *actor.PID
	// Logger receives the admin's log lines.
	Logger zerolog.Logger
	// Table and Epoch are the table at start (statefile.Load's, or the
	// configuration's) and its epoch. A nil Table is an empty table.
	Table *routes.Table
	Epoch uint64
	// AskTimeout bounds each question to the router or registry.
	AskTimeout time.Duration
	// OnWrite, if set, is called with the outcome (WriteOutcome) of every
	// PUT that is not a dry run and of every drain and resume; OnEpoch
	// with every new epoch; OnDrain with every drained model.
	OnWrite func(outcome string)
	OnEpoch func(epoch uint64)
	OnDrain func(model string)
	// Store keeps the table and the drains (the composition root builds
	// it: internal/adapter/store/filestore or etcdstore); nil keeps them in
	// memory only. With a shared store the admin also receives
	// *StoreSnapshot messages from the store's watch.
	Store store.Store
	// Rev is the store revision of Table (0 for the file store).
	Rev int64
	// StoreTimeout bounds each store write, and the read back of one whose
	// answer was lost; 0 means DefaultStoreTimeout.
	StoreTimeout time.Duration
	// Bounds limit the tables PUT and read from the store.
	Bounds Bounds
}

// Props returns the admin actor's props. The state is created once here
// and shared by every incarnation, so a restart after a panic keeps the
// table, the epoch and the drains.
func Props(deps Deps) *actor.Props {
	if deps.AskTimeout <= 0 {
		deps.AskTimeout = DefaultAskTimeout
	}
	if deps.StoreTimeout <= 0 {
		deps.StoreTimeout = DefaultStoreTimeout
	}
	st := NewState(deps.Table, deps.Epoch)
	st.tableRev = deps.Rev
	st.SetBounds(deps.Bounds)
	return actor.PropsFromProducer(func() actor.Actor { return &adminActor{st: st, deps: deps} })
}

type adminActor struct {
	st   *State
	deps Deps
}

// Receive is the actor's thin switch.
func (a *adminActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *GetRoutes:
		ctx.Respond(a.st.Routes())
	case *PutRoutes:
		a.put(ctx, m, false)
	case *Drain:
		a.drain(ctx, m, false)
	case *StoreSnapshot:
		a.snapshot(ctx, m)
	case *registry.DrainResult:
		// The registry's answer to a drain a snapshot applied: nothing to do.
	}
}

// answerPut reports a PUT's outcome and responds with it (with m's
// warnings on success).
func (a *adminActor) answerPut(ctx actor.Context, m *PutRoutes, res *PutResult) {
	if res.Err == nil {
		res.Warnings = m.warnings
	}
	if a.deps.OnWrite != nil {
		a.deps.OnWrite(WriteOutcome(res.Err))
	}
	if res.Err == nil && a.deps.OnEpoch != nil {
		a.deps.OnEpoch(res.Epoch)
	}
	ctx.Respond(res)
}

// answerDrain reports a drain's or resume's outcome and responds with it.
func (a *adminActor) answerDrain(ctx actor.Context, res *DrainResult) {
	if a.deps.OnWrite != nil {
		a.deps.OnWrite(WriteOutcome(res.Err))
	}
	ctx.Respond(res)
}

// WriteOutcome names the outcome of a PUT, a drain or a resume for
// metrics: ok, the admin API's error code (if_match_required,
// etag_mismatch, invalid_routes, model_not_found, epoch_exhausted,
// store_unavailable), else internal_error.
func WriteOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrModelNotFound):
		return "model_not_found"
	case errors.Is(err, ErrEpochExhausted):
		return "epoch_exhausted"
	case errors.Is(err, ErrIfMatchRequired):
		return "if_match_required"
	case errors.Is(err, ErrETagMismatch):
		return "etag_mismatch"
	case errors.Is(err, ErrInvalidRoutes):
		return "invalid_routes"
	case errors.Is(err, ErrStoreUnavailable):
		return "store_unavailable"
	}
	return "internal_error"
}

// put validates a new table, writes it to the store and, once the store
// holds it, installs and announces it (see store.go). Without a store the
// table is installed at once.
//
// With a shared store, a PUT whose If-Match does not match the table in
// force here first rereads the store (reread): this replica may not have
// seen another's write yet, and the ETag the client read there is valid.
func (a *adminActor) put(ctx actor.Context, m *PutRoutes, reread bool) {
	st := a.st
	t, epoch, err := st.Prepare(m)
	if errors.Is(err, ErrETagMismatch) && !reread && a.reread(ctx, func() { a.put(ctx, m, true) }) {
		return
	}
	if err != nil {
		a.deps.Logger.Info().Str("key", m.KeyName).Uint64("epoch", st.epoch).Bool("dry_run", m.DryRun).Err(err).Msg("admin: route table refused")
		if m.DryRun {
			ctx.Respond(&PutResult{Epoch: st.epoch, Routes: st.table.Routes(), Err: err, DryRun: true})
			return
		}
		a.answerPut(ctx, m, &PutResult{Epoch: st.epoch, Routes: st.table.Routes(), Err: err})
		return
	}
	if !m.warned {
		// The router says which models its workers serve; the table is
		// prepared again once it has (the table in force may have moved
		// meanwhile).
		a.warnings(ctx, m, t, func() { a.put(ctx, m, reread) })
		return
	}
	if m.DryRun {
		a.deps.Logger.Info().Str("key", m.KeyName).Uint64("epoch", st.epoch).Int("routes", t.Len()).Int("warnings", len(m.warnings)).Msg("admin: route table dry run")
		ctx.Respond(&PutResult{Epoch: st.epoch, Routes: t.Routes(), Warnings: m.warnings, DryRun: true,
			Changes: routes.Diff(st.table.Routes(), t.Routes())})
		return
	}
	if a.deps.Store == nil {
		a.install(ctx, t, store.Version{Epoch: epoch})
		a.deps.Logger.Info().Str("key", m.KeyName).Uint64("epoch", epoch).Int("routes", t.Len()).Int("warnings", len(m.warnings)).Msg("admin: route table replaced")
		a.answerPut(ctx, m, &PutResult{Epoch: epoch, Routes: t.Routes()})
		return
	}
	a.putStored(ctx, m, t, epoch)
}

// warnings finds what table t likely gets wrong (routes.Unserved), asking
// the router which of its models workers serve without blocking the
// mailbox, records it in m and runs then. Without a router, or when it
// does not answer, the table goes without warnings (they never stop a
// write).
func (a *adminActor) warnings(ctx actor.Context, m *PutRoutes, t *routes.Table, then func()) {
	m.warned = true
	if a.deps.Router == nil {
		then()
		return
	}
	rs := t.Routes()
	f := ctx.RequestFuture(a.deps.Router, &router.Serving{Models: routes.Served(rs)}, a.deps.AskTimeout)
	ctx.ReenterAfter(f, func(res any, err error) {
		serving, ok := res.(map[string]routes.Serving)
		if err != nil || !ok {
			a.deps.Logger.Warn().Err(err).Msg("admin: the router did not say which models its workers serve; the route table goes without warnings")
		} else {
			m.warnings = routes.Unserved(rs, func(model string) routes.Serving { return serving[model] })
		}
		then()
	})
}

// install commits a table at v and sends it to the router and the
// registry's acks.
func (a *adminActor) install(ctx actor.Context, t *routes.Table, v store.Version) {
	a.st.CommitVersion(t, v)
	if a.deps.Router != nil {
		ctx.Send(a.deps.Router, &router.SetRoutes{Table: t, Epoch: v.Epoch})
	}
	if a.deps.Registry != nil {
		ctx.Send(a.deps.Registry, &registry.SetEpoch{Epoch: v.Epoch})
	}
}

// drain resolves the served models from the state, or asks the router
// whether Model is a worker's model (without blocking the mailbox), then
// applies the drain.
//
// With a shared store, a model unknown here is looked up again after a
// reread of the store: another replica may just have added its route.
func (a *adminActor) drain(ctx actor.Context, m *Drain, reread bool) {
	if served, ok := a.st.Resolve(m.Model, m.On); ok {
		a.apply(ctx, m, served)
		return
	}
	notFound := &DrainResult{Err: fmt.Errorf("%w: %q is neither a route nor a model any worker serves", ErrModelNotFound, m.Model)}
	if a.deps.Router == nil {
		a.answerDrain(ctx, notFound)
		return
	}
	f := ctx.RequestFuture(a.deps.Router, &router.Known{Model: m.Model}, a.deps.AskTimeout)
	ctx.ReenterAfter(f, func(res any, err error) {
		if err != nil {
			a.answerDrain(ctx, &DrainResult{Err: fmt.Errorf("admin: ask the router about %q: %w", m.Model, err)})
			return
		}
		if known, _ := res.(bool); !known {
			if !reread && a.reread(ctx, func() { a.drain(ctx, m, true) }) {
				return
			}
			a.answerDrain(ctx, notFound)
			return
		}
		a.apply(ctx, m, []string{m.Model})
	})
}

// apply writes the drain to the store, then applies it (applyLocal).
func (a *adminActor) apply(ctx actor.Context, m *Drain, served []string) {
	if a.deps.Store == nil {
		a.applyLocal(ctx, m, served)
		return
	}
	a.drainStored(ctx, m, served)
}

// applyLocal sends a registry drain for each served model and responds
// once every one is answered: by then the registry has told the router.
func (a *adminActor) applyLocal(ctx actor.Context, m *Drain, served []string) {
	a.st.MarkDrained(served, m.On)
	if m.On && a.deps.OnDrain != nil {
		for _, s := range served {
			a.deps.OnDrain(s)
		}
	}
	res := &DrainResult{Models: served}
	done := func() {
		ev := a.deps.Logger.Info()
		if res.Err != nil {
			ev = a.deps.Logger.Error().Err(res.Err)
		}
		ev.Str("key", m.KeyName).Str("model", m.Model).Strs("served", served).Int("workers", res.Workers).Bool("drain", m.On).Msg("admin: drain")
		a.answerDrain(ctx, res)
	}
	if a.deps.Registry == nil {
		done()
		return
	}
	pending := len(served)
	for _, model := range served {
		f := ctx.RequestFuture(a.deps.Registry, &registry.Drain{Model: model, On: m.On}, a.deps.AskTimeout)
		ctx.ReenterAfter(f, func(r any, err error) {
			pending--
			switch dr, ok := r.(*registry.DrainResult); {
			case err != nil:
				if res.Err == nil {
					res.Err = fmt.Errorf("admin: drain %q in the registry: %w", model, err)
				}
			case ok:
				res.Workers += dr.Workers
			}
			if pending == 0 {
				done()
			}
		})
	}
}
