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
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/internal/auth"
	"github.com/tlgate/tlgate/internal/fleet"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// Server implements controlv1.WorkerRegistryServer.
type Server struct {
	controlv1.UnimplementedWorkerRegistryServer
	root     *actor.RootContext
	registry *actor.PID
	token    [32]byte // sha256 of the registry token; zero when none
	hasToken bool
	timeout  time.Duration
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
}

// New returns the edge in front of the registry actor pid.
func New(root *actor.RootContext, pid *actor.PID, o Options) *Server {
	s := &Server{root: root, registry: pid, timeout: o.Timeout}
	if s.timeout <= 0 {
		s.timeout = 2 * time.Second
	}
	if o.Token != "" {
		s.token = sha256.Sum256([]byte(o.Token))
		s.hasToken = true
	}
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

// ErrUnauthenticated is returned for heartbeats without the registry token.
var ErrUnauthenticated = errors.New("registry token missing or wrong")

// Heartbeat validates the status and hands it to the registry actor.
func (s *Server) Heartbeat(ctx context.Context, st *controlv1.WorkerStatus) (*controlv1.HeartbeatAck, error) {
	arrived := time.Now()
	if err := s.authenticate(ctx); err != nil {
		return nil, s.reject(codes.Unauthenticated, err.Error())
	}
	if err := fleet.Validate(st); err != nil {
		return nil, s.reject(codes.InvalidArgument, err.Error())
	}
	res, err := s.root.RequestFuture(s.registry, &registry.Heartbeat{Status: st, Arrived: arrived, Source: fleet.SourceHeartbeat}, s.timeout).Result()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "registry: %v", err)
	}
	ack, ok := res.(*controlv1.HeartbeatAck)
	if !ok {
		return nil, status.Errorf(codes.Internal, "registry: unexpected answer %T", res)
	}
	return ack, nil
}

func (s *Server) reject(c codes.Code, msg string) error {
	if s.OnReject != nil {
		s.OnReject(c)
	}
	return status.Error(c, msg)
}

func (s *Server) authenticate(ctx context.Context) error {
	if !s.hasToken {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) != 1 {
		return ErrUnauthenticated // none, or more than one: ambiguous
	}
	presented, ok := auth.BearerToken(vals[0])
	sum := sha256.Sum256([]byte(presented))
	if !ok || subtle.ConstantTimeCompare(sum[:], s.token[:]) != 1 {
		return ErrUnauthenticated
	}
	return nil
}
