// Package admin is the actor that serialises the operator's writes: route
// table replacements (optimistic concurrency on the epoch, sent as the
// ETag) and model drains. A new table is validated whole, persisted to
// state_dir, and only then installed: the router gets it with its epoch
// and the registry the epoch it puts in every heartbeat ack. A drain names
// a route or a model and is turned into registry drains of the served
// models behind it.
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

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routes"
	"github.com/tlgate/tlgate/internal/statefile"
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
}

// PutResult is the answer to PutRoutes. On success Epoch is the new epoch
// and Routes the installed table; on failure Err wraps ErrIfMatchRequired,
// ErrETagMismatch or ErrInvalidRoutes (or is a persistence error), and
// Epoch and Routes are the current, unchanged ones.
type PutResult struct {
	Epoch  uint64
	Routes []routes.Route
	Err    error
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
	// StateDir is where statefile keeps the table; "" disables persistence.
	StateDir string
	Logger   zerolog.Logger
	// Table and Epoch are the table at start (statefile.Load's, or the
	// configuration's) and its epoch. A nil Table is an empty table.
	Table *routes.Table
	Epoch uint64
	// AskTimeout bounds each question to the router or registry.
	AskTimeout time.Duration
	// OnWrite, if set, is called with the outcome of every PUT (ok,
	// if_match_required, etag_mismatch, invalid_routes, internal_error);
	// OnEpoch with every new epoch; OnDrain with every drained model.
	OnWrite func(outcome string)
	OnEpoch func(epoch uint64)
	OnDrain func(model string)
}

// Props returns the admin actor's props. The state is created once here
// and shared by every incarnation, so a restart after a panic keeps the
// table, the epoch and the drains.
func Props(deps Deps) *actor.Props {
	if deps.AskTimeout <= 0 {
		deps.AskTimeout = DefaultAskTimeout
	}
	st := NewState(deps.Table, deps.Epoch)
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
		res := a.put(ctx, m)
		if a.deps.OnWrite != nil {
			a.deps.OnWrite(WriteOutcome(res.Err))
		}
		if res.Err == nil && a.deps.OnEpoch != nil {
			a.deps.OnEpoch(res.Epoch)
		}
		ctx.Respond(res)
	case *Drain:
		a.drain(ctx, m)
	}
}

// WriteOutcome names the outcome of a PUT for metrics.
func WriteOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrIfMatchRequired):
		return "if_match_required"
	case errors.Is(err, ErrETagMismatch):
		return "etag_mismatch"
	case errors.Is(err, ErrInvalidRoutes):
		return "invalid_routes"
	}
	return "internal_error"
}

// put validates, persists, installs and announces a new table.
//
// The file is written inside Receive on purpose: the admin actor is the
// one place route-table writes are serialised, and the write is small (a
// few KB, one fsync of the file and one of the directory). Doing it here
// means the table on disk is always the table the router serves, in the
// same order, and a PUT is answered 200 only once it would survive a
// restart. Only operator writes wait on it; routing never does.
func (a *adminActor) put(ctx actor.Context, m *PutRoutes) *PutResult {
	st := a.st
	t, epoch, err := st.Prepare(m)
	if err != nil {
		a.deps.Logger.Info().Str("key", m.KeyName).Uint64("epoch", st.epoch).Err(err).Msg("admin: route table refused")
		return &PutResult{Epoch: st.epoch, Routes: st.table.Routes(), Err: err}
	}
	if a.deps.StateDir != "" {
		if err := statefile.Save(a.deps.StateDir, epoch, t.Routes()); err != nil {
			a.deps.Logger.Error().Str("key", m.KeyName).Uint64("epoch", st.epoch).Err(err).Msg("admin: route table not persisted; old table kept")
			return &PutResult{Epoch: st.epoch, Routes: st.table.Routes(), Err: fmt.Errorf("admin: keep the old table: %w", err)}
		}
	}
	st.Commit(t, epoch)
	if a.deps.Router != nil {
		ctx.Send(a.deps.Router, &router.SetRoutes{Table: t, Epoch: epoch})
	}
	if a.deps.Registry != nil {
		ctx.Send(a.deps.Registry, &registry.SetEpoch{Epoch: epoch})
	}
	a.deps.Logger.Info().Str("key", m.KeyName).Uint64("epoch", epoch).Int("routes", t.Len()).Msg("admin: route table replaced")
	return &PutResult{Epoch: epoch, Routes: t.Routes()}
}

// drain resolves the served models from the state, or asks the router
// whether Model is a worker's model (without blocking the mailbox), then
// applies the drain.
func (a *adminActor) drain(ctx actor.Context, m *Drain) {
	if served, ok := a.st.Resolve(m.Model, m.On); ok {
		a.apply(ctx, m, served)
		return
	}
	notFound := &DrainResult{Err: fmt.Errorf("%w: %q is neither a route nor a model any worker serves", ErrModelNotFound, m.Model)}
	if a.deps.Router == nil {
		ctx.Respond(notFound)
		return
	}
	f := ctx.RequestFuture(a.deps.Router, &router.Known{Model: m.Model}, a.deps.AskTimeout)
	ctx.ReenterAfter(f, func(res any, err error) {
		if err != nil {
			ctx.Respond(&DrainResult{Err: fmt.Errorf("admin: ask the router about %q: %w", m.Model, err)})
			return
		}
		if known, _ := res.(bool); !known {
			ctx.Respond(notFound)
			return
		}
		a.apply(ctx, m, []string{m.Model})
	})
}

// apply sends a registry drain for each served model and responds once
// every one is answered: by then the registry has told the router.
func (a *adminActor) apply(ctx actor.Context, m *Drain, served []string) {
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
		ctx.Respond(res)
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
