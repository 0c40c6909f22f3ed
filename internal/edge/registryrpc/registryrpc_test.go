package registryrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/internal/edge/registryrpc"
	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

func TestMain(m *testing.M) {
	leakcheck.VerifyTestMain(m)
}

type env struct {
	sys    *actor.ActorSystem
	reg    *actor.PID
	srv    *registryrpc.Server
	client controlv1.WorkerRegistryClient
	conn   *grpc.ClientConn
}

func start(t *testing.T, o registryrpc.Options) *env {
	t.Helper()
	e, _ := startWith(t, registry.Config{Epoch: 4}, o)
	return e
}

func (e *env) routable(t *testing.T) []string {
	t.Helper()
	res, err := e.sys.Root.RequestFuture(e.reg, &registry.Snapshot{RoutableOnly: true}, time.Second).Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, w := range res.(*registry.SnapshotResult).Workers {
		ids = append(ids, w.ID)
	}
	return ids
}

func good(id string) *controlv1.WorkerStatus {
	return &controlv1.WorkerStatus{
		WorkerId: id, HttpAddress: "127.0.0.1:8001", Role: controlv1.Role_ROLE_UNIFIED,
		Model: "smol", KvTotalBlocks: 100, KvFreeBlocks: 90, KvBlockTokens: 16,
	}
}

func TestRegistryOverGRPC(t *testing.T) {
	e := start(t, registryrpc.Options{})
	ctx := context.Background()
	ack, err := e.client.Heartbeat(ctx, good("w1"))
	if err != nil {
		t.Fatal(err)
	}
	if ack.Drain || ack.Epoch != 4 || ack.IntervalMs != 2000 {
		t.Fatalf("ack = %v", ack)
	}
	if got := e.routable(t); len(got) != 1 || got[0] != "w1" {
		t.Fatalf("routable = %v, want w1", got)
	}

	// An operator drain of the model: the next ack says drain and the
	// worker stops being routable.
	if _, err := e.sys.Root.RequestFuture(e.reg, &registry.Drain{Model: "smol", On: true}, time.Second).Result(); err != nil {
		t.Fatal(err)
	}
	ack, err = e.client.Heartbeat(ctx, good("w1"))
	if err != nil {
		t.Fatal(err)
	}
	if !ack.Drain {
		t.Fatal("ack after drain does not carry drain")
	}
	if got := e.routable(t); len(got) != 0 {
		t.Fatalf("drained worker routable: %v", got)
	}

	// A worker reporting draining itself is not routable.
	s := good("w2")
	s.Model = "big"
	s.Draining = true
	if _, err := e.client.Heartbeat(ctx, s); err != nil {
		t.Fatal(err)
	}
	if got := e.routable(t); len(got) != 0 {
		t.Fatalf("self-draining worker routable: %v", got)
	}
	s.Draining = false
	if _, err := e.client.Heartbeat(ctx, s); err != nil {
		t.Fatal(err)
	}
	if got := e.routable(t); len(got) != 1 || got[0] != "w2" {
		t.Fatalf("routable = %v, want w2", got)
	}

	// grpc.health.v1 is served.
	hc, err := healthpb.NewHealthClient(e.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hc, err)
	}
}

func TestHeartbeatRejectsBadInput(t *testing.T) {
	e := start(t, registryrpc.Options{})
	mod := func(f func(s *controlv1.WorkerStatus)) *controlv1.WorkerStatus {
		s := good("ok-1")
		f(s)
		return s
	}
	cases := []struct {
		name string
		s    *controlv1.WorkerStatus
		want string
	}{
		{"empty status", &controlv1.WorkerStatus{}, "worker_id"},
		{"empty id", mod(func(s *controlv1.WorkerStatus) { s.WorkerId = "" }), "worker_id"},
		{"id with space", mod(func(s *controlv1.WorkerStatus) { s.WorkerId = "a b" }), "worker_id"},
		{"id with slash", mod(func(s *controlv1.WorkerStatus) { s.WorkerId = "a/b" }), "worker_id"},
		{"id too long", mod(func(s *controlv1.WorkerStatus) { s.WorkerId = strings.Repeat("a", 129) }), "worker_id"},
		{"id unicode", mod(func(s *controlv1.WorkerStatus) { s.WorkerId = "wörker" }), "worker_id"},
		{"empty model", mod(func(s *controlv1.WorkerStatus) { s.Model = "" }), "model"},
		{"model with space", mod(func(s *controlv1.WorkerStatus) { s.Model = "a b" }), "model"},
		{"no http address", mod(func(s *controlv1.WorkerStatus) { s.HttpAddress = "" }), "http_address"},
		{"http address no port", mod(func(s *controlv1.WorkerStatus) { s.HttpAddress = "localhost" }), "http_address"},
		{"http address is a URL", mod(func(s *controlv1.WorkerStatus) { s.HttpAddress = "http://x:1/" }), "http_address"},
		{"http port zero", mod(func(s *controlv1.WorkerStatus) { s.HttpAddress = "127.0.0.1:0" }), "http_address"},
		{"http port too big", mod(func(s *controlv1.WorkerStatus) { s.HttpAddress = "127.0.0.1:70000" }), "http_address"},
		{"bad grpc address", mod(func(s *controlv1.WorkerStatus) { s.GrpcAddress = "nope" }), "grpc_address"},
		{"unknown role", mod(func(s *controlv1.WorkerStatus) { s.Role = 9 }), "role"},
		{"decode without kv address", mod(func(s *controlv1.WorkerStatus) { s.Role = controlv1.Role_ROLE_DECODE }), "kv_address"},
		{"prefill without grpc address", mod(func(s *controlv1.WorkerStatus) { s.Role = controlv1.Role_ROLE_PREFILL }), "grpc_address"},
		{"more free than total", mod(func(s *controlv1.WorkerStatus) { s.KvFreeBlocks = 101 }), "kv_free_blocks"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.Heartbeat(context.Background(), tc.s)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("code = %v (%v), want InvalidArgument", status.Code(err), err)
			}
			if !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("message %q does not name %q", status.Convert(err).Message(), tc.want)
			}
		})
	}
	res, err := e.sys.Root.RequestFuture(e.reg, &registry.Snapshot{}, time.Second).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.(*registry.SnapshotResult).Workers); n != 0 {
		t.Fatalf("registry changed by rejected heartbeats: %d workers", n)
	}
}

func TestHeartbeatNeedsToken(t *testing.T) {
	e := start(t, registryrpc.Options{Token: "s3cret"})
	_, err := e.client.Heartbeat(context.Background(), good("w1"))
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}
	bad := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer nope")
	if _, err := e.client.Heartbeat(bad, good("w1")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("wrong token: %v", err)
	}
	if strings.Contains(status.Convert(err).Message(), "s3cret") {
		t.Fatal("token leaked in error")
	}
	if got := e.routable(t); len(got) != 0 {
		t.Fatalf("unauthenticated heartbeat registered %v", got)
	}
	ok := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer s3cret")
	if _, err := e.client.Heartbeat(ok, good("w1")); err != nil {
		t.Fatal(err)
	}
	if got := e.routable(t); len(got) != 1 {
		t.Fatalf("authenticated heartbeat not registered: %v", got)
	}
}

// TestHeartbeatTokenSchemeCaseInsensitive: the scheme is matched as on
// the HTTP edge (auth.BearerToken), so "bearer" and "BEARER" work; two
// authorization values are refused rather than one picked.
func TestHeartbeatTokenSchemeCaseInsensitive(t *testing.T) {
	e := start(t, registryrpc.Options{Token: "s3cret"})
	for _, h := range []string{"bearer s3cret", "BEARER s3cret", "Bearer s3cret"} {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", h)
		if _, err := e.client.Heartbeat(ctx, good("w1")); err != nil {
			t.Errorf("%q: %v", h, err)
		}
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("Authorization", h)
		kr, err := auth.New([]auth.KeySpec{{Name: "k", Secret: "s3cret", Scopes: []string{"inference"}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kr.Authenticate(r); err != nil {
			t.Errorf("HTTP edge refuses %q which gRPC accepts: %v", h, err)
		}
	}
	two := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer nope", "authorization", "Bearer s3cret")
	if _, err := e.client.Heartbeat(two, good("w1")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("two authorization values: %v, want Unauthenticated", err)
	}
}

// startWith is start with a registry configured by cfg.
func startWith(t *testing.T, cfg registry.Config, o registryrpc.Options) (*env, *[]codes.Code) {
	t.Helper()
	sys := actorsys.New(zerolog.Nop())
	cfg.Interval, cfg.MissLimit = 2*time.Second, 3
	pid := sys.Root.Spawn(registry.Props(registry.NewState(cfg)))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv := registryrpc.New(sys.Root, pid, o)
	var mu sync.Mutex
	var rejected []codes.Code
	srv.OnReject = func(c codes.Code) { mu.Lock(); rejected = append(rejected, c); mu.Unlock() }
	srv.Register(g)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.Stop()
		_ = sys.Root.StopFuture(pid).Wait()
		sys.Shutdown()
	})
	return &env{sys: sys, reg: pid, srv: srv, client: controlv1.NewWorkerRegistryClient(conn), conn: conn}, &rejected
}

// TestHeartbeatRefusals: a hijack is FailedPrecondition, a worker past
// max_workers ResourceExhausted, and both are counted.
func TestHeartbeatRefusals(t *testing.T) {
	e, rejected := startWith(t, registry.Config{MaxWorkers: 1}, registryrpc.Options{})
	ctx := context.Background()
	if _, err := e.client.Heartbeat(ctx, good("w1")); err != nil {
		t.Fatal(err)
	}
	evil := good("w1")
	evil.HttpAddress = "10.6.6.6:8001"
	_, err := e.client.Heartbeat(ctx, evil)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "bound") {
		t.Fatalf("hijack: %v, want FailedPrecondition", err)
	}
	if _, err := e.client.Heartbeat(ctx, good("w2")); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("over max_workers: %v, want ResourceExhausted", err)
	}
	if want := []codes.Code{codes.FailedPrecondition, codes.ResourceExhausted}; !slices.Equal(*rejected, want) {
		t.Fatalf("counted %v, want %v", *rejected, want)
	}
}

// TestHeartbeatPeerRate: one peer past its burst is refused with
// ResourceExhausted before the registry sees it.
func TestHeartbeatPeerRate(t *testing.T) {
	e, _ := startWith(t, registry.Config{}, registryrpc.Options{PeerRate: 0.001, PeerBurst: 3})
	for i := range 3 {
		if _, err := e.client.Heartbeat(context.Background(), good(fmt.Sprintf("w%d", i))); err != nil {
			t.Fatalf("heartbeat %d within the burst: %v", i, err)
		}
	}
	_, err := e.client.Heartbeat(context.Background(), good("w9"))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("past the burst: %v, want ResourceExhausted naming the peer", err)
	}
	if got := e.routable(t); len(got) != 3 {
		t.Fatalf("routable %v, want the three within the burst", got)
	}
}

// TestHeartbeatAddressPolicy: an engine address on the gateway's own
// listener is refused with PermissionDenied.
func TestHeartbeatAddressPolicy(t *testing.T) {
	pol := fleet.NewAddressPolicy(nil)
	pol.AddOwn(&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 8080})
	e, _ := startWith(t, registry.Config{}, registryrpc.Options{Addresses: pol})
	st := good("w1")
	st.HttpAddress = "127.0.0.1:8080"
	if _, err := e.client.Heartbeat(context.Background(), st); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("own listener as engine: %v, want PermissionDenied", err)
	}
	if _, err := e.client.Heartbeat(context.Background(), good("w1")); err != nil {
		t.Fatal(err)
	}
}

// TestEngineTokens: an engine token registers only the ids it names; the
// registry token any; no token, or another, none.
func TestEngineTokens(t *testing.T) {
	e, _ := startWith(t, registry.Config{}, registryrpc.Options{Token: "fleet", EngineTokens: []registryrpc.EngineToken{
		{Name: "rack-a", Token: "tok-a", WorkerIDs: []string{"ea1", "ea2"}},
	}})
	with := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
	}
	if _, err := e.client.Heartbeat(with("tok-a"), good("ea1")); err != nil {
		t.Fatalf("engine token, its own id: %v", err)
	}
	_, err := e.client.Heartbeat(with("tok-a"), good("eb1"))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "rack-a") {
		t.Fatalf("engine token, another id: %v, want PermissionDenied naming the token", err)
	}
	if _, err := e.client.Heartbeat(with("fleet"), good("eb1")); err != nil {
		t.Fatalf("registry token, any id: %v", err)
	}
	if _, err := e.client.Heartbeat(with("tok-b"), good("ea2")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("unknown token: %v", err)
	}
	if got := e.routable(t); !slices.Equal(got, []string{"ea1", "eb1"}) {
		t.Fatalf("routable %v, want ea1 eb1", got)
	}
}

// TestSetTokens: a reload's tokens apply to the next heartbeat: the old
// registry token is refused and the new one taken, engine tokens follow
// the list; leaving no token at all is refused and changes nothing.
func TestSetTokens(t *testing.T) {
	e, _ := startWith(t, registry.Config{}, registryrpc.Options{Token: "old"})
	with := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
	}
	if _, err := e.client.Heartbeat(with("old"), good("w1")); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.SetTokens("new", []registryrpc.EngineToken{{Name: "rack", Token: "tok-r", WorkerIDs: []string{"r1"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Heartbeat(with("old"), good("w1")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("the old token after the reload: %v, want Unauthenticated", err)
	}
	for tok, id := range map[string]string{"new": "w1", "tok-r": "r1"} {
		if _, err := e.client.Heartbeat(with(tok), good(id)); err != nil {
			t.Fatalf("token %s after the reload: %v", tok, err)
		}
	}
	if err := e.srv.CheckTokens("", nil); !errors.Is(err, registryrpc.ErrRegistryOpen) {
		t.Fatalf("CheckTokens of no tokens: %v, want ErrRegistryOpen", err)
	}
	if err := e.srv.CheckTokens("other", nil); err != nil {
		t.Fatalf("CheckTokens of a token: %v", err)
	}
	if _, err := e.client.Heartbeat(with("new"), good("w1")); err != nil {
		t.Fatalf("CheckTokens changed the tokens: %v", err)
	}
	if err := e.srv.SetTokens("", nil); !errors.Is(err, registryrpc.ErrRegistryOpen) || e.srv.Open() {
		t.Fatalf("no tokens: %v (open %v), want ErrRegistryOpen", err, e.srv.Open())
	}
	if _, err := e.client.Heartbeat(context.Background(), good("w1")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token after the refused reload: %v, want Unauthenticated", err)
	}
	// An open registry may get a token (authentication turned on).
	open, _ := startWith(t, registry.Config{}, registryrpc.Options{})
	if err := open.srv.SetTokens("t", nil); err != nil || open.srv.Open() {
		t.Fatalf("turning the registry token on: %v", err)
	}
}
