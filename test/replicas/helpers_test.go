package replicas

import (
	"bytes"
	"context"
	"encoding/json"
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
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/store/embedetcd"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// opsKey has every scope: the tests read X-TL-Route (debug) and write
// the table (admin).
const opsKey = "replicas-ops-key"

// baseConfig is every replica's configuration but the store's endpoints.
const baseConfig = `
[gateway]
listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
heartbeat_miss_limit = 3
first_byte_timeout = "5s"
idle_timeout = "5s"

[[gateway.api_keys]]
name = "ops"
key = "` + opsKey + `"
scopes = ["inference", "debug", "admin"]

[[gateway.routes]]
model = "smol"
backends = [{ model = "smol-v3", weight = 1 }]
`

// replica is one running gateway.
type replica struct {
	gw  *gateway.Gateway
	url string
	reg *prometheus.Registry
}

// fleet is an etcd cluster, the replicas sharing it and the engines
// heartbeating to every replica.
type fleet struct {
	t        testing.TB
	etcd     *embedetcd.Cluster
	replicas []*replica
	engines  []*enginesim.Engine
	client   *http.Client
}

// engineConfigs are the reference engines of the tests: two small models
// (the route smol serves one of them) and a large one.
func engineConfigs(decodePerToken time.Duration) []enginesim.Config {
	return []enginesim.Config{
		{ID: "smol-v3-a", Model: "smol-v3", Role: enginesim.RoleUnified, DecodePerToken: decodePerToken},
		{ID: "smol-v4-a", Model: "smol-v4", Role: enginesim.RoleUnified, DecodePerToken: decodePerToken},
		{ID: "big-a", Model: "big", Role: enginesim.RoleUnified, DecodePerToken: decodePerToken},
	}
}

// startEtcd starts an embedded etcd of members members, stopped at the
// end of the test.
func startEtcd(t testing.TB, members int) *embedetcd.Cluster {
	t.Helper()
	c, err := embedetcd.Start(t.TempDir(), members)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// startEtcdProcesses is startEtcd with every member in a child process.
func startEtcdProcesses(t testing.TB, members int) *embedetcd.Cluster {
	t.Helper()
	c, err := embedetcd.StartProcesses(t.TempDir(), members)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// newFleet starts n replicas on endpoints (etcd's, or proxies in front of
// it: endpointsOf(i) gives replica i's) and the engines, and waits until
// every replica routes to every engine.
func newFleet(t testing.TB, c *embedetcd.Cluster, n int, endpointsOf func(i int) []string, engines []enginesim.Config) *fleet {
	t.Helper()
	if endpointsOf == nil {
		endpointsOf = func(int) []string { return c.Endpoints() }
	}
	f := &fleet{t: t, etcd: c, client: &http.Client{Transport: &http.Transport{}, Timeout: 20 * time.Second}}
	t.Cleanup(f.close)
	for i := range n {
		f.replicas = append(f.replicas, f.startReplica(endpointsOf(i)))
	}
	var regs []string
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
		for _, ec := range engines {
			f.waitWorker(i, ec.ID, func(w router.WorkerView) bool { return w.Routable }, "routable")
		}
	}
	return f
}

func (f *fleet) startReplica(endpoints []string) *replica {
	f.t.Helper()
	cfg, err := config.Parse([]byte(baseConfig))
	if err != nil {
		f.t.Fatal(err)
	}
	cfg.Gateway.StateDir = f.t.TempDir()
	cfg.Gateway.Store = config.Store{Kind: config.StoreEtcd, Endpoints: endpoints, Prefix: config.DefaultStorePrefix, DialTimeout: config.D(5 * time.Second)}
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
		r.stop()
	}
	f.client.CloseIdleConnections()
}

// stop closes the replica (once; a killed one is already closed).
func (r *replica) stop() {
	if r.gw == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.gw.Close(ctx)
	r.gw = nil
}

// kill closes the replica without letting requests in flight finish.
func (r *replica) kill() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = r.gw.Close(ctx)
	r.gw = nil
}

// reply is an HTTP answer.
type reply struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (f *fleet) do(method, url, body string, hdr ...string) reply {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+opsKey)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// getRoutes is GET /admin/v1/routes on replica i: its ETag and body.
func (f *fleet) getRoutes(i int) (etag string, body []byte) {
	r := f.do("GET", f.replicas[i].url+"/admin/v1/routes", "")
	if r.err != nil || r.status != 200 {
		return "", nil
	}
	return r.header.Get("ETag"), r.body
}

// putRoutes is PUT /admin/v1/routes on replica i with If-Match etag.
func (f *fleet) putRoutes(i int, etag, body string) reply {
	return f.do("PUT", f.replicas[i].url+"/admin/v1/routes", body, "If-Match", etag)
}

// complete sends a small completion for model to replica i and returns
// the answer; X-TL-Route names the worker that served it.
func (f *fleet) complete(i int, model string) reply {
	return f.do("POST", f.replicas[i].url+"/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"hello","max_tokens":4}`, model))
}

// routedTo is the worker a completion for model on replica i went to, or
// "" when it was not answered 200.
func (f *fleet) routedTo(i int, model string) string {
	r := f.complete(i, model)
	if r.err != nil || r.status != 200 {
		return ""
	}
	return r.header.Get("X-TL-Route")
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

// waitWorker waits (10 s at most) until replica i knows worker id in a
// state that ok accepts.
func (f *fleet) waitWorker(i int, id string, ok func(router.WorkerView) bool, what string) {
	f.t.Helper()
	eventually(f.t, 10*time.Second, func() bool {
		for _, w := range f.workers(i) {
			if w.ID == id {
				return ok(w)
			}
		}
		return false
	}, "replica %d: worker %s %s", i, id, what)
}

// waitETag waits (within) until replica i serves etag, and returns its
// body then.
func (f *fleet) waitETag(i int, etag string, within time.Duration) []byte {
	f.t.Helper()
	var body []byte
	eventually(f.t, within, func() bool {
		var got string
		got, body = f.getRoutes(i)
		return got == etag
	}, "replica %d to serve ETag %s", i, etag)
	return body
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

// gauge reads an unlabelled gauge from replica i's registry.
func (f *fleet) gauge(i int, name string) float64 {
	mfs, err := f.replicas[i].reg.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// ackDrain heartbeats once to replica i as a worker of model and returns
// the ack's drain flag.
func (f *fleet) ackDrain(i int, id, model, httpAddr string) (bool, error) {
	conn, err := grpc.NewClient(f.replicas[i].gw.RegistryAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ack, err := controlv1.NewWorkerRegistryClient(conn).Heartbeat(ctx, &controlv1.WorkerStatus{
		WorkerId: id, Model: model, Role: controlv1.Role_ROLE_UNIFIED, HttpAddress: httpAddr,
		KvTotalBlocks: 100, KvFreeBlocks: 100, KvBlockTokens: 16,
	})
	if err != nil {
		return false, err
	}
	return ack.GetDrain(), nil
}

// routesBody is a PUT body routing smol to model.
func routesBody(model string) string {
	return fmt.Sprintf(`{"routes":[{"model":"smol","backends":[{"model":%q,"weight":1}]}]}`, model)
}

// sameJSON reports whether two JSON documents are equal as values.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}

// etcdClient is a client of the test's own, for what only the test does
// (compaction).
func etcdClient(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// etcdLeader is the index of the member that leads the cluster.
func etcdLeader(t testing.TB, endpoints []string) int {
	t.Helper()
	cli := etcdClient(t, endpoints)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i, ep := range endpoints {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			t.Fatalf("etcd status of %s: %v", ep, err)
		}
		if st.Leader == st.Header.MemberId {
			return i
		}
	}
	t.Fatal("no etcd member leads")
	return -1
}

// cutProxy is a TCP proxy in front of an etcd member that the test can
// cut (every connection closed, new ones refused at once) and restore:
// one replica loses etcd while the others keep it.
type cutProxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

func newCutProxy(t testing.TB, target string) *cutProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{lis: lis, target: strings.TrimPrefix(target, "http://"), conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = lis.Close()
		p.setCut(true)
		p.wg.Wait()
	})
	return p
}

// URL is the proxy's endpoint.
func (p *cutProxy) URL() string { return "http://" + p.lis.Addr().String() }

func (p *cutProxy) accept() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		p.wg.Go(func() { pipe(up, c) })
		p.wg.Go(func() { pipe(c, up) })
	}
}

// setCut cuts (every connection closed, new ones refused) or restores.
func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			_ = c.Close()
		}
		clear(p.conns)
	}
}
