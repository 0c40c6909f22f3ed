package admin_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/admin"
	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
)

// fakeStore is a shared store the test steers: up or down, a conflict
// to report, writes recorded.
type fakeStore struct {
	mu       sync.Mutex
	down     bool
	conflict uint64 // non-zero: PutRoutes reports a conflict at this epoch
	failWith error
	rev      int64
	puts     []uint64
	drained  []string
}

func (f *fakeStore) PutRoutes(_ context.Context, prev store.Version, next uint64, _ []routes.Route) (store.Version, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.failWith != nil:
		return store.Version{}, f.failWith
	case f.conflict != 0:
		return store.Version{}, &store.ConflictError{Epoch: f.conflict}
	}
	f.rev++
	f.puts = append(f.puts, next)
	return store.Version{Epoch: next, Rev: f.rev}, nil
}

func (f *fakeStore) SetDrained(_ context.Context, models []string, on bool) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failWith != nil {
		return 0, f.failWith
	}
	f.rev++
	if on {
		f.drained = append(f.drained, models...)
	}
	return f.rev, nil
}

func (f *fakeStore) Up() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.down
}

// readingStore is a fakeStore that can be read back (a store.Reader, as
// the etcd store is): Current answers snap, or fails with readErr.
type readingStore struct {
	*fakeStore
	snap    store.Snapshot
	readErr error
}

func (r *readingStore) Current(context.Context) (store.Snapshot, error) {
	return r.snap, r.readErr
}

// errLost is the client's error of a write whose answer was lost.
var errLost = errors.New("connection reset")

// lost is the error of a table write whose answer was lost and whose
// settling answers v, err.
func lost(v store.Version, err error) error {
	return &store.UnknownOutcomeError{Err: errLost, Settle: func(context.Context) (store.Version, error) { return v, err }}
}

func newStoreEnv(t *testing.T, fs store.Store) *env {
	t.Helper()
	sys := actorsys.New(zerolog.Nop())
	reg := sys.Root.Spawn(registry.Props(registry.NewState(registry.Config{Interval: 2 * time.Second, MissLimit: 3, Epoch: 1})))
	table, err := routes.NewTable([]routes.Route{{Model: "smol", Backends: []routes.Backend{{Model: "smol-v3", Weight: 1}}}})
	if err != nil {
		t.Fatal(err)
	}
	rt := sys.Root.Spawn(router.Props(router.NewState(router.Config{Policy: policy.NameLeastOutstanding}, table, 1), reg))
	adm := sys.Root.Spawn(admin.Props(admin.Deps{Router: rt, Registry: reg, Store: fs, Logger: zerolog.Nop(), Table: table, Epoch: 1, Rev: 0}))
	t.Cleanup(func() {
		for _, pid := range []*actor.PID{adm, rt, reg} {
			_ = sys.Root.StopFuture(pid).Wait()
		}
		sys.Shutdown()
		time.Sleep(2 * time.Second) // let protoactor's dead-letter throttle finish
	})
	return &env{t: t, sys: sys, reg: reg, router: rt, admin: adm}
}

func TestPutThroughStore(t *testing.T) {
	cases := []struct {
		name          string
		store         *fakeStore
		want          error
		wantEpoch     uint64
		says, saysNot []string // in the error's message
	}{
		{name: "written", store: &fakeStore{}, wantEpoch: 2},
		{name: "store down", store: &fakeStore{down: true}, want: admin.ErrStoreUnavailable, wantEpoch: 1, says: []string{`the table in force (ETag "1") is kept`}},
		{name: "store lost before the write was sent", store: &fakeStore{failWith: store.ErrUnavailable}, want: admin.ErrStoreUnavailable, wantEpoch: 1, says: []string{"kept"}},
		{name: "another replica won", store: &fakeStore{conflict: 7}, want: admin.ErrETagMismatch, wantEpoch: 7},
		{name: "answer lost, the write committed", store: &fakeStore{failWith: lost(store.Version{Epoch: 2, Rev: 5}, nil)}, wantEpoch: 2},
		{
			name: "answer lost, not written", store: &fakeStore{failWith: lost(store.Version{}, fmt.Errorf("%w (%w)", store.ErrNotWritten, store.ErrUnavailable))},
			want: admin.ErrStoreUnavailable, wantEpoch: 1, says: []string{"not written", `the table in force (ETag "1") is kept`}, saysNot: []string{"unknown"},
		},
		{name: "answer lost, another write moved the table on", store: &fakeStore{failWith: lost(store.Version{}, &store.ConflictError{Epoch: 7})}, want: admin.ErrETagMismatch, wantEpoch: 7},
		{
			name: "answer lost, the store cannot be read back", store: &fakeStore{failWith: lost(store.Version{}, &store.UnknownOutcomeError{Err: errors.New("deadline")})},
			want: admin.ErrStoreUnavailable, wantEpoch: 1, says: []string{"outcome unknown; GET /admin/v1/routes and retry"}, saysNot: []string{"kept"},
		},
		{
			name: "answer lost, nothing to settle it with", store: &fakeStore{failWith: &store.UnknownOutcomeError{Err: errLost}},
			want: admin.ErrStoreUnavailable, wantEpoch: 1, says: []string{"outcome unknown"}, saysNot: []string{"kept"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newStoreEnv(t, c.store)
				res := e.put(`{"routes":[{"model":"smol","backends":[{"model":"smol-v4","weight":1}]}]}`, `"1"`)
				if c.want == nil && res.Err != nil || c.want != nil && !errors.Is(res.Err, c.want) || res.Epoch != c.wantEpoch {
					t.Fatalf("PUT: epoch %d err %v, want epoch %d err %v", res.Epoch, res.Err, c.wantEpoch, c.want)
				}
				for _, w := range c.says {
					if !strings.Contains(res.Err.Error(), w) {
						t.Errorf("PUT: %v, want it to say %q", res.Err, w)
					}
				}
				for _, w := range c.saysNot {
					if strings.Contains(res.Err.Error(), w) {
						t.Errorf("PUT: %v, want it not to say %q", res.Err, w)
					}
				}
				got := e.ask(e.admin, &admin.GetRoutes{}).(*admin.RoutesResult)
				wantInForce := uint64(1)
				if c.want == nil {
					wantInForce = 2
				}
				if got.Epoch != wantInForce {
					t.Fatalf("epoch in force %d, want %d", got.Epoch, wantInForce)
				}
				if w := e.ask(e.router, &router.ListWorkers{}).(*router.WorkersResult); w.Epoch != wantInForce {
					t.Fatalf("router epoch %d, want %d", w.Epoch, wantInForce)
				}
			})
		})
	}
}

// TestDrainAnswerLost: a drain whose answer from the store was lost is
// read back: applied when the store holds it, else answered 503 saying
// the outcome is unknown (never that it was not written).
func TestDrainAnswerLost(t *testing.T) {
	cases := []struct {
		name    string
		snap    store.Snapshot
		readErr error
		applied bool
	}{
		{name: "the store holds the drain", snap: store.Snapshot{Rev: 9, Drained: []string{"smol-v3"}}, applied: true},
		{name: "the store does not hold it", snap: store.Snapshot{Rev: 9}},
		{name: "the store cannot be read back", readErr: store.ErrUnavailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rs := &readingStore{fakeStore: &fakeStore{failWith: &store.UnknownOutcomeError{Err: errLost}}, snap: c.snap, readErr: c.readErr}
				e := newStoreEnv(t, rs)
				res := e.ask(e.admin, &admin.Drain{Model: "smol", On: true}).(*admin.DrainResult)
				if c.applied {
					if res.Err != nil {
						t.Fatalf("drain: %v, want it applied", res.Err)
					}
				} else if !errors.Is(res.Err, admin.ErrStoreUnavailable) || !strings.Contains(res.Err.Error(), "outcome unknown") || strings.Contains(res.Err.Error(), "not written") {
					t.Fatalf("drain: %v, want store unavailable, outcome unknown", res.Err)
				}
				if ack := e.beat("w1", "smol-v3"); ack.GetDrain() != c.applied {
					t.Fatalf("ack drain %v, want %v", ack.GetDrain(), c.applied)
				}
			})
		})
	}
}

func TestDrainThroughStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeStore{}
		e := newStoreEnv(t, fs)
		res := e.ask(e.admin, &admin.Drain{Model: "smol", On: true}).(*admin.DrainResult)
		if res.Err != nil || !slices.Equal(fs.drained, []string{"smol-v3"}) {
			t.Fatalf("drain: %+v, store holds %v", res, fs.drained)
		}
		if ack := e.beat("w1", "smol-v3"); !ack.GetDrain() {
			t.Fatal("ack after a stored drain does not carry it")
		}
		fs.mu.Lock()
		fs.down = true
		fs.mu.Unlock()
		res = e.ask(e.admin, &admin.Drain{Model: "smol", On: false}).(*admin.DrainResult)
		if !errors.Is(res.Err, admin.ErrStoreUnavailable) || !strings.Contains(res.Err.Error(), "the drain was not written") {
			t.Fatalf("resume with the store down: %v, want ErrStoreUnavailable, the drain not written", res.Err)
		}
		if ack := e.beat("w1", "smol-v3"); !ack.GetDrain() {
			t.Fatal("a resume the store did not take was applied")
		}
	})
}

func TestSnapshotInstalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newStoreEnv(t, &fakeStore{})
		body, _ := store.EncodeTable(5, []routes.Route{{Model: "big"}})
		e.sys.Root.Send(e.admin, &admin.StoreSnapshot{Snapshot: store.Snapshot{Rev: 20, TableRev: 20, Table: body, Drained: []string{"big"}}})
		synctest.Wait()
		if got := e.ask(e.admin, &admin.GetRoutes{}).(*admin.RoutesResult); got.Epoch != 5 || got.Routes[0].Model != "big" {
			t.Fatalf("after a snapshot: %+v", got)
		}
		if ack := e.beat("w2", "big"); !ack.GetDrain() || ack.Epoch != 5 {
			t.Fatalf("ack after a snapshot: %+v", ack)
		}
		// An invalid stored table is refused; the table in force stays.
		e.sys.Root.Send(e.admin, &admin.StoreSnapshot{Snapshot: store.Snapshot{Rev: 21, TableRev: 21, Table: []byte(`{"epoch":6,"routes":[{"model":""}]}`)}})
		synctest.Wait()
		if got := e.ask(e.admin, &admin.GetRoutes{}).(*admin.RoutesResult); got.Epoch != 5 {
			t.Fatalf("an invalid stored table was installed: %+v", got)
		}
		if ack := e.beat("w2", "big"); ack.GetDrain() {
			t.Fatal("the drain the store no longer holds is still applied")
		}
	})
}
