package replicas

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/store/embedetcd"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
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

// fleet is an etcd cluster, the replicas sharing it and the engines
// heartbeating to every replica.
type fleet struct {
	*cluster.Fleet
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

// newFleet starts n replicas on endpoints (etcd's, or proxies in front of
// it: endpointsOf(i) gives replica i's) and the engines, and waits until
// every replica routes to every engine.
func newFleet(t testing.TB, c *embedetcd.Cluster, n int, endpointsOf func(i int) []string, engines []enginesim.Config) *fleet {
	t.Helper()
	if endpointsOf == nil {
		endpointsOf = func(int) []string { return c.Endpoints() }
	}
	f := &fleet{Fleet: cluster.New(t, opsKey)}
	for i := range n {
		cfg, err := config.Parse([]byte(baseConfig))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Gateway.Store = config.Store{Kind: config.StoreEtcd, Endpoints: endpointsOf(i), Prefix: config.DefaultStorePrefix, DialTimeout: config.D(5 * time.Second)}
		f.StartReplica(cfg)
	}
	f.StartEngines(engines)
	return f
}

// do sends a request to url and reads the answer.
func (f *fleet) do(method, url, body string, hdr ...string) cluster.Reply {
	return f.Do(context.Background(), method, url, body, hdr...)
}

// getRoutes is GET /admin/v1/routes on replica i: its ETag and body.
func (f *fleet) getRoutes(i int) (etag string, body []byte) {
	r := f.do("GET", f.Replicas[i].URL+"/admin/v1/routes", "")
	if r.Err != nil || r.Status != 200 {
		return "", nil
	}
	return r.Header.Get("ETag"), r.Body
}

// putRoutes is PUT /admin/v1/routes on replica i with If-Match etag.
func (f *fleet) putRoutes(i int, etag, body string) cluster.Reply {
	return f.do("PUT", f.Replicas[i].URL+"/admin/v1/routes", body, "If-Match", etag)
}

// complete sends a small completion for model to replica i and returns
// the answer; X-TL-Route names the worker that served it.
func (f *fleet) complete(i int, model string) cluster.Reply {
	return f.do("POST", f.Replicas[i].URL+"/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"hello","max_tokens":4}`, model))
}

// routedTo is the worker a completion for model on replica i went to, or
// "" when it was not answered 200.
func (f *fleet) routedTo(i int, model string) string {
	r := f.complete(i, model)
	if r.Err != nil || r.Status != 200 {
		return ""
	}
	return r.Header.Get("X-TL-Route")
}

// waitETag waits (within) until replica i serves etag, and returns its
// body then.
func (f *fleet) waitETag(i int, etag string, within time.Duration) []byte {
	f.T.Helper()
	var body []byte
	cluster.Eventually(f.T, within, func() bool {
		var got string
		got, body = f.getRoutes(i)
		return got == etag
	}, "replica %d to serve ETag %s", i, etag)
	return body
}

// ackDrain heartbeats once to replica i as a worker of model and returns
// the ack's drain flag.
func (f *fleet) ackDrain(i int, id, model, httpAddr string) (bool, error) {
	conn, err := grpc.NewClient(f.Replicas[i].GW.RegistryAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
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

// sameTable reports whether two route table bodies (a GET's, or a PUT's
// answer, which carries its warnings beside them) hold the same epoch and
// routes, as JSON values.
func sameTable(a, b []byte) bool {
	var x, y struct {
		Epoch  json.RawMessage `json:"epoch"`
		Routes any             `json:"routes"`
	}
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
