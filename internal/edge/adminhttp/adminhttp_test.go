package adminhttp_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/admin"
	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/statefile"
	"github.com/tlgate/tlgate/internal/adapter/store/filestore"
	"github.com/tlgate/tlgate/internal/edge/adminhttp"
	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/wire/openai"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

const opsKey = "ops-secret"

// gateway is the admin slice of the gateway, wired the way cmd/gateway
// does: the table and epoch come from state_dir when it holds one, else
// from the configuration's routes at epoch 1.
type gateway struct {
	t                  *testing.T
	sys                *actor.ActorSystem
	reg, router, admin *actor.PID
	h                  http.Handler
}

func start(t *testing.T, stateDir string, configured []routes.Route, maxBody int64) *gateway {
	t.Helper()
	epoch, rs, found, err := statefile.Load(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if !found {
		epoch, rs = 1, configured
	}
	table, err := routes.NewTable(rs)
	if err != nil {
		t.Fatal(err)
	}
	kr, err := auth.New([]auth.KeySpec{
		{Name: "ops", Secret: opsKey, Scopes: []string{"admin"}},
		{Name: "app", Secret: "app-secret", Scopes: []string{"inference", "debug"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sys := actorsys.New(zerolog.Nop())
	g := &gateway{t: t, sys: sys}
	g.reg = sys.Root.Spawn(registry.Props(registry.NewState(registry.Config{Interval: 2 * time.Second, MissLimit: 3, Epoch: epoch})))
	g.router = sys.Root.Spawn(router.Props(router.NewState(router.Config{Policy: policy.NameLeastOutstanding}, table, epoch), g.reg))
	g.admin = sys.Root.Spawn(admin.Props(admin.Deps{Router: g.router, Registry: g.reg, Store: filestore.New(stateDir, epoch), Logger: zerolog.Nop(), Table: table, Epoch: epoch}))
	g.h = adminhttp.New(adminhttp.Deps{Root: sys.Root, Admin: g.admin, Router: g.router, Keyring: kr, MaxBodyBytes: maxBody, Timeout: 5 * time.Second})
	t.Cleanup(g.stop)
	return g
}

func (g *gateway) stop() {
	if g.sys == nil {
		return
	}
	for _, pid := range []*actor.PID{g.admin, g.router, g.reg} {
		_ = g.sys.Root.StopFuture(pid).Wait()
	}
	g.sys.Shutdown()
	g.sys = nil
	time.Sleep(2 * time.Second) // let protoactor's dead-letter throttle finish
}

func (g *gateway) do(method, path, key, body string, header ...string) *httptest.ResponseRecorder {
	g.t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	g.h.ServeHTTP(rec, req)
	return rec
}

func (g *gateway) beat(id, model string, queue uint32) *controlv1.HeartbeatAck {
	g.t.Helper()
	s := &controlv1.WorkerStatus{WorkerId: id, Model: model, HttpAddress: "127.0.0.1:8001", QueueDepth: queue,
		KvFreeBlocks: 30, KvTotalBlocks: 40, Role: controlv1.Role_ROLE_UNIFIED}
	res, err := g.sys.Root.RequestFuture(g.reg, &registry.Heartbeat{Status: s, Arrived: time.Now(), Source: fleet.SourceHeartbeat}, time.Second).Result()
	if err != nil {
		g.t.Fatal(err)
	}
	synctest.Wait() // the router has the change
	return res.(*controlv1.HeartbeatAck)
}

// expect checks a response's status and, for an error, its OpenAI code.
func expect(t *testing.T, what string, rec *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("%s: status %d, want %d; body %s", what, rec.Code, status, rec.Body)
	}
	if code == "" {
		return
	}
	var e openai.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Code != code {
		t.Fatalf("%s: body %s, want error code %s", what, rec.Body, code)
	}
}

func errorOf(t *testing.T, rec *httptest.ResponseRecorder) openai.ErrorDetail {
	t.Helper()
	var e openai.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatal(err)
	}
	return e.Error
}

func workers(t *testing.T, g *gateway) (adminhttp.WorkersBody, []map[string]any) {
	t.Helper()
	rec := g.do("GET", "/admin/v1/workers", opsKey, "")
	expect(t, "GET workers", rec, 200, "")
	var body adminhttp.WorkersBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	var raw struct{ Workers []map[string]any }
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	return body, raw.Workers
}

func routable(t *testing.T, g *gateway) map[string]bool {
	t.Helper()
	body, _ := workers(t, g)
	out := map[string]bool{}
	for _, w := range body.Workers {
		out[w.ID] = w.Routable
	}
	return out
}

var configured = []routes.Route{
	{Model: "smol", Aliases: []string{"smol-latest"}, Backends: []routes.Backend{{Model: "smol-v3", Weight: 1}}},
}

// TestAdminRoutesWorkersDrain walks the admin API: the workers with the
// epoch, in-flight counts and routability; the routes with their ETag; a
// PUT refused without If-Match (428), with a stale one (412) and with a bad
// cascade (400 naming the field), then accepted (200, new ETag, epoch + 1,
// which the next heartbeat ack carries); a drain of an unknown model (404)
// and of a route (202), after which its worker is not routable and its ack
// says drain, and a resume that makes it routable again.
func TestAdminRoutesWorkersDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := start(t, t.TempDir(), configured, 0)
		t0 := time.Now()
		g.beat("a", "smol-v3", 2)
		g.beat("b", "big", 0)
		// One request in flight on a.
		res, err := g.sys.Root.RequestFuture(g.router, &router.Route{Request: router.Request{Model: "smol", RequestID: "r1"}}, time.Second).Result()
		if err != nil || res.(*router.RouteResult).Err != nil {
			t.Fatalf("route: %v %+v", err, res)
		}

		// Workers.
		body, raw := workers(t, g)
		if body.Epoch != 1 || len(body.Workers) != 2 {
			t.Fatalf("workers: %+v", body)
		}
		for _, name := range []string{"id", "http_address", "grpc_address", "kv_address", "role", "model", "kv_format",
			"queue_depth", "running", "kv_free_blocks", "kv_total_blocks", "draining", "in_flight", "routable",
			"last_heartbeat", "source", "kind", "prefix_index_chunks", "cache_view"} {
			if _, ok := raw[0][name]; !ok {
				t.Errorf("worker JSON lacks %q: %v", name, raw[0])
			}
		}
		a := body.Workers[0]
		if a.ID != "a" || a.Model != "smol-v3" || a.Role != "unified" || a.QueueDepth != 2 || a.InFlight != 1 || !a.Routable ||
			a.KVFreeBlocks != 30 || a.KVTotalBlocks != 40 || a.HTTPAddress != "127.0.0.1:8001" || a.Source != "heartbeat" {
			t.Errorf("worker a: %+v", a)
		}
		if hb, err := time.Parse(time.RFC3339, a.LastHeartbeat); err != nil || !hb.Equal(t0) {
			t.Errorf("last_heartbeat %q (%v), want %v in RFC 3339", a.LastHeartbeat, err, t0)
		}
		if body.Workers[1].ID != "b" || body.Workers[1].InFlight != 0 {
			t.Errorf("worker b: %+v", body.Workers[1])
		}

		// Routes.
		rec := g.do("GET", "/admin/v1/routes", opsKey, "")
		expect(t, "GET routes", rec, 200, "")
		if etag := rec.Header().Get("ETag"); etag != `"1"` {
			t.Fatalf("ETag %q, want \"1\"", etag)
		}
		if got, want := strings.TrimSpace(rec.Body.String()), `{"epoch":1,"routes":[{"model":"smol","aliases":["smol-latest"],"backends":[{"model":"smol-v3","weight":1}]}]}`; got != want {
			t.Fatalf("routes body\n got %s\nwant %s", got, want)
		}

		next := `{"routes":[
			{"model":"smol","aliases":["smol-latest"],"backends":[{"model":"smol-v3","weight":1}]},
			{"model":"auto","cascade":[{"model":"smol","accept_if":"mean_logprob > -1.2"},{"model":"big"}]}]}`
		expect(t, "PUT without If-Match", g.do("PUT", "/admin/v1/routes", opsKey, next), 428, openai.CodeIfMatchRequired)
		expect(t, "PUT with a stale ETag", g.do("PUT", "/admin/v1/routes", opsKey, next, "If-Match", `"0"`), 412, openai.CodeETagMismatch)
		expect(t, "PUT with a weak ETag", g.do("PUT", "/admin/v1/routes", opsKey, next, "If-Match", `W/"1"`), 412, openai.CodeETagMismatch)
		bad := `{"routes":[{"model":"auto","cascade":[{"model":"smol"},{"model":"big"}]}]}`
		rec = g.do("PUT", "/admin/v1/routes", opsKey, bad, "If-Match", `"1"`)
		expect(t, "PUT with a bad cascade", rec, 400, openai.CodeInvalidRoutes)
		if e := errorOf(t, rec); !strings.Contains(e.Message, "routes[0].cascade[0].accept_if: required") ||
			e.Param == nil || *e.Param != "routes[0].cascade[0].accept_if" {
			t.Fatalf("400 does not name the field: %+v", e)
		}
		rec = g.do("PUT", "/admin/v1/routes", opsKey, `{"routes":[{"model":"x","backend":[]}]}`, "If-Match", `"1"`)
		expect(t, "PUT with an unknown field", rec, 400, openai.CodeInvalidRoutes)
		if e := errorOf(t, rec); !strings.Contains(e.Message, "routes[0].backend: unknown field") {
			t.Fatalf("400 does not name the field: %+v", e)
		}
		if rec := g.do("GET", "/admin/v1/routes", opsKey, ""); rec.Header().Get("ETag") != `"1"` {
			t.Fatalf("a refused PUT changed the table: %s %s", rec.Header().Get("ETag"), rec.Body)
		}

		rec = g.do("PUT", "/admin/v1/routes", opsKey, next, "If-Match", `"1"`)
		expect(t, "PUT", rec, 200, "")
		if etag := rec.Header().Get("ETag"); etag != `"2"` {
			t.Fatalf("ETag after PUT %q, want \"2\"", etag)
		}
		var doc routes.Document
		if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || doc.Epoch != 2 || len(doc.Routes) != 2 || doc.Routes[1].Model != "auto" {
			t.Fatalf("PUT body %s (%v)", rec.Body, err)
		}
		rec = g.do("GET", "/admin/v1/routes", opsKey, "")
		if rec.Header().Get("ETag") != `"2"` || !strings.Contains(rec.Body.String(), `"epoch":2`) {
			t.Fatalf("GET after PUT: %s %s", rec.Header().Get("ETag"), rec.Body)
		}
		if ack := g.beat("b", "big", 0); ack.Epoch != 2 {
			t.Fatalf("heartbeat ack epoch %d after PUT, want 2", ack.Epoch)
		}
		if body, _ := workers(t, g); body.Epoch != 2 {
			t.Fatalf("workers epoch %d after PUT, want 2", body.Epoch)
		}
		// Unquoted If-Match is accepted too.
		rec = g.do("PUT", "/admin/v1/routes", opsKey, next, "If-Match", `2`)
		expect(t, "PUT with an unquoted If-Match", rec, 200, "")
		if rec.Header().Get("ETag") != `"3"` {
			t.Fatalf("ETag %q, want \"3\"", rec.Header().Get("ETag"))
		}

		// Drain.
		expect(t, "drain of an unknown model", g.do("POST", "/admin/v1/models/nope:drain", opsKey, ""), 404, openai.CodeModelNotFound)
		rec = g.do("POST", "/admin/v1/models/smol-latest:drain", opsKey, "")
		expect(t, "drain", rec, 202, "")
		if got := strings.TrimSpace(rec.Body.String()); got != `{"model":"smol-latest","drained":["smol-v3"],"workers":1}` {
			t.Fatalf("drain body %s", got)
		}
		if got := routable(t, g); got["a"] || !got["b"] {
			t.Fatalf("routable after drain: %v", got)
		}
		if ack := g.beat("a", "smol-v3", 0); !ack.Drain {
			t.Fatal("the drained worker's next ack does not say drain")
		}
		if ack := g.beat("b", "big", 0); ack.Drain {
			t.Fatal("another model's ack says drain")
		}
		rec = g.do("POST", "/admin/v1/models/smol:resume", opsKey, "")
		expect(t, "resume", rec, 202, "")
		if got := strings.TrimSpace(rec.Body.String()); got != `{"model":"smol","resumed":["smol-v3"],"workers":1}` {
			t.Fatalf("resume body %s", got)
		}
		if got := routable(t, g); !got["a"] || !got["b"] {
			t.Fatalf("routable after resume: %v", got)
		}
		if ack := g.beat("a", "smol-v3", 0); ack.Drain {
			t.Fatal("the resumed worker's ack still says drain")
		}
		// A worker's model with no route.
		rec = g.do("POST", "/admin/v1/models/big:drain", opsKey, "")
		expect(t, "drain of a worker's model", rec, 202, "")
		if got := routable(t, g); got["b"] || !got["a"] {
			t.Fatalf("routable after draining big: %v", got)
		}
	})
}

// TestAdminPaths covers the edge's own answers: the drain path split, body
// limits, unknown paths and methods.
func TestAdminPaths(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := start(t, t.TempDir(), configured, 256)
		g.beat("a", "org/model:q4", 0)
		cases := []struct {
			method, path, body string
			header             []string
			status             int
			code               string
		}{
			// Model ids may hold '/' and ':': split at the last ':'.
			{"POST", "/admin/v1/models/org/model:q4:drain", "", nil, 202, ""},
			{"POST", "/admin/v1/models/org/model:q4:resume", "", nil, 202, ""},
			{"POST", "/admin/v1/models/smol:explode", "", nil, 404, adminhttp.CodeNotFound},
			{"POST", "/admin/v1/models/smol", "", nil, 404, adminhttp.CodeNotFound},
			{"POST", "/admin/v1/models/:drain", "", nil, 404, openai.CodeModelNotFound},
			{"GET", "/admin/v1/models/smol:drain", "", nil, 405, adminhttp.CodeMethodNotAllowed},
			{"DELETE", "/admin/v1/routes", "", nil, 405, adminhttp.CodeMethodNotAllowed},
			{"POST", "/admin/v1/workers", "", nil, 405, adminhttp.CodeMethodNotAllowed},
			{"GET", "/admin/v1/nothing", "", nil, 404, adminhttp.CodeNotFound},
			{"PUT", "/admin/v1/routes", `{"routes":[` + strings.Repeat(`{"model":"m"},`, 30) + `]}`, []string{"If-Match", `"1"`}, 413, openai.CodeRequestTooLarge},
			{"PUT", "/admin/v1/routes", `{"routes":`, []string{"If-Match", `"1"`}, 400, openai.CodeInvalidRoutes},
			{"PUT", "/admin/v1/routes", `{"routes":[]}`, []string{"If-Match", `*`}, 200, ""},
		}
		for _, c := range cases {
			rec := g.do(c.method, c.path, opsKey, c.body, c.header...)
			expect(t, c.method+" "+c.path, rec, c.status, c.code)
		}
		rec := g.do("DELETE", "/admin/v1/routes", opsKey, "")
		if allow := rec.Header().Get("Allow"); allow != "GET, HEAD, PUT" {
			t.Errorf("Allow %q", allow)
		}
		// 413 also when the length is not announced.
		req := httptest.NewRequest("PUT", "/admin/v1/routes", strings.NewReader(strings.Repeat(" ", 300)+`{"routes":[]}`))
		req.ContentLength = -1
		req.Header.Set("Authorization", "Bearer "+opsKey)
		req.Header.Set("If-Match", `"2"`)
		rec = httptest.NewRecorder()
		g.h.ServeHTTP(rec, req)
		expect(t, "PUT with a chunked large body", rec, 413, openai.CodeRequestTooLarge)
	})
}

// TestAdminScopeRequired: every admin path, known or not, needs a key with
// the admin scope.
func TestAdminScopeRequired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := start(t, t.TempDir(), configured, 0)
		paths := []struct{ method, path string }{
			{"GET", "/admin/v1/workers"},
			{"GET", "/admin/v1/routes"},
			{"PUT", "/admin/v1/routes"},
			{"POST", "/admin/v1/models/smol:drain"},
			{"POST", "/admin/v1/models/smol:resume"},
			{"GET", "/admin/v1/unknown"},
		}
		for _, p := range paths {
			what := p.method + " " + p.path
			expect(t, what+" without a key", g.do(p.method, p.path, "", `{"routes":[]}`, "If-Match", `"1"`), 401, openai.CodeInvalidAPIKey)
			expect(t, what+" with a wrong key", g.do(p.method, p.path, "nope", `{"routes":[]}`, "If-Match", `"1"`), 401, openai.CodeInvalidAPIKey)
			expect(t, what+" without the admin scope", g.do(p.method, p.path, "app-secret", `{"routes":[]}`, "If-Match", `"1"`), 403, openai.CodeInsufficientScope)
		}
		// Nothing above changed anything.
		if rec := g.do("GET", "/admin/v1/routes", opsKey, ""); rec.Code != 200 || rec.Header().Get("ETag") != `"1"` {
			t.Fatalf("GET with the admin key: %d %s", rec.Code, rec.Header().Get("ETag"))
		}
		if rec := g.do("POST", "/admin/v1/models/smol:drain", opsKey, ""); rec.Code != 202 {
			t.Fatalf("drain with the admin key: %d %s", rec.Code, rec.Body)
		}
	})
}

// TestRoutesSurviveRestart: a table PUT through the API is what a gateway
// restarted on the same state_dir serves, at the same epoch (its acks carry
// it too), whatever the configuration says; a corrupt routes.json stops the
// start with an error naming the file.
func TestRoutesSurviveRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		g := start(t, dir, configured, 0)
		put := `{"routes":[{"model":"auto","cascade":[{"model":"smol","accept_if":"min_logprob >= -2"},{"model":"big"}]},{"model":"smol","backends":[{"model":"smol-v3","weight":0.9},{"model":"smol-v4","weight":0.1}]}]}`
		expect(t, "PUT", g.do("PUT", "/admin/v1/routes", opsKey, put, "If-Match", `"1"`), 200, "")
		before := g.do("GET", "/admin/v1/routes", opsKey, "")
		g.stop()

		g2 := start(t, dir, configured, 0)
		after := g2.do("GET", "/admin/v1/routes", opsKey, "")
		if after.Header().Get("ETag") != `"2"` || after.Body.String() != before.Body.String() {
			t.Fatalf("after restart: %s %s\nbefore: %s %s", after.Header().Get("ETag"), after.Body, before.Header().Get("ETag"), before.Body)
		}
		models, err := g2.sys.Root.RequestFuture(g2.router, &router.ListModels{}, time.Second).Result()
		if err != nil || !slices.Equal(models.([]string), []string{"auto", "smol"}) {
			t.Fatalf("restarted router serves %v (%v)", models, err)
		}
		if ack := g2.beat("a", "smol-v3", 0); ack.Epoch != 2 {
			t.Fatalf("ack epoch after restart %d, want 2", ack.Epoch)
		}
		// The restarted gateway goes on from there.
		expect(t, "stale PUT after restart", g2.do("PUT", "/admin/v1/routes", opsKey, `{"routes":[]}`, "If-Match", `"1"`), 412, openai.CodeETagMismatch)
		expect(t, "PUT after restart", g2.do("PUT", "/admin/v1/routes", opsKey, `{"routes":[]}`, "If-Match", `"2"`), 200, "")
		g2.stop()

		path := statefile.Path(dir)
		if err := os.WriteFile(path, []byte(`{"epoch":3,"routes":[{"model":"smol"`), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, _, err = statefile.Load(dir)
		if !errors.Is(err, statefile.ErrCorrupt) || !strings.Contains(err.Error(), path) {
			t.Fatalf("corrupt routes.json: %v, want an error naming %s", err, path)
		}
		t.Logf("corrupt file error: %v", err)
	})
}
