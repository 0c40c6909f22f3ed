package enginesim

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// fakeRegistry is a WorkerRegistry that records heartbeats and answers
// with a configurable ack.
type fakeRegistry struct {
	controlv1.UnimplementedWorkerRegistryServer
	addr string
	got  chan heartbeat

	mu  sync.Mutex
	ack *controlv1.HeartbeatAck
	n   int
}

type heartbeat struct {
	status *controlv1.WorkerStatus
	auth   []string
}

func startRegistry(t testing.TB) *fakeRegistry {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &fakeRegistry{addr: lis.Addr().String(), got: make(chan heartbeat, 100), ack: &controlv1.HeartbeatAck{IntervalMs: 2000}}
	s := grpc.NewServer()
	controlv1.RegisterWorkerRegistryServer(s, r)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return r
}

func (r *fakeRegistry) Heartbeat(ctx context.Context, s *controlv1.WorkerStatus) (*controlv1.HeartbeatAck, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	r.mu.Lock()
	r.n++
	ack := proto.Clone(r.ack).(*controlv1.HeartbeatAck)
	r.mu.Unlock()
	select {
	case r.got <- heartbeat{status: s, auth: md.Get("authorization")}:
	default:
	}
	return ack, nil
}

func (r *fakeRegistry) setAck(a *controlv1.HeartbeatAck) {
	r.mu.Lock()
	r.ack = a
	r.mu.Unlock()
}

func (r *fakeRegistry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func TestHeartbeats(t *testing.T) {
	r1, r2 := startRegistry(t), startRegistry(t)
	// The initial interval is an hour: further heartbeats prove the ack's
	// interval_ms was adopted.
	r1.setAck(&controlv1.HeartbeatAck{IntervalMs: 1})
	r2.setAck(&controlv1.HeartbeatAck{IntervalMs: 3_600_000})
	e := startEngine(t, Config{ID: "w-1", Model: "m", Role: RoleDecode, KVBlocks: 77, KVFormat: 4,
		Gateways: []string{r1.addr, r2.addr}, HeartbeatInterval: time.Hour, RegistryToken: "s3cret"})
	hb := <-r1.got
	want := &controlv1.WorkerStatus{
		WorkerId: "w-1", HttpAddress: e.HTTPAddr(), KvAddress: e.KVAddr(), Role: controlv1.Role_ROLE_DECODE,
		Model: "m", KvFormat: 4, KvFreeBlocks: 77, KvTotalBlocks: 77, KvBlockTokens: 16,
		StartedAtUnixMs: hb.status.StartedAtUnixMs,
	}
	if !proto.Equal(hb.status, want) || hb.status.StartedAtUnixMs == 0 {
		t.Fatalf("heartbeat\n%v\nwant\n%v", hb.status, want)
	}
	if len(hb.auth) != 1 || hb.auth[0] != "Bearer s3cret" {
		t.Fatalf("authorization metadata %q", hb.auth)
	}
	if hb2 := <-r2.got; hb2.status.WorkerId != "w-1" {
		t.Fatalf("second gateway got %v", hb2.status)
	}
	for range 3 {
		<-r1.got
	}
	if n := r2.count(); n != 1 {
		t.Fatalf("gateway 2 (an hour apart) got %d heartbeats", n)
	}
}

func TestHeartbeatDrain(t *testing.T) {
	r := startRegistry(t)
	r.setAck(&controlv1.HeartbeatAck{IntervalMs: 1})
	e := startEngine(t, Config{Model: "m", Gateways: []string{r.addr}, DecodePerToken: time.Millisecond})
	c := newClient(t)
	<-r.got

	// A request in flight when the drain arrives finishes.
	s := openStream(t, context.Background(), c, e.URL()+"/v1/completions",
		completionBody("m", "in flight", map[string]any{"max_tokens": 5, "stream": true}))
	defer s.close()
	s.next(t)

	r.setAck(&controlv1.HeartbeatAck{IntervalMs: 1, Drain: true})
	for hb := range r.got {
		if hb.status.Draining {
			break
		}
	}
	if !e.Draining() || !e.Stats().Draining {
		t.Fatal("engine not draining after the ack")
	}
	rsp := post(t, c, e.URL()+"/v1/completions", completionBody("m", "new", nil))
	if rsp.status != http.StatusServiceUnavailable || decode[errorJSON](t, rsp.body).Error.Code != "draining" {
		t.Fatalf("new request while draining: %d %s", rsp.status, rsp.body)
	}
	var last string
	for {
		d, err := s.tryNext()
		if err != nil {
			break
		}
		last = d
	}
	if last != "[DONE]" {
		t.Fatalf("in-flight stream did not finish: last %q", last)
	}
	// Stop asking to drain, then undrain once no old ack can arrive: the
	// heartbeat received after clearing may carry an old ack, the one after
	// it cannot (the engine sends one heartbeat at a time).
	r.setAck(&controlv1.HeartbeatAck{IntervalMs: 1})
	for len(r.got) > 0 {
		<-r.got
	}
	<-r.got
	<-r.got
	e.SetDraining(false)
	complete(t, c, e.URL(), false, completionBody("m", "undrained", nil))
}

func TestFaultNoHeartbeat(t *testing.T) {
	r := startRegistry(t)
	r.setAck(&controlv1.HeartbeatAck{IntervalMs: 1})
	h := &hooks{heartbeatSkipped: make(chan struct{})}
	e := startEngine(t, Config{Model: "m", Gateways: []string{r.addr}, hooks: h})
	<-r.got
	if err := e.SetFaults(Faults{NoHeartbeat: true}); err != nil {
		t.Fatal(err)
	}
	<-h.heartbeatSkipped
	n := r.count()
	<-h.heartbeatSkipped
	<-h.heartbeatSkipped
	if got := r.count(); got != n {
		t.Fatalf("%d heartbeats arrived between skipped ones", got-n)
	}
	if s := e.Stats(); s.HeartbeatsSkipped < 3 {
		t.Fatalf("stats %+v", s)
	}
	if err := e.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	for len(r.got) > 0 {
		<-r.got
	}
	<-r.got
}

func TestHeartbeatFailuresCounted(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	h := &hooks{heartbeatReturned: make(chan error)}
	e := startEngine(t, Config{Model: "m", Gateways: []string{addr}, HeartbeatInterval: time.Millisecond, hooks: h})
	if err := <-h.heartbeatReturned; err == nil {
		t.Fatal("heartbeat to a closed port succeeded")
	}
	<-h.heartbeatReturned
	if s := e.Stats(); s.HeartbeatsFailed < 1 || s.HeartbeatsSent != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestNextBeat: heartbeats keep their period from each send, so a slow
// ack does not push the next one towards the gateway's eviction deadline.
func TestNextBeat(t *testing.T) {
	const T = 200 * time.Millisecond
	for _, tc := range []struct{ elapsed, want time.Duration }{
		{0, T}, {5 * time.Millisecond, 195 * time.Millisecond}, {150 * time.Millisecond, 50 * time.Millisecond}, {T, 0}, {time.Second, 0},
	} {
		if got := nextBeat(T, tc.elapsed); got != tc.want {
			t.Errorf("nextBeat(%v, %v) = %v, want %v", T, tc.elapsed, got, tc.want)
		}
	}
}
