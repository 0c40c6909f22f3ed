// Package registryrpc is the gRPC edge of the registry: it serves
// tl.control.v1.WorkerRegistry, authenticates and validates each heartbeat,
// stamps its arrival time and turns it into a message to the registry actor.
// It decides nothing else.
package registryrpc

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/guard/peerlimit"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// Server implements controlv1.WorkerRegistryServer.
type Server struct {
	controlv1.UnimplementedWorkerRegistryServer
	root     *actor.RootContext
	registry *actor.PID
	creds    atomic.Pointer[credentials] // replaced whole by SetTokens
	timeout  time.Duration
	peers    *peerlimit.Limiter
	inflight chan struct{} // a slot per heartbeat waiting on the registry
	addrs    *fleet.AddressPolicy
	// OnReject, if set, is called with the gRPC code of every refused
	// heartbeat (metrics).
	OnReject func(code codes.Code)
}

// Options configure the edge.
type Options struct {
	// Token, when not empty, must be presented by engines as gRPC metadata
	// "authorization: Bearer <token>" (the scheme in any case, as on the
	// HTTP edge: auth.BearerToken).
	Token string
	// Timeout bounds the wait for the registry's answer (default 2 s).
	Timeout time.Duration
	// PeerRate and PeerBurst limit the heartbeats of one peer IP (per
	// second, and at once); a heartbeat over it is refused with
	// ResourceExhausted before anything else is done. PeerRate 0 disables
	// the limit.
	PeerRate  float64
	PeerBurst int
	// MaxInFlight bounds the heartbeats waiting on the registry actor at
	// once (DefaultMaxInFlight when 0): beyond it a heartbeat is refused
	// with ResourceExhausted at once, so the registry's mailbox never holds
	// more than that and a flood cannot delay the real workers' heartbeats
	// past their deadlines.
	MaxInFlight int
	// Addresses, if set, refuses engine addresses it rules out (the
	// gateway's own listeners, addresses outside engine_networks) with
	// PermissionDenied.
	Addresses *fleet.AddressPolicy
	// EngineTokens are tokens for some engines only: a heartbeat that
	// presents one may name only its WorkerIDs (PermissionDenied
	// otherwise). With any set, a heartbeat must present Token or one of
	// them.
	EngineTokens []EngineToken
}

// EngineToken is one per-engine token and the worker ids it may use.
type EngineToken struct {
	Name      string
	Token     string
	WorkerIDs []string
}

type engineToken struct {
	name   string
	digest [32]byte
	ids    map[string]bool
}

// credentials are the tokens heartbeats are checked against.
type credentials struct {
	token    [32]byte // sha256 of the registry token; zero when none
	hasToken bool
	engines  []engineToken
}

func (c *credentials) open() bool { return !c.hasToken && len(c.engines) == 0 }

func newCredentials(token string, ets []EngineToken) *credentials {
	c := &credentials{}
	if token != "" {
		c.token = sha256.Sum256([]byte(token))
		c.hasToken = true
	}
	for _, et := range ets {
		ids := make(map[string]bool, len(et.WorkerIDs))
		for _, id := range et.WorkerIDs {
			ids[id] = true
		}
		c.engines = append(c.engines, engineToken{name: et.Name, digest: sha256.Sum256([]byte(et.Token)), ids: ids})
	}
	return c
}

// ErrRegistryOpen is returned by SetTokens for no tokens at all while
// tokens are configured.
var ErrRegistryOpen = errors.New("registryrpc: a reload cannot open the registry (no registry_token or engine_tokens left); restart the gateway for that")

// Open reports whether heartbeats need no token (none is configured).
func (s *Server) Open() bool { return s.creds.Load().open() }

// SetTokens replaces the registry token and the engine tokens (a reload)
// for every heartbeat checked from then on. It refuses, changing nothing,
// to leave no token at all while some are configured (ErrRegistryOpen):
// opening the registry is for a restart, which warns when it is off
// loopback.
func (s *Server) SetTokens(token string, engineTokens []EngineToken) error {
	c, err := s.replacement(token, engineTokens)
	if err != nil {
		return err
	}
	s.creds.Store(c)
	return nil
}

// CheckTokens reports the error SetTokens would return, changing nothing.
func (s *Server) CheckTokens(token string, engineTokens []EngineToken) error {
	_, err := s.replacement(token, engineTokens)
	return err
}

// replacement is the credentials SetTokens would install.
func (s *Server) replacement(token string, engineTokens []EngineToken) (*credentials, error) {
	c := newCredentials(token, engineTokens)
	if c.open() && !s.creds.Load().open() {
		return nil, ErrRegistryOpen
	}
	return c, nil
}

// DefaultMaxInFlight is Options.MaxInFlight's default.
const DefaultMaxInFlight = 256

// New returns the edge in front of the registry actor pid.
func New(root *actor.RootContext, pid *actor.PID, o Options) *Server {
	s := &Server{root: root, registry: pid, timeout: o.Timeout, addrs: o.Addresses}
	if s.timeout <= 0 {
		s.timeout = 2 * time.Second
	}
	s.creds.Store(newCredentials(o.Token, o.EngineTokens))
	s.peers = peerlimit.New(peerlimit.Options{Rate: o.PeerRate, Burst: o.PeerBurst})
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	s.inflight = make(chan struct{}, o.MaxInFlight)
	return s
}

// Register serves the registry, grpc.health.v1 (SERVING) and reflection on g.
func (s *Server) Register(g *grpc.Server) *health.Server {
	controlv1.RegisterWorkerRegistryServer(g, s)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(controlv1.WorkerRegistry_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	return hs
}

// Errors of refused heartbeats, sent as the gRPC status message.
var (
	// ErrUnauthenticated is returned for heartbeats without the registry
	// token.
	ErrUnauthenticated = errors.New("registry token missing or wrong")
	// ErrPeerRate is returned for a heartbeat over its peer's rate.
	ErrPeerRate = errors.New("heartbeat rate of this peer over registry_peer_rate")
	// ErrBusy is returned when MaxInFlight heartbeats already wait.
	ErrBusy = errors.New("registry busy")
	// ErrIDNotAllowed is returned when an engine token names a worker id
	// it does not list.
	ErrIDNotAllowed = errors.New("worker_id not allowed for this engine token")
)

// Heartbeat validates the status and hands it to the registry actor.
func (s *Server) Heartbeat(ctx context.Context, st *controlv1.WorkerStatus) (*controlv1.HeartbeatAck, error) {
	arrived := time.Now()
	var from netip.Addr
	if p, ok := peer.FromContext(ctx); ok {
		from = peerlimit.Key(p.Addr)
	}
	if !s.peers.Allow(from, arrived) {
		return nil, s.reject(codes.ResourceExhausted, fmt.Sprintf("%v (%s)", ErrPeerRate, from))
	}
	allowed, err := s.authenticate(ctx)
	if err != nil {
		return nil, s.reject(codes.Unauthenticated, err.Error())
	}
	if err := fleet.Validate(st); err != nil {
		return nil, s.reject(codes.InvalidArgument, err.Error())
	}
	if allowed != nil && !allowed.ids[st.GetWorkerId()] {
		return nil, s.reject(codes.PermissionDenied, fmt.Sprintf("%v: engine token %q may not register %q", ErrIDNotAllowed, allowed.name, st.GetWorkerId()))
	}
	if err := s.addrs.Check(st); err != nil {
		return nil, s.reject(codes.PermissionDenied, err.Error())
	}
	select {
	case s.inflight <- struct{}{}:
		defer func() { <-s.inflight }()
	default:
		return nil, s.reject(codes.ResourceExhausted, fmt.Sprintf("%v: %d heartbeats already wait; retry at the next interval", ErrBusy, cap(s.inflight)))
	}
	res, err := s.root.RequestFuture(s.registry, &registry.Heartbeat{Status: st, Arrived: arrived, Source: fleet.SourceHeartbeat}, s.timeout).Result()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "registry: %v", err)
	}
	switch r := res.(type) {
	case *controlv1.HeartbeatAck:
		return r, nil
	case *registry.Refused:
		code := codes.FailedPrecondition
		if errors.Is(r.Err, registry.ErrTooManyWorkers) {
			code = codes.ResourceExhausted
		}
		return nil, s.reject(code, r.Err.Error())
	}
	return nil, status.Errorf(codes.Internal, "registry: unexpected answer %T", res)
}

func (s *Server) reject(c codes.Code, msg string) error {
	if s.OnReject != nil {
		s.OnReject(c)
	}
	return status.Error(c, msg)
}

// authenticate checks the heartbeat's token: none is needed when no token
// is configured; the registry token allows any worker id (nil); an engine
// token allows its own ids. Every digest is compared, in constant time.
func (s *Server) authenticate(ctx context.Context) (*engineToken, error) {
	c := s.creds.Load() // one set of tokens for the whole check
	if c.open() {
		return nil, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) != 1 {
		return nil, ErrUnauthenticated // none, or more than one: ambiguous
	}
	presented, ok := auth.BearerToken(vals[0])
	if !ok {
		return nil, ErrUnauthenticated
	}
	sum := sha256.Sum256([]byte(presented))
	registry := c.hasToken && subtle.ConstantTimeCompare(sum[:], c.token[:]) == 1
	var engine *engineToken
	for i := range c.engines {
		if subtle.ConstantTimeCompare(sum[:], c.engines[i].digest[:]) == 1 {
			engine = &c.engines[i]
		}
	}
	switch {
	case registry:
		return nil, nil
	case engine != nil:
		return engine, nil
	}
	return nil, ErrUnauthenticated
}
