// Package discovery finds inference engines that send no heartbeats where
// a cluster publishes them: the Kubernetes API (the EndpointSlices of a
// Service, the Pods matching a label selector, or the pods of an
// InferencePool) or DNS (A/AAAA or SRV records, as a headless Service
// publishes them). Each [[gateway.discovery]]
// source reports the whole set of engines it knows whenever it changes, and
// Runner hands that set to the probe manager, which probes, registers,
// drains and forgets them exactly like [[gateway.engines]] entries.
//
// Runner drops the addresses requests are never sent to (unspecified,
// multicast, link-local such as a cloud metadata service, outside
// engine_networks, the gateway's own listeners), logging each once, and
// keeps at most max_engines engines of each source.
//
// A source marks an engine draining when the cluster says it should take
// no new requests (a not-ready or terminating endpoint or pod, an address
// gone from DNS): its heartbeats then say draining, so the router sends it
// nothing new while requests in flight finish. An engine the source no
// longer reports (a deleted endpoint or pod, a DNS address gone for longer
// than drain_period) is forgotten at once.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/probe"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// ErrSource is wrapped by the errors of a source that cannot start.
var ErrSource = errors.New("discovery: source cannot start")

// Endpoint is one engine a source found.
type Endpoint struct {
	// Key identifies the engine within its source (a pod's namespace and
	// name, or an address); the worker id is the source's name, ":" and Key.
	Key string
	// Address is the engine's host:port.
	Address string
	// Model is the model it serves as the cluster says (a pod label or
	// annotation); empty means the source's model, or GET /v1/models.
	Model string
	// Role is unified, prefill or decode as the cluster says; empty means
	// the source's role.
	Role string
	// BootstrapPort is an SGLang prefill engine's bootstrap port as the
	// cluster says (a pod label or annotation); 0 means the source's.
	BootstrapPort int
	// Draining: routed nothing new (not ready, terminating, gone from DNS).
	Draining bool
}

// Source finds engines.
type Source interface {
	// Run reports the whole set of engines found, each time it may have
	// changed, until ctx ends. Errors while running (an API server or DNS
	// server unreachable) are logged and retried, keeping the last set.
	Run(ctx context.Context, report func([]Endpoint))
}

// Sink takes the engines of a source: *probe.Manager.
type Sink interface {
	SetSource(name string, engines []probe.Engine)
}

// Runner runs the configured sources and feeds their engines to a Sink.
type Runner struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Options are what Start needs besides the configured sources.
type Options struct {
	Logger zerolog.Logger
	// Addresses refuses the addresses requests are never sent to: every
	// source's are dropped (and logged) before they reach the Sink. A nil
	// policy refuses the unspecified, multicast and link-local ones.
	Addresses *fleet.AddressPolicy
	// Metrics is told what each report held and left out; nil: nothing.
	Metrics Metrics
	// NewSource builds a source from its configuration; nil means New.
	NewSource func(config.Discovery, zerolog.Logger) (Source, error)
}

// Start builds every source (an error names the source and stops the
// others) and runs each until Close.
func Start(cfgs []config.Discovery, sink Sink, o Options) (*Runner, error) {
	newSource := o.NewSource
	if newSource == nil {
		newSource = New
	}
	type started struct {
		cfg  config.Discovery
		auth string
		src  Source
	}
	var all []started
	for _, c := range cfgs {
		auth, err := c.Authorization()
		if err != nil {
			return nil, fmt.Errorf("discovery %q: %w", c.Name, err)
		}
		src, err := newSource(c, o.Logger.With().Str("discovery", c.Name).Logger())
		if err != nil {
			return nil, fmt.Errorf("discovery %q: %w", c.Name, err)
		}
		all = append(all, started{c, auth, src})
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runner{cancel: cancel}
	for _, s := range all {
		limit := s.cfg.MaxEngines
		if limit <= 0 {
			limit = config.DefaultDiscoveryMaxEngines
		}
		adm := newAdmission(s.cfg.Name, limit, o.Addresses.CheckDial, o.Logger.With().Str("discovery", s.cfg.Name).Logger(), o.Metrics)
		r.wg.Go(func() {
			var last []probe.Engine
			s.src.Run(ctx, func(eps []Endpoint) {
				if ctx.Err() != nil {
					return
				}
				engines := Engines(s.cfg, s.auth, adm.filter(eps))
				if last != nil && slices.Equal(engines, last) {
					return
				}
				last = engines
				sink.SetSource(s.cfg.Name, engines)
			})
		})
	}
	return r, nil
}

// Close stops every source and waits for them; their engines are left to
// the Sink (the gateway is shutting down).
func (r *Runner) Close() {
	if r == nil {
		return
	}
	r.cancel()
	r.wg.Wait()
}

// New builds the source c configures (c validated by config).
func New(c config.Discovery, log zerolog.Logger) (Source, error) {
	switch c.Kind {
	case config.DiscoveryDNS:
		return NewDNS(c, log), nil
	case config.DiscoveryKubernetes:
		return NewKubernetes(c, log)
	case config.DiscoveryInferencePool:
		return NewInferencePool(c, log)
	}
	return nil, fmt.Errorf("%w: unknown kind %q", ErrSource, c.Kind)
}

// Engines maps a source's endpoints to the engines the probe manager
// takes, sorted by id; auth is the source's Authorization header.
func Engines(c config.Discovery, auth string, eps []Endpoint) []probe.Engine {
	out := make([]probe.Engine, 0, len(eps))
	for _, ep := range eps {
		model := c.Model
		if model == "" {
			model = ep.Model
		}
		role := ep.Role
		if role == "" {
			role = c.Role
		}
		boot := ep.BootstrapPort
		if boot == 0 {
			boot = c.BootstrapPort
		}
		if c.EngineKind != config.KindSGLang || role != config.RolePrefill {
			boot = 0
		}
		e := probe.Engine{
			Engine: config.Engine{
				ID:            WorkerID(c.Name, ep.Key),
				HTTPAddress:   c.Scheme + "://" + ep.Address,
				Model:         model,
				Kind:          c.EngineKind,
				Role:          role,
				BootstrapPort: boot,
				ProbeInterval: c.ProbeInterval,
				AuthHeader:    auth,
			},
			Role:     RoleOf(role),
			Draining: ep.Draining,
		}
		// The engine's KV events sockets are on its host ("tcp://:port").
		if c.KVEventsPort > 0 {
			e.KVEvents, e.KVEventsTopic = "tcp://:"+strconv.Itoa(c.KVEventsPort), c.KVEventsTopic
			if c.KVEventsReplayPort > 0 {
				e.KVEventsReplay = "tcp://:" + strconv.Itoa(c.KVEventsReplayPort)
			}
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b probe.Engine) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// RoleOf maps a configured role (unified, prefill, decode) to the
// contract's; anything else is unified.
func RoleOf(role string) controlv1.Role { return probe.RoleOf(role) }

// maxID is the longest worker id (tl.control.v1).
const maxID = 128

// WorkerID is the worker id of an engine found by source name under key:
// "name:key" with every byte a worker id cannot hold replaced by '-', and,
// when longer than a worker id may be, cut and suffixed with a hash of the
// whole so that ids stay distinct.
func WorkerID(name, key string) string {
	id := []byte(name + ":" + key)
	for i, c := range id {
		if !(c == '.' || c == '_' || c == ':' || c == '-' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			id[i] = '-'
		}
	}
	if len(id) <= maxID {
		return string(id)
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(name + ":" + key))
	return fmt.Sprintf("%s-%016x", id[:maxID-17], h.Sum64())
}

// hostPort joins a host (an IP address or a name) and a port.
func hostPort(host string, port int) string {
	return net.JoinHostPort(strings.TrimSuffix(host, "."), fmt.Sprint(port))
}
