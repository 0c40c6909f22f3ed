package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// ErrStoreUnavailable: the store (etcd) cannot be reached, so the write
// was not made, or its outcome is unknown (503 store_unavailable with
// Retry-After; the message says which). Routing goes on with the table in
// force.
var ErrStoreUnavailable = errors.New("route store unavailable")

// DefaultStoreTimeout bounds a store write, and the read back of one whose
// answer was lost, when Deps.StoreTimeout is zero; the two together are
// shorter than the admin API's own timeout (5 s), so a store that does not
// answer is reported as store_unavailable, not as a timeout.
const DefaultStoreTimeout = 2 * time.Second

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

// putErr turns a table write's error into the admin's; epoch is the one
// in force here. A conflict is an ETag mismatch. A write the store did
// not make (the store was seen down before it was sent, or reading it
// back showed it not written) keeps the table in force; one whose outcome
// is unknown says so, and never that the table was kept.
func putErr(err error, epoch uint64) error {
	var ce *store.ConflictError
	switch {
	case errors.As(err, &ce):
		return fmt.Errorf("%w: another write changed the table (now ETag %s); GET /admin/v1/routes and apply the change again", ErrETagMismatch, ETag(ce.Epoch))
	case errors.Is(err, store.ErrOutcomeUnknown):
		return fmt.Errorf("%w: %w; outcome unknown; GET /admin/v1/routes and retry", ErrStoreUnavailable, err)
	case errors.Is(err, store.ErrUnavailable):
		return fmt.Errorf("%w: %w; the table in force (ETag %s) is kept, try again", ErrStoreUnavailable, err, ETag(epoch))
	}
	return fmt.Errorf("admin: keep the old table: %w", err)
}

// drainErr is putErr for a drain (or resume).
func drainErr(err error) error {
	switch {
	case errors.Is(err, store.ErrOutcomeUnknown):
		return fmt.Errorf("%w: %w; outcome unknown; GET /admin/v1/workers and retry", ErrStoreUnavailable, err)
	case errors.Is(err, store.ErrUnavailable):
		return fmt.Errorf("%w: %w; the drain was not written, try again", ErrStoreUnavailable, err)
	}
	return fmt.Errorf("admin: the drain was not written: %w", err)
}

type putOutcome struct {
	v   store.Version
	err error
}

// putOutcomeOf is what storeIO brought back from a table write: the
// store's outcome or, when the store did not answer within its bound, an
// unknown one (the write may still be under way).
func putOutcomeOf(res any) putOutcome {
	if out, ok := res.(putOutcome); ok {
		return out
	}
	err, _ := res.(error)
	return putOutcome{err: &store.UnknownOutcomeError{Err: err}}
}

// putStored writes a prepared table to the store (a compare-and-swap on
// the version in force) and installs it once the store holds it. A write
// whose answer was lost is settled first (store.UnknownOutcomeError): the
// store, read back, says whether it committed (200), another write moved
// the table on (412) or it was not written (503, the table in force
// kept); when it cannot be read back either, the answer says the outcome
// is unknown.
func (a *adminActor) putStored(ctx actor.Context, m *PutRoutes, t *routes.Table, epoch uint64) {
	if !a.deps.Store.Up() {
		a.putDone(ctx, m, t, epoch, putOutcome{err: store.ErrUnavailable}, false)
		return
	}
	prev, rs, s := a.st.Version(), t.Routes(), a.deps.Store
	a.storeIO(ctx, func(c context.Context) any {
		v, err := s.PutRoutes(c, prev, epoch, rs)
		return putOutcome{v: v, err: err}
	}, func(res any) {
		out := putOutcomeOf(res)
		var uo *store.UnknownOutcomeError
		if !errors.As(out.err, &uo) || uo.Settle == nil {
			a.putDone(ctx, m, t, epoch, out, false)
			return
		}
		a.deps.Logger.Warn().Str("key", m.KeyName).Uint64("epoch", epoch).Err(out.err).Msg("admin: the store's answer to the route table write was lost; reading the store back")
		a.storeIO(ctx, func(c context.Context) any {
			v, err := uo.Settle(c)
			return putOutcome{v: v, err: err}
		}, func(res any) { a.putDone(ctx, m, t, epoch, putOutcomeOf(res), true) })
	})
}

// putDone installs and answers a written table, or answers the failure;
// readBack says the outcome was read back after a lost answer.
func (a *adminActor) putDone(ctx actor.Context, m *PutRoutes, t *routes.Table, epoch uint64, out putOutcome, readBack bool) {
	st := a.st
	if out.err != nil {
		err := putErr(out.err, st.epoch)
		cur := st.epoch
		var ce *store.ConflictError
		if errors.As(out.err, &ce) {
			cur = ce.Epoch
		}
		msg := "admin: route table not written; old table kept"
		if errors.Is(out.err, store.ErrOutcomeUnknown) {
			msg = "admin: route table write's outcome unknown"
		}
		a.deps.Logger.Warn().Str("key", m.KeyName).Uint64("epoch", st.epoch).Err(err).Msg(msg)
		a.answerPut(ctx, m, &PutResult{Epoch: cur, Routes: st.table.Routes(), Err: err})
		return
	}
	// The watch may have installed the write already.
	if st.Installs(out.v) {
		a.install(ctx, t, out.v)
	}
	a.deps.Logger.Info().Str("key", m.KeyName).Uint64("epoch", epoch).Int64("rev", out.v.Rev).Int("routes", t.Len()).Bool("read_back", readBack).Msg("admin: route table replaced")
	a.answerPut(ctx, m, &PutResult{Epoch: epoch, Routes: t.Routes()})
}

type drainOutcome struct {
	rev int64
	err error
}

// drainStored writes a drain (or resume) to the store, then applies it
// here; the other replicas apply it from their watch. A drain whose
// answer was lost is checked by reading the store back: when every served
// model is drained (resumed) there, it holds and is applied; else its
// outcome stays unknown (it may still be written), and the answer says so.
func (a *adminActor) drainStored(ctx actor.Context, m *Drain, served []string) {
	if !a.deps.Store.Up() {
		a.drainFailed(ctx, m, served, store.ErrUnavailable)
		return
	}
	s, on := a.deps.Store, m.On
	a.storeIO(ctx, func(c context.Context) any {
		rev, err := s.SetDrained(c, served, on)
		return drainOutcome{rev: rev, err: err}
	}, func(res any) {
		out, ok := res.(drainOutcome)
		if !ok {
			err, _ := res.(error)
			out.err = &store.UnknownOutcomeError{Err: err}
		}
		r, reads := s.(store.Reader)
		switch {
		case out.err == nil:
			a.drainWritten(ctx, m, served, out.rev)
		case !errors.Is(out.err, store.ErrOutcomeUnknown) || !reads:
			a.drainFailed(ctx, m, served, out.err)
		default:
			a.deps.Logger.Warn().Str("key", m.KeyName).Str("model", m.Model).Bool("drain", on).Err(out.err).Msg("admin: the store's answer to the drain was lost; reading the store back")
			a.storeIO(ctx, func(c context.Context) any {
				snap, err := r.Current(c)
				return readOutcome{snap: snap, err: err}
			}, func(res any) {
				rd, ok := res.(readOutcome)
				if !ok {
					rd.err, _ = res.(error)
				}
				switch {
				case rd.err != nil:
					a.drainFailed(ctx, m, served, fmt.Errorf("%w; reading the store back: %w", out.err, rd.err))
				case !drainsHold(rd.snap.Drained, served, on):
					a.drainFailed(ctx, m, served, fmt.Errorf("%w; the store, read back, does not hold it", out.err))
				default:
					a.drainWritten(ctx, m, served, rd.snap.Rev)
				}
			})
		}
	})
}

// drainsHold reports whether every served model is drained (on) or not
// (!on) in drained, a store's drained models.
func drainsHold(drained, served []string, on bool) bool {
	for _, s := range served {
		if slices.Contains(drained, s) != on {
			return false
		}
	}
	return true
}

// drainWritten applies a drain the store holds as of revision rev.
func (a *adminActor) drainWritten(ctx actor.Context, m *Drain, served []string, rev int64) {
	a.st.DrainWritten(rev)
	a.applyLocal(ctx, m, served)
}

// drainFailed answers a drain the store did not take, or whose outcome is
// unknown.
func (a *adminActor) drainFailed(ctx actor.Context, m *Drain, served []string, cause error) {
	err := drainErr(cause)
	msg := "admin: drain not written"
	if errors.Is(cause, store.ErrOutcomeUnknown) {
		msg = "admin: drain's outcome unknown"
	}
	a.deps.Logger.Warn().Str("key", m.KeyName).Str("model", m.Model).Bool("drain", m.On).Err(err).Msg(msg)
	a.answerDrain(ctx, &DrainResult{Models: served, Err: err})
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
	if plan.TableGone {
		a.deps.Logger.Warn().Int64("rev", m.Snapshot.Rev).Uint64("epoch", st.epoch).
			Msg("admin: the stored route table was deleted; the table in force stays, and the next PUT stores one again")
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
