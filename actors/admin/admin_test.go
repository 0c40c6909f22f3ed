package admin_test

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
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
	"github.com/tlgate/tlgate/internal/adapter/statefile"
	"github.com/tlgate/tlgate/internal/adapter/store/filestore"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
	"github.com/tlgate/tlgate/internal/testkit/bubble"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

type env struct {
	t                  *testing.T
	sys                *actor.ActorSystem
	reg, router, admin *actor.PID
}

// newEnv starts a registry, a router and an admin over rs at epoch 1, in
// the calling synctest bubble.
func newEnv(t *testing.T, stateDir string, rs []routes.Route) *env {
	t.Helper()
	sys := actorsys.New(zerolog.Nop())
	reg := sys.Root.Spawn(registry.Props(registry.NewState(registry.Config{Interval: 2 * time.Second, MissLimit: 3, Epoch: 1})))
	table, err := routes.NewTable(rs)
	if err != nil {
		t.Fatal(err)
	}
	rt := sys.Root.Spawn(router.Props(router.NewState(router.Config{Policy: policy.NameLeastOutstanding}, table, 1), reg))
	var st store.Store
	if stateDir != "" {
		st = filestore.New(stateDir, 1)
	}
	adm := sys.Root.Spawn(admin.Props(admin.Deps{Router: rt, Registry: reg, Store: st, Logger: zerolog.Nop(), Table: table, Epoch: 1}))
	t.Cleanup(func() {
		for _, pid := range []*actor.PID{adm, rt, reg} {
			_ = sys.Root.StopFuture(pid).Wait()
		}
		sys.Shutdown()
		time.Sleep(2 * time.Second) // let protoactor's dead-letter throttle finish
	})
	return &env{t: t, sys: sys, reg: reg, router: rt, admin: adm}
}

func (e *env) ask(pid *actor.PID, msg any) any {
	e.t.Helper()
	res, err := e.sys.Root.RequestFuture(pid, msg, 5*time.Second).Result()
	if err != nil {
		e.t.Fatalf("ask %T: %v", msg, err)
	}
	return res
}

func (e *env) beat(id, model string) *controlv1.HeartbeatAck {
	e.t.Helper()
	s := &controlv1.WorkerStatus{WorkerId: id, Model: model, HttpAddress: "127.0.0.1:1", Role: controlv1.Role_ROLE_UNIFIED}
	ack := e.ask(e.reg, &registry.Heartbeat{Status: s, Arrived: time.Now(), Source: fleet.SourceHeartbeat}).(*controlv1.HeartbeatAck)
	synctest.Wait() // the router has the change
	return ack
}

func (e *env) put(body, ifMatch string) *admin.PutResult {
	e.t.Helper()
	return e.ask(e.admin, &admin.PutRoutes{Body: []byte(body), IfMatch: ifMatch, KeyName: "ops"}).(*admin.PutResult)
}

func TestPutInstallsPersistsAndAnnounces(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		e := newEnv(t, dir, []routes.Route{{Model: "smol"}})

		if res := e.put(`{"routes":[]}`, ""); !errors.Is(res.Err, admin.ErrIfMatchRequired) || res.Epoch != 1 {
			t.Fatalf("PUT without If-Match: %+v", res)
		}
		if res := e.put(`{"routes":[]}`, `"0"`); !errors.Is(res.Err, admin.ErrETagMismatch) || res.Epoch != 1 {
			t.Fatalf("stale PUT: %+v", res)
		}
		if res := e.put(`{"routes":[{"model":"a","cascade":[{"model":"b"},{"model":"c"}]}]}`, `"1"`); !errors.Is(res.Err, admin.ErrInvalidRoutes) {
			t.Fatalf("bad PUT: %+v", res)
		}
		if _, err := os.Stat(statefile.Path(dir)); !os.IsNotExist(err) {
			t.Fatalf("a refused PUT wrote the state file: %v", err)
		}

		res := e.put(`{"routes":[{"model":"auto","aliases":["a"],"backends":[{"model":"auto-v1","weight":1}]}]}`, `"1"`)
		if res.Err != nil || res.Epoch != 2 || len(res.Routes) != 1 || res.Routes[0].Model != "auto" {
			t.Fatalf("good PUT: %+v", res)
		}
		got := e.ask(e.admin, &admin.GetRoutes{}).(*admin.RoutesResult)
		if got.Epoch != 2 || !reflect.DeepEqual(got.Routes, res.Routes) {
			t.Fatalf("GetRoutes after PUT: %+v", got)
		}
		// Persisted before it was answered.
		epoch, rs, found, err := statefile.Load(dir)
		if err != nil || !found || epoch != 2 || !reflect.DeepEqual(rs, res.Routes) {
			t.Fatalf("state file: %d %+v %v %v", epoch, rs, found, err)
		}
		// The router serves the new table at the new epoch...
		if models := e.ask(e.router, &router.ListModels{}).([]string); !reflect.DeepEqual(models, []string{"a", "auto"}) {
			t.Fatalf("router models %v, want the new table's", models)
		}
		if w := e.ask(e.router, &router.ListWorkers{}).(*router.WorkersResult); w.Epoch != 2 {
			t.Fatalf("router epoch %d, want 2", w.Epoch)
		}
		// ...and the registry acks with it.
		if ack := e.beat("w1", "auto-v1"); ack.Epoch != 2 {
			t.Fatalf("ack epoch %d, want 2", ack.Epoch)
		}
		// The old ETag is stale now.
		if res := e.put(`{"routes":[]}`, `"1"`); !errors.Is(res.Err, admin.ErrETagMismatch) || res.Epoch != 2 {
			t.Fatalf("PUT with the old ETag: %+v", res)
		}
	})
}

// TestPutNotPersistedKeepsTable: when the state file cannot be written the
// PUT fails and nothing changes anywhere.
func TestPutNotPersistedKeepsTable(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "not-a-dir")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		e := newEnv(t, file, []routes.Route{{Model: "smol"}})
		res := e.put(`{"routes":[]}`, `"1"`)
		if res.Err == nil || res.Epoch != 1 || len(res.Routes) != 1 {
			t.Fatalf("PUT into an unwritable state dir: %+v", res)
		}
		if errors.Is(res.Err, admin.ErrInvalidRoutes) || errors.Is(res.Err, admin.ErrETagMismatch) {
			t.Fatalf("persistence failure reported as a client error: %v", res.Err)
		}
		if got := e.ask(e.admin, &admin.GetRoutes{}).(*admin.RoutesResult); got.Epoch != 1 || len(got.Routes) != 1 {
			t.Fatalf("table changed: %+v", got)
		}
		if w := e.ask(e.router, &router.ListWorkers{}).(*router.WorkersResult); w.Epoch != 1 {
			t.Fatalf("router epoch %d, want 1", w.Epoch)
		}
		if ack := e.beat("w1", "smol"); ack.Epoch != 1 {
			t.Fatalf("ack epoch %d, want 1", ack.Epoch)
		}
	})
}

func TestDrainResolvesAndApplies(t *testing.T) {
	bubble.Test(t, func(t *testing.T) {
		e := newEnv(t, "", []routes.Route{
			{Model: "smol", Aliases: []string{"smol-latest"}, Backends: []routes.Backend{{Model: "smol-v3", Weight: 0.9}, {Model: "smol-v4", Weight: 0.1}}},
			{Model: "auto", Cascade: []routes.Step{{Model: "smol", AcceptIf: "mean_logprob > -1"}, {Model: "big"}}},
		})
		e.beat("a", "smol-v3")
		e.beat("b", "smol-v4")
		e.beat("c", "big")
		e.beat("d", "solo")
		drain := func(model string, on bool) *admin.DrainResult {
			t.Helper()
			return e.ask(e.admin, &admin.Drain{Model: model, On: on, KeyName: "ops"}).(*admin.DrainResult)
		}
		routable := func() map[string]bool {
			out := map[string]bool{}
			for _, w := range e.ask(e.router, &router.ListWorkers{}).(*router.WorkersResult).Workers {
				out[w.ID] = w.Routable
			}
			return out
		}

		if res := drain("nope", true); !errors.Is(res.Err, admin.ErrModelNotFound) {
			t.Fatalf("drain of an unknown model: %+v", res)
		}
		res := drain("smol-latest", true)
		if res.Err != nil || !reflect.DeepEqual(res.Models, []string{"smol-v3", "smol-v4"}) || res.Workers != 2 {
			t.Fatalf("drain of an alias: %+v", res)
		}
		// Answered after the registry told the router: no wait needed.
		if got := routable(); !reflect.DeepEqual(got, map[string]bool{"a": false, "b": false, "c": true, "d": true}) {
			t.Fatalf("routable after drain: %v", got)
		}
		if ack := e.beat("a", "smol-v3"); !ack.Drain {
			t.Fatal("drained worker's ack does not say drain")
		}
		// A worker's model that no route names: the router knows it.
		if res := drain("solo", true); res.Err != nil || !reflect.DeepEqual(res.Models, []string{"solo"}) || res.Workers != 1 {
			t.Fatalf("drain of a worker's model: %+v", res)
		}
		// A cascade reaches every step's served models.
		if res := drain("auto", false); res.Err != nil || !reflect.DeepEqual(res.Models, []string{"smol-v3", "smol-v4", "big"}) || res.Workers != 3 {
			t.Fatalf("resume of a cascade: %+v", res)
		}
		if got := routable(); !reflect.DeepEqual(got, map[string]bool{"a": true, "b": true, "c": true, "d": false}) {
			t.Fatalf("routable after resume: %v", got)
		}
		// solo's worker goes away; it can still be resumed.
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if res := drain("solo", false); res.Err != nil || !reflect.DeepEqual(res.Models, []string{"solo"}) || res.Workers != 0 {
			t.Fatalf("resume of a drained model with no worker left: %+v", res)
		}
		if ack := e.beat("d", "solo"); ack.Drain {
			t.Fatal("resumed worker's ack still says drain")
		}
	})
}

// TestWriteOutcomesCountDrains: OnWrite hears every drain and resume, a
// drain of an unknown model as model_not_found, and a PUT refused because
// the epoch is exhausted as epoch_exhausted (not internal_error).
func TestWriteOutcomesCountDrains(t *testing.T) {
	sys := actorsys.New(zerolog.Nop())
	t.Cleanup(sys.Shutdown)
	table, err := routes.NewTable([]routes.Route{{Model: "smol"}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	adm := sys.Root.Spawn(admin.Props(admin.Deps{Logger: zerolog.Nop(), Table: table, Epoch: math.MaxUint64,
		OnWrite: func(outcome string) { mu.Lock(); got = append(got, outcome); mu.Unlock() }}))
	ask := func(msg any) any {
		t.Helper()
		res, err := sys.Root.RequestFuture(adm, msg, 5*time.Second).Result()
		if err != nil {
			t.Fatalf("ask %T: %v", msg, err)
		}
		return res
	}
	if r := ask(&admin.Drain{Model: "smol", On: true}).(*admin.DrainResult); r.Err != nil {
		t.Fatalf("drain: %v", r.Err)
	}
	if r := ask(&admin.Drain{Model: "smol"}).(*admin.DrainResult); r.Err != nil {
		t.Fatalf("resume: %v", r.Err)
	}
	if r := ask(&admin.Drain{Model: "nope", On: true}).(*admin.DrainResult); !errors.Is(r.Err, admin.ErrModelNotFound) {
		t.Fatalf("drain of an unknown model: %v", r.Err)
	}
	if r := ask(&admin.PutRoutes{Body: []byte(`{"routes":[]}`), IfMatch: admin.ETag(math.MaxUint64)}).(*admin.PutResult); !errors.Is(r.Err, admin.ErrEpochExhausted) {
		t.Fatalf("PUT at the last epoch: %v", r.Err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"ok", "ok", "model_not_found", "epoch_exhausted"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("OnWrite heard %v, want %v", got, want)
	}
}
