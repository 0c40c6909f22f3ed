package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/internal/adapter/store"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// ErrStoreUnavailable: the store (etcd) cannot be reached, so the write
// was not made (503 store_unavailable with Retry-After). Routing goes on
// with the table in force.
var ErrStoreUnavailable = errors.New("route store unavailable")

// DefaultStoreTimeout bounds a store write when Deps.StoreTimeout is zero;
// it is shorter than the admin API's own timeout, so a store that does not
// answer is reported as store_unavailable, not as a timeout.
const DefaultStoreTimeout = 3 * time.Second

// StoreSnapshot carries a shared store's state, as its watch read it, to
// the admin: a new table is validated and installed, an invalid one is
// refused and logged (the table in force stays), and the drained models
// are made to match.
type StoreSnapshot struct{ Snapshot store.Snapshot }

// storeIO runs op (store I/O) in a goroutine, outside the mailbox, and
// continues with its result inside it (ReenterAfter keeps the message's
// sender, so then may respond). A store that does not answer within the
// bound gives an error wrapping store.ErrUnavailable.
func (a *adminActor) storeIO(ctx actor.Context, op func(context.Context) any, then func(res any)) {
	sys := ctx.ActorSystem()
	timeout := a.deps.StoreTimeout
	f := actor.NewFuture(sys, timeout+time.Second)
	pid := f.PID()
	go func() {
		c, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		sys.Root.Send(pid, op(c))
	}()
	ctx.ReenterAfter(f, func(res any, err error) {
		if err != nil {
			res = fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		}
		then(res)
	})
}

// storeErr turns a store write's error into the admin's: a conflict is an
// ETag mismatch, an unreachable store ErrStoreUnavailable.
func storeErr(err error) error {
	var ce *store.ConflictError
	switch {
	case errors.As(err, &ce):
		return fmt.Errorf("%w: another write changed the table (now ETag %s); GET /admin/v1/routes and apply the change again", ErrETagMismatch, ETag(ce.Epoch))
	case errors.Is(err, store.ErrUnavailable):
		return fmt.Errorf("%w: %w; the table in force is kept, try again", ErrStoreUnavailable, err)
	}
	return fmt.Errorf("admin: keep the old table: %w", err)
}

type putOutcome struct {
	v   store.Version
	err error
}

// putStored writes a prepared table to the store (a compare-and-swap on
// the version in force) and installs it once the store holds it.
func (a *adminActor) putStored(ctx actor.Context, m *PutRoutes, t *routes.Table, epoch uint64) {
	st := a.st
	if !a.deps.Store.Up() {
		err := storeErr(store.ErrUnavailable)
		a.deps.Logger.Warn().Str("key", m.KeyName).Err(err).Msg("admin: route table not written")
		a.answerPut(ctx, &PutResult{Epoch: st.epoch, Routes: st.table.Routes(), Err: err})
		return
	}
	prev, rs, s := st.Version(), t.Routes(), a.deps.Store
	a.storeIO(ctx, func(c context.Context) any {
		v, err := s.PutRoutes(c, prev, epoch, rs)
		return putOutcome{v: v, err: err}
	}, func(res any) {
		out, ok := res.(putOutcome)
		if !ok {
			out.err, _ = res.(error)
		}
		if out.err != nil {
			err := storeErr(out.err)
			cur := st.epoch
			var ce *store.ConflictError
			if errors.As(out.err, &ce) {
				cur = ce.Epoch
			}
			a.deps.Logger.Warn().Str("key", m.KeyName).Uint64("epoch", st.epoch).Err(err).Msg("admin: route table not written; old table kept")
			a.answerPut(ctx, &PutResult{Epoch: cur, Routes: st.table.Routes(), Err: err})
			return
		}
		// The watch may have installed the write already.
		if st.Installs(out.v) {
			a.install(ctx, t, out.v)
		}
		a.deps.Logger.Info().Str("key", m.KeyName).Uint64("epoch", epoch).Int64("rev", out.v.Rev).Int("routes", t.Len()).Msg("admin: route table replaced")
		a.answerPut(ctx, &PutResult{Epoch: epoch, Routes: t.Routes()})
	})
}

type drainOutcome struct {
	rev int64
	err error
}

// drainStored writes a drain (or resume) to the store, then applies it
// here; the other replicas apply it from their watch.
func (a *adminActor) drainStored(ctx actor.Context, m *Drain, served []string) {
	if !a.deps.Store.Up() {
		ctx.Respond(&DrainResult{Models: served, Err: storeErr(store.ErrUnavailable)})
		return
	}
	s, on := a.deps.Store, m.On
	a.storeIO(ctx, func(c context.Context) any {
		rev, err := s.SetDrained(c, served, on)
		return drainOutcome{rev: rev, err: err}
	}, func(res any) {
		out, ok := res.(drainOutcome)
		if !ok {
			out.err, _ = res.(error)
		}
		if out.err != nil {
			err := storeErr(out.err)
			a.deps.Logger.Warn().Str("key", m.KeyName).Str("model", m.Model).Bool("drain", m.On).Err(err).Msg("admin: drain not written")
			ctx.Respond(&DrainResult{Models: served, Err: err})
			return
		}
		a.st.DrainWritten(out.rev)
		a.applyLocal(ctx, m, served)
	})
}

// snapshot installs what a shared store's watch read: the plan is State's
// (pure); here it is carried out.
func (a *adminActor) snapshot(ctx actor.Context, m *StoreSnapshot) {
	st := a.st
	plan := st.PlanSnapshot(&m.Snapshot)
	if plan.Stale {
		return
	}
	if plan.Refused != nil {
		a.deps.Logger.Error().Int64("rev", m.Snapshot.TableRev).Uint64("epoch", st.epoch).Err(plan.Refused).
			Msg("admin: stored route table refused; the table in force stays")
	}
	if plan.Table != nil {
		a.install(ctx, plan.Table, plan.Version)
		if a.deps.OnEpoch != nil {
			a.deps.OnEpoch(plan.Version.Epoch)
		}
		a.deps.Logger.Info().Uint64("epoch", plan.Version.Epoch).Int64("rev", plan.Version.Rev).Int("routes", plan.Table.Len()).
			Msg("admin: route table installed from the store")
	}
	st.ApplySnapshot(plan)
	for _, d := range []struct {
		models []string
		on     bool
	}{{plan.Drain, true}, {plan.Resume, false}} {
		for _, model := range d.models {
			if d.on && a.deps.OnDrain != nil {
				a.deps.OnDrain(model)
			}
			if a.deps.Registry != nil {
				ctx.Request(a.deps.Registry, &registry.Drain{Model: model, On: d.on})
			}
		}
		if len(d.models) > 0 {
			a.deps.Logger.Info().Strs("served", d.models).Bool("drain", d.on).Msg("admin: drain from the store")
		}
	}
}

type readOutcome struct {
	snap store.Snapshot
	err  error
}

// reread reads a shared store (one that is a store.Reader and up),
// applies what it holds as a snapshot, then goes on with then (checking
// the request again); it reports whether it took the request over. A
// store that cannot be read leaves the state as it was for then.
func (a *adminActor) reread(ctx actor.Context, then func()) bool {
	r, ok := a.deps.Store.(store.Reader)
	if !ok || !a.deps.Store.Up() {
		return false
	}
	a.storeIO(ctx, func(c context.Context) any {
		snap, err := r.Current(c)
		return readOutcome{snap: snap, err: err}
	}, func(res any) {
		if out, ok := res.(readOutcome); ok && out.err == nil {
			a.snapshot(ctx, &StoreSnapshot{Snapshot: out.snap})
		}
		then()
	})
	return true
}
