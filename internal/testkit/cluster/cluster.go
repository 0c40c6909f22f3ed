// Package cluster runs the gateway replicas, reference engines and shared
// services (an embedded etcd, an embedded NATS) of an integration test on
// 127.0.0.1, on ports the OS picks, and stops them at the end of the test:
// a Fleet is the replicas and the engines heartbeating to every one of
// them, with the calls the tests make of them (send a request, read a
// replica's router view or metrics, wait until a worker is routable).
//
// What a fleet's replicas share (a store, fleet sync) is the test's
// configuration: StartReplica takes the whole of it.
package cluster

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync/embednats"
	"github.com/tlgate/tlgate/internal/adapter/store/embedetcd"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
	"github.com/tlgate/tlgate/internal/testkit/promsum"
)

// EngineHeartbeat is the heartbeat interval of a fleet's engines.
const EngineHeartbeat = 100 * time.Millisecond

// WorkerWait is how long WaitWorker waits for a worker's state.
const WorkerWait = 10 * time.Second

// Replica is one running gateway with a Prometheus registry of its own.
type Replica struct {
	GW  *gateway.Gateway
	URL string // http://host:port of its HTTP listener
	Reg *prometheus.Registry
}

// Stop closes the replica, letting requests in flight finish (5 s at
// most); a replica already stopped or killed is left alone.
func (r *Replica) Stop() {
	if r.GW == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.GW.Close(ctx)
	r.GW = nil
}

// Kill closes the replica without letting requests in flight finish.
func (r *Replica) Kill() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = r.GW.Close(ctx)
	r.GW = nil
}

// Fleet is a test's replicas and the reference engines heartbeating to
// them. At the end of the test the engines are killed first, then the
// replicas stopped and the client's idle connections closed.
type Fleet struct {
	T        testing.TB
	Replicas []*Replica
	Engines  []*enginesim.Engine
	// Client sends Do's requests; Key is their bearer API key.
	Client *http.Client
	Key    string
}

// New returns a fleet with no replica and no engine whose requests carry
// key.
func New(t testing.TB, key string) *Fleet {
	f := &Fleet{T: t, Key: key, Client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 20 * time.Second}}
	t.Cleanup(f.close)
	return f
}

func (f *Fleet) close() {
	for _, e := range f.Engines {
		e.Kill()
	}
	for _, r := range f.Replicas {
		r.Stop()
	}
	f.Client.CloseIdleConnections()
}

// StartReplica starts a replica on cfg (in a state_dir of the test's when
// cfg names none) and adds it to the fleet.
func (f *Fleet) StartReplica(cfg *config.Config) *Replica {
	f.T.Helper()
	return f.StartReplicaOn(cfg, nil)
}

// StartReplicaOn is StartReplica with the replica's registry on a port
// Reserve holds (on gateway.registry_listen when port is nil).
func (f *Fleet) StartReplicaOn(cfg *config.Config, port *Port) *Replica {
	f.T.Helper()
	reg := prometheus.NewRegistry()
	opts := gateway.Options{Logger: zerolog.Nop(), Registry: reg, Gatherer: reg}
	if port != nil {
		cfg.Gateway.RegistryListen = port.Addr()
		opts.RegistryListener = port.take()
	}
	if cfg.Gateway.StateDir == "" {
		cfg.Gateway.StateDir = f.T.TempDir()
	}
	gw, err := gateway.Start(context.Background(), cfg, opts)
	if err != nil {
		f.T.Fatalf("replica: %v", err)
	}
	r := &Replica{GW: gw, URL: "http://" + gw.HTTPAddr(), Reg: reg}
	f.Replicas = append(f.Replicas, r)
	return r
}

// StartEngines starts reference engines on cfgs that heartbeat (every
// EngineHeartbeat) to the registry of every replica of the fleet and to
// extraRegistries, and waits until every replica routes to every engine
// of the fleet.
func (f *Fleet) StartEngines(cfgs []enginesim.Config, extraRegistries ...string) {
	f.T.Helper()
	regs := append([]string(nil), extraRegistries...)
	for _, r := range f.Replicas {
		regs = append(regs, r.GW.RegistryAddr())
	}
	for _, ec := range cfgs {
		ec.Gateways = regs
		ec.HeartbeatInterval = EngineHeartbeat
		ec.Logger = zerolog.Nop()
		e, err := enginesim.Start(context.Background(), ec)
		if err != nil {
			f.T.Fatalf("engine %s: %v", ec.ID, err)
		}
		f.Engines = append(f.Engines, e)
	}
	for i := range f.Replicas {
		f.WaitRoutable(i)
	}
}

// WaitRoutable waits until replica i routes to every engine of the fleet.
func (f *Fleet) WaitRoutable(i int) {
	f.T.Helper()
	for _, e := range f.Engines {
		f.WaitWorker(i, e.ID(), func(w router.WorkerView) bool { return w.Routable }, "routable")
	}
}

// Workers is replica i's router view (nil when the router does not
// answer).
func (f *Fleet) Workers(i int) []router.WorkerView {
	gw := f.Replicas[i].GW
	res, err := gw.System().Root.RequestFuture(gw.Router, &router.ListWorkers{}, 2*time.Second).Result()
	if err != nil {
		return nil
	}
	return res.(*router.WorkersResult).Workers
}

// Worker is replica i's view of worker id (zero when it does not know it).
func (f *Fleet) Worker(i int, id string) router.WorkerView {
	for _, w := range f.Workers(i) {
		if w.ID == id {
			return w
		}
	}
	return router.WorkerView{}
}

// WaitWorker waits (WorkerWait at most) until replica i knows worker id
// in a state that ok accepts; what names that state in the failure.
func (f *Fleet) WaitWorker(i int, id string, ok func(router.WorkerView) bool, what string) {
	f.T.Helper()
	Eventually(f.T, WorkerWait, func() bool {
		w := f.Worker(i, id)
		return w.ID == id && ok(w)
	}, "replica %d: worker %s %s", i, id, what)
}

// Metric sums the samples of family name on replica i whose labels
// include every pair of labels ("k", "v", ...); -1 when none is exposed.
func (f *Fleet) Metric(i int, name string, labels ...string) float64 {
	total, found := promsum.Sum(f.Replicas[i].Reg, name, labels...)
	if !found {
		return -1
	}
	return total
}

// WaitMetric waits (within) until Metric(i, name, labels...) >= want.
func (f *Fleet) WaitMetric(i int, within time.Duration, want float64, name string, labels ...string) {
	f.T.Helper()
	Eventually(f.T, within, func() bool { return f.Metric(i, name, labels...) >= want },
		"replica %d: %s%v >= %v (now %v)", i, name, labels, want, f.Metric(i, name, labels...))
}

// Reply is an HTTP answer, or the error that kept it from arriving.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
	Err    error
}

// Route is the answer's X-TL-Route: the worker that served it.
func (r Reply) Route() string { return r.Header.Get("X-TL-Route") }

// Do sends a request with the fleet's key and a JSON body (none when body
// is ""), with headers hdr ("Name", "value", ...), and reads the answer
// whole.
func (f *Fleet) Do(ctx context.Context, method, url, body string, hdr ...string) Reply {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return Reply{Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+f.Key)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := f.Client.Do(req)
	if err != nil {
		return Reply{Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return Reply{Status: resp.StatusCode, Header: resp.Header, Body: b, Err: err}
}

// Eventually polls cond until it holds or within passes (then the test
// fails, naming what it waited for).
func Eventually(t testing.TB, within time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for "+format, append([]any{within}, args...)...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// FreePort returns a loopback address nothing listens on when it returns.
// Something else may bind it later: a test that needs the address kept
// for a replica it starts later holds it with Reserve.
func FreePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// Port is a loopback port the OS picked, held for a replica's registry
// until the replica starts (StartReplicaOn), so that no other listener
// and no outgoing connection takes it in between. Until then every
// connection to it is accepted and closed at once: an engine
// heartbeating there sees its peer go away, as it would see a replica
// that does not run yet.
type Port struct {
	lis    net.Listener
	taken  atomic.Bool
	conns  chan net.Conn
	stop   chan struct{} // closed by the replica's Close
	once   sync.Once
	closed chan struct{} // closed when lis stops accepting
}

// Reserve holds a loopback port for a replica started later; it is
// released at the end of the test.
func Reserve(t testing.TB) *Port {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Port{lis: l, conns: make(chan net.Conn), stop: make(chan struct{}), closed: make(chan struct{})}
	go p.serve()
	t.Cleanup(func() {
		_ = p.Close()
		<-p.closed
	})
	return p
}

// Addr is the held address, host:port.
func (p *Port) Addr() string { return p.lis.Addr().String() }

// serve accepts every connection: it closes those that come before the
// port is taken and hands the others to the replica's Accept.
func (p *Port) serve() {
	defer close(p.closed)
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		if !p.taken.Load() {
			_ = c.Close()
			continue
		}
		select {
		case p.conns <- c:
		case <-p.stop:
			_ = c.Close()
			return
		}
	}
}

// Close releases the port.
func (p *Port) Close() error {
	p.once.Do(func() { close(p.stop) })
	return p.lis.Close()
}

// take hands the port to a replica: the listener it serves on.
func (p *Port) take() net.Listener {
	p.taken.Store(true)
	return heldListener{p}
}

// heldListener is a taken Port, as the replica's registry listener.
type heldListener struct{ p *Port }

// Accept returns the connections made once the port is taken.
func (h heldListener) Accept() (net.Conn, error) {
	select {
	case c := <-h.p.conns:
		return c, nil
	case <-h.p.stop:
		return nil, net.ErrClosed
	}
}

func (h heldListener) Close() error   { return h.p.Close() }
func (h heldListener) Addr() net.Addr { return h.p.lis.Addr() }

// StartEtcd starts an embedded etcd of members members in the test
// process, stopped at the end of the test.
func StartEtcd(t testing.TB, members int) *embedetcd.Cluster {
	t.Helper()
	c, err := embedetcd.Start(t.TempDir(), members)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// StartEtcdProcesses is StartEtcd with every member in a child process
// (the test binary's TestMain must call embedetcd.MemberMain).
func StartEtcdProcesses(t testing.TB, members int) *embedetcd.Cluster {
	t.Helper()
	c, err := embedetcd.StartProcesses(t.TempDir(), members)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// StartNATS starts an embedded NATS server, stopped at the end of the
// test.
func StartNATS(t testing.TB) *embednats.Server {
	t.Helper()
	s, err := embednats.Start(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// StartNATSUsers starts an embedded NATS, stopped at the end of the test,
// with one user per replica id, named after it, whose password is
// NATSPassword(id), allowed to publish and subscribe only where that
// replica does under subject prefix (fleetsync.Permissions).
func StartNATSUsers(t testing.TB, prefix string, replicas ...string) *embednats.Server {
	t.Helper()
	var users []embednats.User
	for _, id := range replicas {
		pub, sub := fleetsync.Permissions(prefix, id)
		users = append(users, embednats.User{Name: id, Password: NATSPassword(id), Publish: pub, Subscribe: sub})
	}
	s, err := embednats.StartWith(embednats.Options{Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// NATSPassword is the password of replica id's user on a server of
// StartNATSUsers.
func NATSPassword(id string) string { return "password-of-" + id }
