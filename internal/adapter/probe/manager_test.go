package probe

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// eventually polls cond until it holds, failing the test after a generous
// deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// scriptEngine is a vLLM-style engine (or, with kind openai, a generic one)
// whose answers are functions of how many health checks it has served.
type scriptEngine struct {
	srv  *httptest.Server
	kind Kind

	mu      sync.Mutex
	health  int                // health checks served
	hits    map[string]int     // requests by path
	healthy func(n int) bool   // nil: always
	metrics func(n int) string // nil: vllmMetrics(0, 0, 1000, 0)
	models  []string           // served by /v1/models
	stall   bool               // health checks wait for the client to go away
}

func newScriptEngine(t *testing.T, kind Kind, set func(e *scriptEngine)) *scriptEngine {
	t.Helper()
	e := &scriptEngine{kind: kind, hits: map[string]int{}, models: []string{"m1"}}
	if set != nil {
		set(e)
	}
	e.srv = httptest.NewServer(e)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *scriptEngine) addr() string { return e.srv.Listener.Addr().String() }

func (e *scriptEngine) set(f func(e *scriptEngine)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(e)
}

func (e *scriptEngine) hitCount(path string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hits[path]
}

func (e *scriptEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.hits[r.URL.Path]++
	isHealth := r.URL.Path == e.kind.healthPath()
	if isHealth {
		e.health++
	}
	n, healthy, metrics, models, stall := e.health, e.healthy, e.metrics, e.models, e.stall
	e.mu.Unlock()

	if isHealth && stall {
		<-r.Context().Done()
		return
	}
	if isHealth && healthy != nil && !healthy(n) {
		http.Error(w, "unhealthy", http.StatusServiceUnavailable)
		return
	}
	switch r.URL.Path {
	case "/health":
		w.WriteHeader(http.StatusOK)
	case "/v1/models":
		var ids []string
		for _, m := range models {
			ids = append(ids, fmt.Sprintf(`{"id":%q,"object":"model"}`, m))
		}
		fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(ids, ","))
	case "/metrics":
		text := vllmMetrics(0, 0, 1000, 0)
		if metrics != nil {
			text = metrics(n)
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(text))
	default:
		http.NotFound(w, r)
	}
}

// vllmMetrics renders the vLLM metrics the figures come from.
func vllmMetrics(waiting, running, blocks int, usage float64) string {
	return fmt.Sprintf(`# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m1"} %d
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m1"} %d
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m1"} %g
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="%d"} 1.0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.75e+09
`, waiting, running, usage, blocks)
}

// event is one message the registry published to its subscriber.
type event struct {
	id     string
	gone   string // the WorkerGone reason; "" for a WorkerChanged
	worker fleet.Worker
}

func (ev event) String() string {
	if ev.gone != "" {
		return ev.id + " gone " + ev.gone
	}
	return fmt.Sprintf("%s q=%d", ev.id, ev.worker.QueueDepth)
}

// fleetEnv is a real registry actor with a subscriber recording what it
// publishes, and a Manager feeding it.
type fleetEnv struct {
	t      *testing.T
	sys    *actor.ActorSystem
	reg    *actor.PID
	client *http.Client
	m      *Manager

	mu         sync.Mutex
	events     []event
	registered map[string]int
	probes     map[string][]bool
	onProbe    func(id string, n int, ok bool) // called after recording, from the loops
}

func newFleetEnv(t *testing.T, onProbe func(id string, n int, ok bool)) *fleetEnv {
	t.Helper()
	env := &fleetEnv{t: t, registered: map[string]int{}, probes: map[string][]bool{}, onProbe: onProbe}
	env.sys = actorsys.New(zerolog.Nop())
	st := registry.NewState(registry.Config{
		Interval:  time.Second, // k·T = 3 s: only the Manager removes workers here
		MissLimit: 3,
		OnRegister: func(w fleet.Worker) {
			env.mu.Lock()
			env.registered[w.ID]++
			env.mu.Unlock()
		},
	})
	env.reg = env.sys.Root.Spawn(registry.Props(st))
	sub := env.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		var ev event
		switch m := c.Message().(type) {
		case *registry.WorkerChanged:
			ev = event{id: m.Worker.ID, worker: m.Worker}
		case *registry.WorkerGone:
			ev = event{id: m.ID, gone: m.Reason}
		default:
			return
		}
		env.mu.Lock()
		env.events = append(env.events, ev)
		env.mu.Unlock()
	}))
	env.sys.Root.Send(env.reg, &registry.Subscribe{PID: sub})
	t.Cleanup(func() {
		_ = env.sys.Root.StopFuture(sub).Wait()
		_ = env.sys.Root.StopFuture(env.reg).Wait()
		env.sys.Shutdown()
	})

	env.client = &http.Client{Transport: &http.Transport{}}
	t.Cleanup(env.client.CloseIdleConnections)
	env.m = NewManager(ManagerConfig{
		Root:      env.sys.Root,
		Registry:  env.reg,
		MissLimit: 3,
		Client:    env.client,
		Logger:    zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
		OnProbe: func(id string, ok bool) {
			env.mu.Lock()
			env.probes[id] = append(env.probes[id], ok)
			n := len(env.probes[id])
			env.mu.Unlock()
			if env.onProbe != nil {
				env.onProbe(id, n, ok)
			}
		},
	})
	t.Cleanup(env.m.Close)
	return env
}

func (env *fleetEnv) probeCount(id string) int {
	env.mu.Lock()
	defer env.mu.Unlock()
	return len(env.probes[id])
}

func (env *fleetEnv) probeOutcomes(id string) []bool {
	env.mu.Lock()
	defer env.mu.Unlock()
	return slices.Clone(env.probes[id])
}

func (env *fleetEnv) registrations(id string) int {
	env.mu.Lock()
	defer env.mu.Unlock()
	return env.registered[id]
}

// eventsOf lists the events about id, as strings.
func (env *fleetEnv) eventsOf(id string) []string {
	env.mu.Lock()
	defer env.mu.Unlock()
	var out []string
	for _, ev := range env.events {
		if ev.id == id {
			out = append(out, ev.String())
		}
	}
	return out
}

// workers snapshots the registry (from any goroutine: it reports errors
// instead of failing the test).
func (env *fleetEnv) workers(routableOnly bool) (map[string]fleet.Worker, error) {
	res, err := env.sys.Root.RequestFuture(env.reg, &registry.Snapshot{RoutableOnly: routableOnly}, 5*time.Second).Result()
	if err != nil {
		return nil, err
	}
	out := map[string]fleet.Worker{}
	for _, w := range res.(*registry.SnapshotResult).Workers {
		out[w.ID] = w
	}
	return out, nil
}

// routable reports whether id is routable now (failing the test on a
// registry error; call it from the test goroutine only).
func (env *fleetEnv) routable(id string) (fleet.Worker, bool) {
	env.t.Helper()
	ws, err := env.workers(true)
	if err != nil {
		env.t.Fatalf("snapshot: %v", err)
	}
	w, ok := ws[id]
	return w, ok
}

func engineConf(id string, e *scriptEngine, model string, interval time.Duration) config.Engine {
	return config.Engine{ID: id, HTTPAddress: e.addr(), Model: model, Kind: string(e.kind), ProbeInterval: config.D(interval)}
}

// presence records, from inside OnProbe (before the probe's heartbeat),
// whether a worker was routable at given probe numbers.
type presence struct {
	mu  sync.Mutex
	at  map[int]bool
	err error
}

func (p *presence) record(env *fleetEnv, id string, n int) {
	ws, err := env.workers(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.err = err
		return
	}
	_, ok := ws[id]
	p.at[n] = ok
}

func (p *presence) get(t *testing.T, n int) (routable, recorded bool) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		t.Fatalf("snapshot from OnProbe: %v", p.err)
	}
	routable, recorded = p.at[n]
	return routable, recorded
}

func TestManagerVLLMRoutableAfterTwoGoodProbes(t *testing.T) {
	eng := newScriptEngine(t, KindVLLM, func(e *scriptEngine) {
		e.metrics = func(int) string { return vllmMetrics(4, 2, 1000, 0.25) }
	})
	seen := &presence{at: map[int]bool{}}
	var env *fleetEnv
	env = newFleetEnv(t, func(id string, n int, _ bool) {
		if n <= 2 {
			seen.record(env, id, n) // before probe n's heartbeat, if any
		}
	})
	env.m.Apply([]config.Engine{engineConf("v1", eng, "m1", 20*time.Millisecond)})

	var w fleet.Worker
	eventually(t, "v1 routable", func() (ok bool) { w, ok = env.routable("v1"); return ok })
	for n := 1; n <= 2; n++ {
		if routable, recorded := seen.get(t, n); !recorded || routable {
			t.Errorf("before the heartbeat of probe %d: routable %v (recorded %v), want not routable", n, routable, recorded)
		}
	}
	if got := env.registrations("v1"); got != 1 {
		t.Errorf("registrations = %d, want 1", got)
	}
	want := fleet.Worker{
		ID: "v1", HTTPAddress: eng.addr(), Role: fleet.RoleUnified, Model: "m1",
		QueueDepth: 4, Running: 2, KVTotalBlocks: 1000, KVFreeBlocks: 750, KVBlockTokens: 16,
		StartedAt: time.Unix(1_750_000_000, 0).UTC(), Source: fleet.SourceProbe, Kind: "vllm",
	}
	w.LastHeartbeat, w.Deadline = time.Time{}, time.Time{}
	if !reflect.DeepEqual(w, want) {
		t.Errorf("worker =\n %+v\nwant\n %+v", w, want)
	}

	// The figures follow what the engine reports.
	eng.set(func(e *scriptEngine) {
		e.metrics = func(int) string { return vllmMetrics(9, 7, 1000, 0.5) }
	})
	eventually(t, "new figures", func() bool {
		w, ok := env.routable("v1")
		return ok && w.QueueDepth == 9 && w.Running == 7 && w.KVFreeBlocks == 500
	})
	if got := eng.hitCount("/v1/models"); got == 0 {
		t.Error("GET /v1/models never read: the adapters are not refreshed")
	}
}

func TestManagerRemovesAfterMissLimitWithoutFlapping(t *testing.T) {
	// Probe n reports queue depth n, so each heartbeat says which probe it
	// carries. Probe 5 fails alone; probes 8 to 12 fail in a row.
	eng := newScriptEngine(t, KindVLLM, func(e *scriptEngine) {
		e.healthy = func(n int) bool { return n != 5 && (n < 8 || n > 12) }
		e.metrics = func(n int) string { return vllmMetrics(n, 1, 100, 0) }
	})
	seen := &presence{at: map[int]bool{}}
	var env *fleetEnv
	env = newFleetEnv(t, func(id string, n int, _ bool) {
		if n == 6 || n == 11 {
			seen.record(env, id, n)
		}
	})
	env.m.Apply([]config.Engine{engineConf("e", eng, "m1", 20*time.Millisecond)})

	want := []string{
		"e q=2", "e q=3", "e q=4",
		"e q=4", // probe 5 failed: the last good status is kept
		"e q=6", "e q=7",
		"e q=7", "e q=7", // probes 8 and 9 failed
		"e gone removed", // probe 10, the third failure in a row
		"e q=14",         // probes 13 and 14 good again
	}
	eventually(t, "ten events about e", func() bool { return len(env.eventsOf("e")) >= len(want) })
	if got := env.eventsOf("e")[:len(want)]; !slices.Equal(got, want) {
		t.Errorf("events =\n %q\nwant\n %q", got, want)
	}
	if routable, recorded := seen.get(t, 6); !recorded || !routable {
		t.Errorf("after one failed probe: routable %v (recorded %v), want routable", routable, recorded)
	}
	if routable, recorded := seen.get(t, 11); !recorded || routable {
		t.Errorf("after three failed probes: routable %v (recorded %v), want not routable", routable, recorded)
	}
	outcomes := env.probeOutcomes("e")[:14]
	for i, ok := range outcomes {
		n := i + 1
		if wantOK := n != 5 && (n < 8 || n > 12); ok != wantOK {
			t.Errorf("OnProbe for probe %d: ok = %v, want %v", n, ok, wantOK)
		}
	}
	if got := env.registrations("e"); got != 2 {
		t.Errorf("registrations = %d, want 2 (first, then after the removal)", got)
	}
}

func TestManagerDiscoversModel(t *testing.T) {
	for _, kind := range []Kind{KindVLLM, KindOpenAI} {
		t.Run(string(kind), func(t *testing.T) {
			eng := newScriptEngine(t, kind, func(e *scriptEngine) {
				e.models = []string{"org/served-model", "other"}
			})
			env := newFleetEnv(t, nil)
			env.m.Apply([]config.Engine{engineConf("d1", eng, "", 20*time.Millisecond)})
			var w fleet.Worker
			eventually(t, "d1 routable", func() (ok bool) { w, ok = env.routable("d1"); return ok })
			if w.Model != "org/served-model" || w.Kind != string(kind) {
				t.Errorf("model %q kind %q, want org/served-model %s", w.Model, w.Kind, kind)
			}
			if eng.hitCount("/v1/models") == 0 {
				t.Error("GET /v1/models never asked")
			}
		})
	}
}

func TestManagerRejectsInvalidStatus(t *testing.T) {
	// The discovered model id has a space: fleet.Validate rejects it.
	eng := newScriptEngine(t, KindVLLM, func(e *scriptEngine) { e.models = []string{"bad model"} })
	seen := &presence{at: map[int]bool{}}
	var env *fleetEnv
	env = newFleetEnv(t, func(id string, n int, _ bool) {
		if n == 4 {
			seen.record(env, id, n) // probes 1 to 3 sent whatever they would
		}
	})
	env.m.Apply([]config.Engine{engineConf("bad", eng, "", 20*time.Millisecond)})
	eventually(t, "four probes", func() bool { _, recorded := seen.get(t, 4); return recorded })
	for i, ok := range env.probeOutcomes("bad") {
		if ok {
			t.Errorf("probe %d reported ok for an invalid status", i+1)
		}
	}
	if routable, recorded := seen.get(t, 4); !recorded || routable {
		t.Errorf("after three probes: routable %v (recorded %v), want not routable", routable, recorded)
	}
	if got := env.registrations("bad"); got != 0 {
		t.Errorf("registrations = %d, want 0", got)
	}
}

func TestManagerApply(t *testing.T) {
	a := newScriptEngine(t, KindVLLM, nil)
	b := newScriptEngine(t, KindVLLM, nil)
	c := newScriptEngine(t, KindVLLM, nil)
	d := newScriptEngine(t, KindVLLM, nil)
	env := newFleetEnv(t, nil)
	const p = 20 * time.Millisecond
	routableNow := func(id string) bool { _, ok := env.routable(id); return ok }

	env.m.Apply([]config.Engine{engineConf("a", a, "m1", p), engineConf("b", b, "m1", p)})
	eventually(t, "a and b routable", func() bool { return routableNow("a") && routableNow("b") })

	// b goes, c comes, a stays; d cannot be probed (unknown kind) and a
	// duplicate of a is ignored.
	bad := engineConf("d", d, "m1", p)
	bad.Kind = "tgi"
	dup := engineConf("a", c, "m1", p)
	env.m.Apply([]config.Engine{engineConf("a", a, "m1", p), engineConf("c", c, "m1", p), bad, dup})
	if routableNow("b") {
		t.Error("b still routable after Apply returned")
	}
	bProbes, aProbes := env.probeCount("b"), env.probeCount("a")
	eventually(t, "c routable and a probed on", func() bool {
		return routableNow("c") && env.probeCount("a") >= aProbes+3
	})
	if got := env.probeCount("b"); got != bProbes {
		t.Errorf("b probed %d more times after its removal", got-bProbes)
	}
	if got := env.eventsOf("b"); len(got) == 0 || got[len(got)-1] != "b gone removed" {
		t.Errorf("b's last event %q, want b gone removed", got)
	}
	if env.probeCount("d") != 0 || d.hitCount("/health") != 0 {
		t.Error("an engine of unknown kind was probed")
	}
	if w, _ := env.routable("a"); w.HTTPAddress != a.addr() {
		t.Errorf("a at %s, want %s (the duplicate must be ignored)", w.HTTPAddress, a.addr())
	}

	// Only a's interval changes: a keeps its worker; c moves to b's
	// address: c is forgotten at once and comes back there.
	env.m.Apply([]config.Engine{engineConf("a", a, "m1", 2*p), engineConf("c", b, "m1", p)})
	if !routableNow("a") {
		t.Error("a not routable right after its interval changed")
	}
	if routableNow("c") {
		t.Error("c still routable at its old address right after Apply")
	}
	aProbes = env.probeCount("a")
	eventually(t, "c routable at b's address and a probed on", func() bool {
		w, ok := env.routable("c")
		return ok && w.HTTPAddress == b.addr() && env.probeCount("a") >= aProbes+3
	})
	for _, ev := range env.eventsOf("a") {
		if strings.Contains(ev, "gone") {
			t.Errorf("a left the registry: %s", ev)
		}
	}
	if got := env.registrations("a"); got != 1 {
		t.Errorf("a registered %d times, want 1", got)
	}
	if got := env.eventsOf("c"); !slices.Contains(got, "c gone removed") {
		t.Errorf("c's events %q lack its removal", got)
	}

	// Applying the same list again changes nothing.
	env.m.Apply([]config.Engine{engineConf("a", a, "m1", 2*p), engineConf("c", b, "m1", p)})
	if !routableNow("a") || !routableNow("c") {
		t.Error("an unchanged Apply removed a worker")
	}
}

func TestManagerClose(t *testing.T) {
	live := newScriptEngine(t, KindVLLM, nil)
	stuck := newScriptEngine(t, KindVLLM, func(e *scriptEngine) { e.stall = true })
	env := newFleetEnv(t, nil)
	env.m.Apply([]config.Engine{
		engineConf("live", live, "m1", 20*time.Millisecond),
		engineConf("stuck", stuck, "m1", 20*time.Millisecond),
	})
	eventually(t, "live routable and stuck probing", func() bool {
		_, ok := env.routable("live")
		return ok && stuck.hitCount("/health") > 0
	})
	env.m.mu.Lock()
	loops := make([]*loop, 0, len(env.m.loops))
	for _, l := range env.m.loops {
		loops = append(loops, l)
	}
	env.m.mu.Unlock()

	env.m.Close()
	for _, l := range loops {
		select {
		case <-l.done:
		default:
			t.Errorf("loop %s still running after Close", l.target.probe.ID)
		}
	}
	// The stalled probe was abandoned, not left to time out and counted.
	if got := env.probeCount("stuck"); got != 0 {
		t.Errorf("stuck engine reported %d probes", got)
	}
	env.m.Apply([]config.Engine{engineConf("late", live, "m1", 20*time.Millisecond)})
	env.m.mu.Lock()
	n := len(env.m.loops)
	env.m.mu.Unlock()
	if n != 0 {
		t.Errorf("%d loops after Apply following Close", n)
	}
	env.m.Close() // idempotent
	// Close leaves workers to the registry: the live one is still listed.
	if _, ok := env.routable("live"); !ok {
		t.Error("Close removed a worker")
	}
}

// TestTargetOf checks how configured engines become probe targets.
func TestTargetOf(t *testing.T) {
	m := NewManager(ManagerConfig{})
	t.Setenv("TLGATE_PROBE_TEST_AUTH", "Bearer from-env")
	tests := []struct {
		name    string
		e       config.Engine
		want    target
		wantErr bool
	}{
		{
			name: "default interval",
			e:    config.Engine{ID: "x", HTTPAddress: "127.0.0.1:1", Kind: "VLLM"},
			want: target{probe: Config{ID: "x", HTTPAddress: "127.0.0.1:1", Kind: KindVLLM}, interval: config.DefaultProbeInterval},
		},
		{
			name: "auth from the environment",
			e:    config.Engine{ID: "x", HTTPAddress: "127.0.0.1:1", Kind: "llama.cpp", AuthHeaderEnv: "TLGATE_PROBE_TEST_AUTH", ProbeInterval: config.D(time.Second)},
			want: target{probe: Config{ID: "x", HTTPAddress: "127.0.0.1:1", Kind: KindLlamaCpp, AuthHeader: "Bearer from-env"}, interval: time.Second},
		},
		{name: "unknown kind", e: config.Engine{ID: "x", HTTPAddress: "127.0.0.1:1", Kind: "tgi"}, wantErr: true},
		{name: "bad id", e: config.Engine{ID: "a b", HTTPAddress: "127.0.0.1:1", Kind: "vllm"}, wantErr: true},
		{name: "bad address", e: config.Engine{ID: "x", HTTPAddress: "nowhere", Kind: "vllm"}, wantErr: true},
		{name: "negative interval", e: config.Engine{ID: "x", HTTPAddress: "127.0.0.1:1", Kind: "vllm", ProbeInterval: config.D(-time.Second)}, wantErr: true},
		{name: "unset auth variable", e: config.Engine{ID: "x", HTTPAddress: "127.0.0.1:1", Kind: "vllm", AuthHeaderEnv: "TLGATE_PROBE_TEST_UNSET"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := m.targetOf(Engine{Engine: tt.e})
			if tt.wantErr {
				if err == nil {
					t.Fatalf("targetOf = %+v, want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("targetOf = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// TestManagerProbesEnginesim probes the reference engine as a vLLM server:
// model discovery, its load figures under a held request and a queued one,
// and its removal and return when it refuses connections.
func TestManagerProbesEnginesim(t *testing.T) {
	eng, err := enginesim.Start(context.Background(), enginesim.Config{
		Model: "sim-model", KVBlocks: 256, MaxRunning: 1,
		DecodePerToken:  time.Hour, // a request holds its sequence until cancelled
		ShutdownTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatalf("enginesim.Start: %v", err)
	}
	t.Cleanup(func() {
		if err := eng.Close(); err != nil {
			t.Errorf("enginesim Close: %v", err)
		}
	})
	env := newFleetEnv(t, nil)
	env.m.Apply([]config.Engine{{ID: "sim", HTTPAddress: eng.HTTPAddr(), Kind: "vllm", ProbeInterval: config.D(20 * time.Millisecond)}})
	var w fleet.Worker
	eventually(t, "sim routable", func() (ok bool) { w, ok = env.routable("sim"); return ok })
	if w.Model != "sim-model" || w.KVTotalBlocks != 256 || w.KVFreeBlocks != 256 || w.KVBlockTokens != enginesim.BlockTokens ||
		w.QueueDepth != 0 || w.Running != 0 || w.HTTPAddress != eng.HTTPAddr() || w.Source != fleet.SourceProbe || w.Kind != "vllm" {
		t.Errorf("idle engine seen as %+v", w)
	}

	// One request runs (holding its KV blocks), a second one waits.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			body := strings.NewReader(`{"model":"sim-model","prompt":"hello there, engine","max_tokens":64}`)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, eng.URL()+"/v1/completions", body)
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("Content-Type", "application/json")
			if resp, err := env.client.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	eventually(t, "one request running, one waiting", func() bool {
		s := eng.Stats()
		return s.Running == 1 && s.Waiting == 1
	})
	st := eng.Stats()
	if st.FreeBlocks >= st.TotalBlocks {
		t.Fatalf("the running request holds no KV blocks: %+v", st)
	}
	eventually(t, "the registry has the engine's load", func() bool {
		w, ok := env.routable("sim")
		return ok && w.QueueDepth == st.Waiting && w.Running == st.Running &&
			w.KVFreeBlocks == st.FreeBlocks && w.KVTotalBlocks == st.TotalBlocks
	})
	cancel()
	wg.Wait()

	// A refusing engine is removed after three failed probes, and comes
	// back after two good ones.
	if err := eng.SetFaults(enginesim.Faults{Refuse: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "sim removed", func() bool { return slices.Contains(env.eventsOf("sim"), "sim gone removed") })
	if _, ok := env.routable("sim"); ok {
		t.Error("sim routable after its removal")
	}
	if err := eng.SetFaults(enginesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "sim routable again", func() (ok bool) { _, ok = env.routable("sim"); return ok })
	if got := env.registrations("sim"); got != 2 {
		t.Errorf("registrations = %d, want 2", got)
	}
}

// TestManagerSetSource checks discovered engines beside configured ones:
// a listed engine wins an id both name, Draining makes a worker not
// routable while it stays registered, Role reaches the worker, and an
// empty set forgets the source's engines.
func TestManagerSetSource(t *testing.T) {
	a := newScriptEngine(t, KindVLLM, nil)
	b := newScriptEngine(t, KindVLLM, nil)
	c := newScriptEngine(t, KindVLLM, nil)
	env := newFleetEnv(t, nil)
	const p = 20 * time.Millisecond
	routableNow := func(id string) bool { _, ok := env.routable(id); return ok }

	env.m.Apply([]config.Engine{engineConf("a", a, "m1", p)})
	env.m.SetSource("found", []Engine{
		{Engine: engineConf("a", c, "m1", p)}, // a listed engine's id: ignored
		{Engine: engineConf("found:b", b, "m1", p), Role: controlv1.Role_ROLE_DECODE},
		{Engine: engineConf("found:c", c, "m1", p)},
	})
	eventually(t, "a, b and c routable", func() bool { return routableNow("a") && routableNow("found:b") && routableNow("found:c") })
	if w, _ := env.routable("a"); w.HTTPAddress != a.addr() {
		t.Errorf("a at %s, want the listed %s", w.HTTPAddress, a.addr())
	}
	if w, _ := env.routable("found:b"); w.Role != fleet.RoleDecode {
		t.Errorf("found:b role %q, want decode", w.Role)
	}

	// c drains: still registered, not routable; undrained, routable again
	// without registering anew.
	env.m.SetSource("found", []Engine{
		{Engine: engineConf("found:b", b, "m1", p), Role: controlv1.Role_ROLE_DECODE},
		{Engine: engineConf("found:c", c, "m1", p), Draining: true},
	})
	eventually(t, "c draining", func() bool {
		ws, err := env.workers(false)
		return err == nil && ws["found:c"].Draining && !routableNow("found:c")
	})
	env.m.SetSource("found", []Engine{
		{Engine: engineConf("found:b", b, "m1", p), Role: controlv1.Role_ROLE_DECODE},
		{Engine: engineConf("found:c", c, "m1", p)},
	})
	eventually(t, "c routable again", func() bool { return routableNow("found:c") })
	if got := env.registrations("found:c"); got != 1 {
		t.Errorf("found:c registered %d times, want 1", got)
	}

	env.m.SetSource("found", nil)
	if routableNow("found:b") || routableNow("found:c") {
		t.Error("a source's engines still routable after it reported none")
	}
	if !routableNow("a") {
		t.Error("the listed engine went with the source")
	}
}

// TestManagerReconcileUnlocked: while a stopped loop's last registry call
// waits (a Forget the registry has not answered yet, which may take up to
// RegistryTimeout), the Manager's lock is free: another Apply or a
// discovery source's SetSource goes on at once. Apply still returns only
// once the removed engine's worker is forgotten.
func TestManagerReconcileUnlocked(t *testing.T) {
	sys := actorsys.New(zerolog.Nop())
	t.Cleanup(sys.Shutdown)
	forgetting, answer := make(chan struct{}), make(chan struct{})
	reg := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*registry.Forget); ok {
			close(forgetting)
			<-answer // the registry is slow to answer
			c.Respond(true)
		}
	}))
	m := NewManager(ManagerConfig{Root: sys.Root, Registry: reg, Logger: zerolog.Nop()})
	t.Cleanup(m.Close)
	down := config.Engine{ID: "e1", HTTPAddress: "127.0.0.1:1", Kind: string(KindVLLM), ProbeInterval: config.D(time.Hour)}
	m.Apply([]config.Engine{down})

	applied := make(chan struct{})
	go func() { m.Apply(nil); close(applied) }()
	select {
	case <-forgetting:
	case <-time.After(10 * time.Second):
		t.Fatal("the removed engine's worker was never forgotten")
	}
	// The loop may have asked before Apply's reconcile let the lock go;
	// once it has, the lock stays free however long the registry takes.
	locked := make(chan struct{})
	go func() {
		m.mu.Lock()
		loops := len(m.loops)
		m.mu.Unlock()
		if loops == 0 {
			close(locked)
		}
	}()
	select {
	case <-locked:
	case <-time.After(10 * time.Second):
		close(answer)
		<-locked
		t.Fatal("the Manager holds its lock while a stopped loop waits for the registry")
	}
	m.SetSource("dns", []Engine{{Engine: config.Engine{ID: "e2", HTTPAddress: "127.0.0.1:1", Kind: string(KindVLLM), ProbeInterval: config.D(time.Hour)}}})
	select {
	case <-applied:
		t.Fatal("Apply returned before the removed engine's worker was forgotten")
	default:
	}
	close(answer)
	<-applied
}

// TestLoopLogsSkippedAdaptersOnce: adapters a probe leaves out are logged
// when they first appear, not at every probe that repeats them, and again
// when they come back after a probe without them.
func TestLoopLogsSkippedAdaptersOnce(t *testing.T) {
	var buf bytes.Buffer
	l := &loop{log: zerolog.New(&buf)}
	bad := SkippedAdapter{ID: "tenant+v2", Reason: SkipInvalidID}
	extra := SkippedAdapter{ID: "a256", Reason: SkipTooMany}
	lines := func() []string {
		t.Helper()
		out := strings.Split(strings.TrimSpace(buf.String()), "\n")
		buf.Reset()
		if len(out) == 1 && out[0] == "" {
			return nil
		}
		return out
	}
	l.noteSkipped([]SkippedAdapter{bad})
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], `"adapters":["tenant+v2"]`) || !strings.Contains(got[0], SkipInvalidID) {
		t.Fatalf("first probe logged %q; want one line naming tenant+v2", got)
	}
	l.noteSkipped([]SkippedAdapter{bad})
	l.noteSkipped(nil)
	l.noteSkipped(nil)
	if got := lines(); len(got) != 0 {
		t.Fatalf("repeated and cleared skips logged %q; want nothing", got)
	}
	l.noteSkipped([]SkippedAdapter{bad, extra})
	l.noteSkipped([]SkippedAdapter{bad, extra})
	got := lines()
	if len(got) != 2 || !strings.Contains(got[0], `"adapters":["a256"]`) || !strings.Contains(got[1], `"adapters":["tenant+v2"]`) {
		t.Fatalf("returning and new skips logged %q; want a line for a256 and one for tenant+v2", got)
	}
}
