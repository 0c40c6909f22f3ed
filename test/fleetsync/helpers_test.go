package fleetsync

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync/embednats"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// opsKey has every scope: the tests read X-TL-Route (debug).
const opsKey = "fleetsync-ops-key"

// model is the engines' served model, named directly by the requests.
const model = "smol-v3"

// baseConfig is every replica's configuration but the policy and sync.
const baseConfig = `
[gateway]
listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
heartbeat_miss_limit = 25
first_byte_timeout = "5s"
idle_timeout = "5s"

[[gateway.api_keys]]
name = "ops"
key = "` + opsKey + `"
scopes = ["inference", "debug", "admin"]
`

// replica is one running gateway.
type replica struct {
	gw  *gateway.Gateway
	url string
	reg *prometheus.Registry
}

// fleet is an embedded NATS, the replicas syncing through it and the
// engines heartbeating to every replica.
type fleet struct {
	t        testing.TB
	nats     *embednats.Server
	policy   string
	replicas []*replica
	engines  []*enginesim.Engine
	client   *http.Client
	// tweak, when set, changes every replica's configuration last.
	tweak func(*config.Gateway)
}

// startNATS starts an embedded NATS server, stopped at the end of the test.
func startNATS(t testing.TB) *embednats.Server {
	t.Helper()
	s, err := embednats.Start(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// newFleet starts n replicas under policy syncing through ns (nil: sync
// off), then engines (ids) heartbeating to them and to extra registry
// addresses, and waits until every replica routes to every engine.
func newFleet(t testing.TB, ns *embednats.Server, policy string, n int, engines []enginesim.Config, extraRegistries ...string) *fleet {
	t.Helper()
	return newTweakedFleet(t, ns, policy, n, engines, nil, extraRegistries...)
}

// newTweakedFleet is newFleet with tweak applied to every replica's
// configuration.
func newTweakedFleet(t testing.TB, ns *embednats.Server, policy string, n int, engines []enginesim.Config, tweak func(*config.Gateway), extraRegistries ...string) *fleet {
	t.Helper()
	f := &fleet{t: t, nats: ns, policy: policy, tweak: tweak, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 20 * time.Second}}
	t.Cleanup(f.close)
	for range n {
		f.replicas = append(f.replicas, f.startReplica("127.0.0.1:0"))
	}
	regs := append([]string(nil), extraRegistries...)
	for _, r := range f.replicas {
		regs = append(regs, r.gw.RegistryAddr())
	}
	for _, ec := range engines {
		ec.Gateways = regs
		ec.HeartbeatInterval = 100 * time.Millisecond
		ec.Logger = zerolog.Nop()
		e, err := enginesim.Start(context.Background(), ec)
		if err != nil {
			t.Fatalf("engine %s: %v", ec.ID, err)
		}
		f.engines = append(f.engines, e)
	}
	for i := range f.replicas {
		f.waitRoutable(i)
	}
	return f
}

// engineConfigs are n reference engines of model, with decodePerToken.
func engineConfigs(n int, decodePerToken time.Duration) []enginesim.Config {
	out := make([]enginesim.Config, n)
	for i := range out {
		out[i] = enginesim.Config{ID: fmt.Sprintf("w%d", i), Model: model, Role: enginesim.RoleUnified, DecodePerToken: decodePerToken}
	}
	return out
}

// waitRoutable waits until replica i routes to every engine.
func (f *fleet) waitRoutable(i int) {
	f.t.Helper()
	for _, e := range f.engines {
		f.waitWorker(i, e.ID(), func(w router.WorkerView) bool { return w.Routable }, "routable")
	}
}

// startReplica starts one replica with its registry on registryListen.
func (f *fleet) startReplica(registryListen string) *replica {
	f.t.Helper()
	cfg, err := config.Parse([]byte(baseConfig))
	if err != nil {
		f.t.Fatal(err)
	}
	g := &cfg.Gateway
	g.StateDir = f.t.TempDir()
	g.RegistryListen = registryListen
	g.RoutePolicy = f.policy
	if f.nats != nil {
		g.Sync.Kind = config.SyncNATS
		g.Sync.URL = config.StringList{f.nats.URL()}
		g.Sync.Token = f.nats.Token()
		g.Sync.ReconnectWait = config.D(100 * time.Millisecond)
		g.Sync.ConnectTimeout = config.D(time.Second)
		g.Sync.LoadInterval = config.D(200 * time.Millisecond)
		g.Sync.PeerTimeout = config.D(2 * time.Second)
	}
	if f.tweak != nil {
		f.tweak(g)
	}
	if err := cfg.Validate(); err != nil {
		f.t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	gw, err := gateway.Start(context.Background(), cfg, gateway.Options{Logger: zerolog.Nop(), Registry: reg, Gatherer: reg})
	if err != nil {
		f.t.Fatalf("replica: %v", err)
	}
	return &replica{gw: gw, url: "http://" + gw.HTTPAddr(), reg: reg}
}

func (f *fleet) close() {
	for _, e := range f.engines {
		e.Kill()
	}
	for _, r := range f.replicas {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = r.gw.Close(ctx)
		cancel()
	}
	f.client.CloseIdleConnections()
}

// reply is an HTTP answer.
type reply struct {
	status int
	route  string // X-TL-Route: the worker that served it
	body   string
	err    error
}

// complete sends a completion of prompt with maxTokens to replica i.
func (f *fleet) complete(ctx context.Context, i int, prompt string, maxTokens int) reply {
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d}`, model, prompt, maxTokens)
	req, err := http.NewRequestWithContext(ctx, "POST", f.replicas[i].url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+opsKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, route: resp.Header.Get("X-TL-Route"), body: string(b), err: err}
}

// workers is replica i's router view.
func (f *fleet) workers(i int) []router.WorkerView {
	gw := f.replicas[i].gw
	res, err := gw.System().Root.RequestFuture(gw.Router, &router.ListWorkers{}, 2*time.Second).Result()
	if err != nil {
		return nil
	}
	return res.(*router.WorkersResult).Workers
}

// worker is replica i's view of worker id (zero when unknown).
func (f *fleet) worker(i int, id string) router.WorkerView {
	for _, w := range f.workers(i) {
		if w.ID == id {
			return w
		}
	}
	return router.WorkerView{}
}

// waitWorker waits (10 s at most) until replica i knows worker id in a
// state that ok accepts.
func (f *fleet) waitWorker(i int, id string, ok func(router.WorkerView) bool, what string) {
	f.t.Helper()
	eventually(f.t, 10*time.Second, func() bool {
		w := f.worker(i, id)
		return w.ID == id && ok(w)
	}, "replica %d: worker %s %s", i, id, what)
}

// eventually polls cond until it holds or within passes (then the test
// fails, naming what it waited for).
func eventually(t testing.TB, within time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for "+format, append([]any{within}, args...)...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// metric sums the samples of family name on replica i whose labels
// include every pair of labels ("k", "v", ...); -1 when it is not exposed.
func (f *fleet) metric(i int, name string, labels ...string) float64 {
	mfs, err := f.replicas[i].reg.Gather()
	if err != nil {
		return -1
	}
	total, found := 0.0, false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for j := 0; j+1 < len(labels); j += 2 {
				if have[labels[j]] != labels[j+1] {
					continue next
				}
			}
			found = true
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			}
		}
	}
	if !found {
		return -1
	}
	return total
}

// waitMetric waits (within) until metric(i, name, labels...) >= want.
func (f *fleet) waitMetric(i int, within time.Duration, want float64, name string, labels ...string) {
	f.t.Helper()
	eventually(f.t, within, func() bool { return f.metric(i, name, labels...) >= want },
		"replica %d: %s%v >= %v (now %v)", i, name, labels, want, f.metric(i, name, labels...))
}

// freePort returns a loopback address nothing listens on now.
func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// load runs clients concurrent clients sending short completions to the
// replicas in turn until stop is called; stop returns the answers that
// were not 200.
func (f *fleet) load(clients int, prompt func(n int) string) (stop func() []string) {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures []string
	)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				i := (c + n) % len(f.replicas)
				rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
				r := f.complete(rctx, i, prompt(c*1_000_000+n), 4)
				rcancel()
				if ctx.Err() != nil {
					return
				}
				if r.err != nil || r.status != 200 {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("replica %d: %d %v %s", i, r.status, r.err, r.body))
					mu.Unlock()
				}
			}
		}()
	}
	return func() []string {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return failures
	}
}
