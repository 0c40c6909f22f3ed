// Package gateway is tlgate's composition root as a library: Start builds
// the actor system, the registry, router and admin actors, the gRPC registry
// server and the HTTP server (OpenAI API, admin API, ops) in order, and
// Close stops them in reverse. cmd/gateway and the integration tests both
// run a gateway through it.
package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tlgate/tlgate/actors/admin"
	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/discovery"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
	"github.com/tlgate/tlgate/internal/adapter/probe"
	"github.com/tlgate/tlgate/internal/adapter/tracing"
	"github.com/tlgate/tlgate/internal/adapter/traffic"
	"github.com/tlgate/tlgate/internal/edge/adminhttp"
	"github.com/tlgate/tlgate/internal/edge/console"
	"github.com/tlgate/tlgate/internal/edge/httpedge"
	"github.com/tlgate/tlgate/internal/edge/openapi"
	"github.com/tlgate/tlgate/internal/edge/pprofhttp"
	"github.com/tlgate/tlgate/internal/edge/registryrpc"
	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/guard/bodyguard"
	"github.com/tlgate/tlgate/internal/guard/connlimit"
	"github.com/tlgate/tlgate/internal/guard/ratelimit"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/routing/sticky"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
	"github.com/tlgate/tlgate/internal/wire/engineclient"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// Options are what the composition root is given besides the config.
type Options struct {
	Logger   zerolog.Logger
	Registry prometheus.Registerer
	Gatherer prometheus.Gatherer
	// Hooks for tests; each may be nil.
	RequestHooks func(d *request.Deps)
	// Traffic sizes the console's traffic rings; zero fields take the
	// package defaults (5 s × 180 buckets).
	Traffic traffic.Config
	// Now is the clock of the per-key rate limits; nil means time.Now.
	Now func() time.Time
	// Tracing, when set, replaces the provider [gateway.tracing] would
	// build (tests pass one with an in-memory exporter). The caller shuts
	// it down.
	Tracing *tracing.Provider
	// RegistryListener, when set, is where the gRPC registry serves,
	// instead of a listener on gateway.registry_listen: a test whose
	// engines must know the address before the gateway runs holds the
	// port until then. The gateway closes it.
	RegistryListener net.Listener
}

// Gateway is a running gateway.
type Gateway struct {
	cfg      *config.Config
	log      zerolog.Logger
	sys      *actor.ActorSystem
	Registry *actor.PID
	Router   *actor.PID
	Admin    *actor.PID
	Metrics  *metrics.Metrics
	probes   *probe.Manager
	grpc     *grpc.Server
	http     *http.Server
	httpLis  net.Listener
	grpcLis  net.Listener
	engines  *engineclient.Client
	detached sync.WaitGroup // request.Deps.Detached
	proxy    *proxy.Proxy
	stops    []func(context.Context) error // in start order; run in reverse
	// Traffic keeps the last 15 minutes per model for the console.
	Traffic *traffic.Recorder
	// Keys holds the per-key usage metrics (nil without a Registry), KV
	// those of routing on the engines' KV events.
	Keys    *metrics.KeyMetrics
	KV      *metrics.KVMetrics
	tracing *tracing.Provider
	store   store.Store
	// keyring, limits and rpc hold the API keys, their limits and the
	// registry's tokens, replaced on a reload (ApplyCredentials).
	keyring *auth.Keyring
	limits  *ratelimit.Limiter
	rpc     *registryrpc.Server
	// sync is fleet sync with the other replicas (nil: off).
	sync *fleetsync.Client
	// stopping is set by BeginShutdown: /readyz answers 503.
	stopping atomic.Bool
}

// HTTPAddr is the address the HTTP server listens on.
func (g *Gateway) HTTPAddr() string { return g.httpLis.Addr().String() }

// RegistryAddr is the address the gRPC registry listens on.
func (g *Gateway) RegistryAddr() string { return g.grpcLis.Addr().String() }

// System is the gateway's actor system.
func (g *Gateway) System() *actor.ActorSystem { return g.sys }

// ErrOpenWithoutKeys refuses to serve without API keys off loopback.
var ErrOpenWithoutKeys = errors.New("no api_keys configured and a listener is not on loopback: refusing to serve without authentication")

// Start builds and starts a gateway. On error, whatever was started is
// stopped again.
func Start(ctx context.Context, cfg *config.Config, o Options) (*Gateway, error) {
	g := &Gateway{cfg: cfg, log: o.Logger}
	if err := g.start(cfg, o); err != nil {
		_ = g.Close(context.Background())
		return nil, err
	}
	return g, nil
}

func (g *Gateway) start(cfg *config.Config, o Options) error {
	gw := cfg.Gateway
	if len(gw.APIKeys) == 0 && !cfg.AllLoopback() {
		return fmt.Errorf("gateway.api_keys: %w", ErrOpenWithoutKeys)
	}
	keyring, err := keyringOf(gw.APIKeys)
	if err != nil {
		return fmt.Errorf("gateway.api_keys: %w", err)
	}
	pol, err := policy.ParsePolicy(gw.RoutePolicy)
	if err != nil {
		return fmt.Errorf("gateway.route_policy: %w", err)
	}
	token, err := gw.RegistryTokenValue()
	if err != nil {
		return err
	}

	// Route table: the stored one (state_dir or etcd) wins over the
	// config's seed.
	ss, err := g.openStore(&gw, o.Logger)
	if err != nil {
		return err
	}
	g.store = ss.store
	epoch := ss.epoch
	table, err := routes.NewTable(ss.routes)
	if err != nil {
		return fmt.Errorf("gateway.routes: %w", err)
	}

	// Metrics, on the registry the caller passes in.
	if o.Registry != nil {
		if g.Metrics, err = metrics.New(o.Registry); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		g.Metrics.Epoch(epoch)
		g.Metrics.StoreUp(ss.store.Up())
		if g.Keys, err = metrics.NewKeyMetrics(o.Registry); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	m := g.Metrics
	// Requests refused before routing are counted and logged; 400, 401
	// and 403 answers of the auth check are such refusals too.
	rejected := func(r *http.Request, status int, code string) {
		m.Rejected(code)
		refusedLog(o.Logger, r, status, code)
	}
	keyring = keyring.WithOnReject(rejected)
	g.keyring, g.limits = keyring, limiterOf(gw.APIKeys, o.Now)

	// Tracing: off (and free) unless configured or given.
	if g.tracing, err = g.startTracing(cfg.Gateway.Tracing, o.Tracing); err != nil {
		return err
	}

	// Actor system and actors.
	g.sys = actorsys.New(o.Logger)
	// The request actors' mailboxes run on pooled goroutines when their
	// edge loop cannot run them; pooled goroutines keep the stacks their
	// deep calls grew.
	pool := actorsys.NewPool(actorsys.PoolSize(), actorsys.DefaultThroughput)
	g.stops = append(g.stops, func(context.Context) error { g.sys.Shutdown(); pool.Close(); return nil })
	g.Registry = g.sys.Root.Spawn(registry.Props(registry.NewState(registry.Config{
		Interval: gw.HeartbeatInterval.Duration, MissLimit: gw.HeartbeatMissLimit, Epoch: epoch,
		OnEvict: func(w fleet.Worker) {
			m.Eviction(w.Model)
			o.Logger.Warn().Str("worker", w.ID).Str("model", w.Model).Time("last_heartbeat", w.LastHeartbeat).Msg("worker evicted")
		},
		// A worker that left takes its own series with it
		// (refreshGauges drops any a scrape set again meanwhile).
		OnGone: func(w fleet.Worker) { m.DeleteWorker(w.ID) },
		OnRegister: func(w fleet.Worker) {
			m.Registration(w.Model, w.Source)
			o.Logger.Info().Str("worker", w.ID).Str("model", w.Model).Str("role", string(w.Role)).Str("http", w.HTTPAddress).Str("source", w.Source).Msg("worker registered")
		},
		MaxWorkers: gw.MaxWorkers,
		OnRefuse:   registryRefused(o.Logger),
	})))
	g.stops = append(g.stops, g.stopActor(g.Registry))
	rcfg := routerConfig(pol, &gw)
	overloadConfig(&rcfg, gw, m, o.Logger)
	if g.KV, err = newKVMetrics(o.Registry); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	kvRouterConfig(&rcfg, &gw, g.KV)
	stored := sticky.New(sticky.Config{TTL: gw.Responses.StoreTTL.Duration, MaxEntries: gw.Responses.StoreMaxEntries})
	if err := g.newSync(&gw, o.Registry, o.Logger, &rcfg, stored, o.Now); err != nil {
		return fmt.Errorf("gateway.%w", err)
	}
	// The router's mailbox runs on the goroutine of whoever sends to it
	// when it is idle (a request's edge loop, most often), and the
	// router's answer is queued in that request actor's running mailbox:
	// a request is routed without a goroutine handoff. The router's
	// Receive never blocks and calls only non-blocking hooks, so it may
	// run under any sender; while it is busy, senders only enqueue.
	g.Router = g.sys.Root.Spawn(router.Props(router.NewState(rcfg, table, epoch), g.Registry).
		Configure(actor.WithDispatcher(actor.NewSynchronizedDispatcher(actorsys.DefaultThroughput))))
	g.stops = append(g.stops, g.stopActor(g.Router))
	g.Admin = g.sys.Root.Spawn(admin.Props(admin.Deps{
		Router: g.Router, Registry: g.Registry, Logger: o.Logger,
		Table: table, Epoch: epoch, OnWrite: m.AdminWrite, OnEpoch: m.Epoch, OnDrain: m.Drain,
		Store: ss.store, Rev: ss.rev, Bounds: boundsOf(&gw),
	}))
	g.stops = append(g.stops, g.stopActor(g.Admin))
	g.followStore(ss)

	// Engine clients, over TLS when an engine CA is configured.
	engineTLS, err := loadEngineTLS(gw.EngineCAFile)
	if err != nil {
		return fmt.Errorf("gateway.%w", err)
	}
	// Every dial to an engine checks the address it resolved to: a host
	// name in a heartbeat may resolve to what the registry refuses as a
	// literal (a link-local metadata service, the gateway itself).
	addrs := fleet.NewAddressPolicy(gw.EngineNetworkPrefixes())
	scheme := "http"
	var grpcCreds credentials.TransportCredentials
	if engineTLS != nil {
		scheme = "https"
		grpcCreds = credentials.NewTLS(engineTLS)
	}
	engineTransport := func() *http.Transport {
		return &http.Transport{
			Proxy:           nil, // engines are reached directly
			DialContext:     (&net.Dialer{Timeout: gw.ConnectTimeout.Duration, KeepAlive: 30 * time.Second, Control: addrs.DialControl}).DialContext,
			TLSClientConfig: engineTLS,
		}
	}
	engineHTTP := func() *http.Client { return &http.Client{Transport: engineTransport()} }
	probeClient := engineHTTP()
	g.proxy = proxy.New(proxy.Options{
		ConnectTimeout:   gw.ConnectTimeout.Duration,
		FirstByteTimeout: gw.FirstByteTimeout.Duration,
		IdleTimeout:      gw.IdleTimeout.Duration,
		// A client that reads nothing for as long as an engine may stay
		// silent is gone.
		ClientWriteTimeout: gw.IdleTimeout.Duration,
		TLS:                engineTLS,
		DialControl:        addrs.DialControl,
	})
	g.stops = append(g.stops, func(context.Context) error { g.proxy.Close(); return nil })
	g.engines = engineclient.New(engineclient.Options{
		Timeout: gw.FirstByteTimeout.Duration, TLS: grpcCreds, Scheme: scheme,
		HTTP: engineHTTP(), DialControl: addrs.DialControl,
		ReconnectMaxDelay: gw.HeartbeatInterval.Duration,
	})
	g.stops = append(g.stops, func(context.Context) error { return g.engines.Close() })
	// The engine calls requests leave running after their answers end
	// before the engine client closes (or when the stop's time is up).
	g.stops = append(g.stops, func(ctx context.Context) error { return waitGroup(ctx, &g.detached) })

	// gRPC registry server.
	var gopts []grpc.ServerOption
	serverTLS, err := loadServerTLS(gw.TLSCertFile, gw.TLSKeyFile)
	if err != nil {
		return fmt.Errorf("gateway.tls_cert_file, gateway.tls_key_file: %w", err)
	}
	if serverTLS != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(serverTLS)))
	}
	g.grpc = grpc.NewServer(gopts...)
	engineTokens, err := engineTokensOf(gw.EngineTokens)
	if err != nil {
		return fmt.Errorf("gateway.engine_tokens: %w", err)
	}
	rpc := registryrpc.New(g.sys.Root, g.Registry, registryrpc.Options{
		Token: token, PeerRate: gw.RegistryPeerRate, PeerBurst: gw.RegistryPeerBurst, Addresses: addrs,
		EngineTokens: engineTokens,
	})
	rpc.OnReject = m.HeartbeatRejected
	g.rpc = rpc
	rpc.Register(g.grpc)
	if g.grpcLis = o.RegistryListener; g.grpcLis == nil {
		if g.grpcLis, err = net.Listen("tcp", gw.RegistryListen); err != nil {
			return fmt.Errorf("gateway.registry_listen: %w", err)
		}
	}
	addOwn(o.Logger, addrs, g.grpcLis.Addr())
	if h, err := net.ResolveTCPAddr("tcp", gw.Listen); err == nil && h.Port != 0 {
		addOwn(o.Logger, addrs, h) // known before it is bound
	}
	warnOpenRegistry(o.Logger, gw)
	go func() { _ = g.grpc.Serve(g.grpcLis) }()
	g.stops = append(g.stops, func(ctx context.Context) error { return stopGRPC(ctx, g.grpc) })

	// HTTP server.
	rdeps := &request.Deps{Router: g.Router, Proxy: g.proxy, Engines: g.engines, MaxAttempts: gw.MaxAttempts, Scheme: scheme, Dispatcher: pool,
		Stored: g.storedResponses(stored), NoCapacityRetryAfter: rcfg.NoCapacityRetryAfter, Detached: &g.detached}
	instrument(rdeps, m)
	if pol == policy.NameCacheAware && !rcfg.NoExact { // kvRouterConfig: [gateway.kv_events] follow
		// Prompts are tokenized on requests' paths, many at once: the
		// connections are kept (with net/http's two idle ones per host,
		// the rest would be closed and opened again under load), and a
		// prompt of tens of KB and its tokens' answer go 64 KB at a time
		// through the connection's buffers, not 4 KB.
		tt := engineTransport()
		tt.MaxIdleConnsPerHost = 64
		tt.ReadBufferSize, tt.WriteBufferSize = 64<<10, 64<<10
		g.startKVEvents(&gw, rdeps, &http.Client{Transport: tt}, addrs.DialControl, g.KV, o.Logger)
	}
	g.Traffic = traffic.New(o.Traffic)
	feedTraffic(rdeps, g.Traffic)
	rdeps.Tracer = g.tracing.Tracer()
	if o.RequestHooks != nil {
		o.RequestHooks(rdeps)
	}
	mux := http.NewServeMux()
	edge := &httpedge.Deps{
		Root: g.sys.Root, Router: g.Router, Request: rdeps, Keyring: keyring, MaxBodyBytes: gw.MaxBodyBytes,
		OnDone: func(ex *request.Exchange, out request.Outcome) {
			observe(m, ex, out)
			recordTraffic(g.Traffic, ex, out)
			observeKey(g.Keys, ex, out)
			accessLog(o.Logger, ex, out)
		},
		OnReject:  rejected,
		Limits:    g.limits,
		Tokens:    httpedge.TokenPolicy{Clamp: gw.TokensAdmission == config.TokensClamp, DefaultMaxTokens: gw.TokensDefaultMaxTokens},
		OnLimited: g.Keys.RateLimited,
		Stopping:  &g.stopping,
		// As a stream's client: one that reads nothing for as long as an
		// engine may stay silent is gone.
		ClientWriteTimeout: gw.IdleTimeout.Duration,
	}
	httpedge.Register(mux, edge)
	mux.Handle("/admin/v1/", adminhttp.New(adminhttp.Deps{
		Root: g.sys.Root, Admin: g.Admin, Router: g.Router, Keyring: keyring, MaxBodyBytes: gw.MaxBodyBytes,
		Traffic: g.Traffic, TrafficPeers: g.trafficPeers,
	}))
	if gw.Console {
		console.Register(mux)
	}
	if gw.Pprof {
		mux.Handle(pprofhttp.Prefix, pprofhttp.New(keyring))
	}
	mux.Handle("GET /openapi.json", openapi.Handler())
	if o.Gatherer != nil {
		metricsHandler := promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{EnableOpenMetrics: true})
		mux.Handle("GET /metrics", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			g.refreshGauges()
			metricsHandler.ServeHTTP(w, r)
		}))
	}
	running := newHandlers()
	g.http = &http.Server{
		// Every path's body is bounded, and never awaited when unread.
		Handler: running.wrap(bodyguard.Wrap(mux, bodyguard.Options{
			MaxBodyBytes: gw.MaxBodyBytes, Timeout: gw.ReadBodyTimeout.Duration,
			OnReject: rejected,
		})),
		ReadHeaderTimeout: gw.ReadHeaderTimeout.Duration,
		IdleTimeout:       gw.ServerIdleTimeout.Duration,
		TLSConfig:         serverTLS,
	}
	if g.httpLis, err = net.Listen("tcp", gw.Listen); err != nil {
		return fmt.Errorf("gateway.listen: %w", err)
	}
	addOwn(o.Logger, addrs, g.httpLis.Addr())
	g.httpLis = connlimit.Wrap(g.httpLis, connlimit.Options{
		Max: gw.MaxConnections, PerClient: gw.MaxConnectionsPerClient,
		OnRefuse: func(_ net.Addr, reason string) { m.ConnectionRefused(reason) },
	})
	// Closed here should the start fail before the server serves it
	// (closing it again once served is harmless).
	g.stops = append(g.stops, func(context.Context) error { _ = g.httpLis.Close(); return nil })

	// Engines that do not heartbeat: probed, fed to the registry alike.
	g.probes = probe.NewManager(probe.ManagerConfig{
		Root: g.sys.Root, Registry: g.Registry, MissLimit: gw.HeartbeatMissLimit, Logger: o.Logger,
		OnProbe: m.Probe, Client: probeClient,
		OnDown: func(ds []fleet.Down) { g.sys.Root.Send(g.Router, &router.SetDown{Engines: ds}) },
	})
	g.sys.Root.Send(g.Router, &router.SetConfigured{Models: configuredModels(gw.Engines, gw.Discovery)})
	g.probes.Apply(gw.Engines)
	g.stops = append(g.stops, func(context.Context) error { g.probes.Close(); return nil })
	// Engines found by [[gateway.discovery]] sources: probed alike.
	var dm *metrics.DiscoveryMetrics
	if o.Registry != nil {
		if dm, err = metrics.NewDiscoveryMetrics(o.Registry); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	finder, err := discovery.Start(gw.Discovery, g.probes, discovery.Options{Logger: o.Logger, Addresses: addrs, Metrics: dm})
	if err != nil {
		return fmt.Errorf("gateway.discovery: %w", err)
	}
	g.stops = append(g.stops, func(context.Context) error { finder.Close(); return nil })
	if err := g.startSync(&gw); err != nil {
		return fmt.Errorf("gateway.%w", err)
	}

	// The HTTP server serves last and, on Close, stops first: the requests
	// it drains still have the probes, discovery and fleet sync behind
	// them (a probed engine stops being probed only once they are done,
	// so none is forgotten while requests wait for it).
	go func() {
		var err error
		if serverTLS != nil {
			err = g.http.ServeTLS(g.httpLis, "", "")
		} else {
			err = g.http.Serve(g.httpLis)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			o.Logger.Error().Err(err).Msg("http server")
		}
	}()
	g.stops = append(g.stops, func(ctx context.Context) error {
		// Let requests in flight finish; past the deadline, cut them off,
		// and wait for their handlers (their clients are gone, so their
		// request actors answer at once) before the actors stop.
		if err := g.http.Shutdown(ctx); err != nil {
			_ = g.http.Close()
			if !running.wait(handlersCutOffWait) {
				o.Logger.Warn().Dur("waited", handlersCutOffWait).Msg("http handlers still running after the server was closed")
			}
			return fmt.Errorf("gateway: http shutdown: %w", err)
		}
		return nil
	})
	o.Logger.Info().Str("listen", g.HTTPAddr()).Str("registry_listen", g.RegistryAddr()).
		Str("route_policy", string(pol)).Str("store", gw.Store.Kind).Uint64("epoch", epoch).Int("routes", table.Len()).Msg("gateway started")
	return nil
}

// BeginShutdown is the first step of a graceful stop: /readyz answers 503
// from now on, so load balancers and Kubernetes endpoints take the gateway
// out, while every request, new ones too, is still served; each HTTP
// connection is closed after its answer, so clients reconnect elsewhere.
// Close then stops accepting and lets requests in flight finish.
func (g *Gateway) BeginShutdown() {
	if g.stopping.Swap(true) {
		return
	}
	if g.http != nil {
		g.http.SetKeepAlivesEnabled(false)
	}
}

// Stopping reports whether BeginShutdown was called.
func (g *Gateway) Stopping() bool { return g.stopping.Load() }

// Close stops everything Start started, in reverse order.
func (g *Gateway) Close(ctx context.Context) error {
	var errs []error
	for i := len(g.stops) - 1; i >= 0; i-- {
		if err := g.stops[i](ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	g.stops = nil
	return errors.Join(errs...)
}

func (g *Gateway) stopActor(pid *actor.PID) func(context.Context) error {
	return func(context.Context) error { return g.sys.Root.StopFuture(pid).Wait() }
}

// waitGroup waits for wg, or until ctx ends.
func waitGroup(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("engine calls left running: %w", ctx.Err())
	}
}

func stopGRPC(ctx context.Context, s *grpc.Server) error {
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.Stop()
		<-done
	}
	return nil
}

func keyringOf(keys []config.APIKey) (*auth.Keyring, error) {
	specs, err := keySpecs(keys)
	if err != nil {
		return nil, err
	}
	return auth.New(specs)
}

// keySpecs turns [[gateway.api_keys]] into the keyring's specs (secrets
// read from their environment variables, kept as digests only).
func keySpecs(keys []config.APIKey) ([]auth.KeySpec, error) {
	specs := make([]auth.KeySpec, 0, len(keys))
	for _, k := range keys {
		d, err := k.Digest()
		if err != nil {
			return nil, err
		}
		specs = append(specs, auth.KeySpec{Name: k.Name, SHA256: hex.EncodeToString(d[:]), Scopes: k.Scopes, IsolateCache: k.IsolatesCache(),
			Admission: auth.Admission{Priority: k.Priority, MaxPriority: k.MaxPriority,
				Objective: time.Duration(k.TTFTObjectiveMs) * time.Millisecond, ServeLate: k.ServeLate}})
	}
	return specs, nil
}

// ApplyCredentials replaces the API keys with their limits, and the
// registry and engine tokens (SIGHUP reload), for every request and
// heartbeat checked from then on; requests in flight finish under the key
// they were admitted with. Keys with unchanged limits keep their
// rate-limit windows. It refuses, changing nothing, keys or tokens that do
// not validate, no API keys left while keys are configured, and no token
// left while tokens are configured: turning authentication off is for a
// restart, which checks and warns about the listeners.
func (g *Gateway) ApplyCredentials(gw *config.Gateway) error {
	specs, err := keySpecs(gw.APIKeys)
	if err != nil {
		return fmt.Errorf("gateway.api_keys: %w", err)
	}
	token, err := gw.RegistryTokenValue()
	if err != nil {
		return err
	}
	engineTokens, err := engineTokensOf(gw.EngineTokens)
	if err != nil {
		return fmt.Errorf("gateway.engine_tokens: %w", err)
	}
	// Everything is checked before anything changes.
	if err := g.keyring.Check(specs); err != nil {
		return fmt.Errorf("gateway.api_keys: %w", err)
	}
	if err := g.rpc.CheckTokens(token, engineTokens); err != nil {
		return fmt.Errorf("gateway.registry_token, gateway.engine_tokens: %w", err)
	}
	// Limits first: a new key is never, even for a moment, unlimited.
	g.limits.SetLimits(limitsOf(gw.APIKeys))
	if err := g.keyring.Replace(specs); err != nil {
		return fmt.Errorf("gateway.api_keys: %w", err)
	}
	if err := g.rpc.SetTokens(token, engineTokens); err != nil {
		return fmt.Errorf("gateway.registry_token, gateway.engine_tokens: %w", err)
	}
	return nil
}

func loadServerTLS(cert, key string) (*tls.Config, error) {
	if cert == "" && key == "" {
		return nil, nil
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

// loadEngineTLS returns the TLS configuration for engines whose
// certificates chain to the CA in caFile, or nil when caFile is empty.
func loadEngineTLS(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	pool, err := loadCAPool("engine_ca_file", caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// loadCAPool reads the PEM certificates in file (the value of config key
// key, which errors name).
func loadCAPool(key, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: %s holds no PEM certificate", key, file)
	}
	return pool, nil
}

// accessLog writes one structured line per request; never the key itself.
func accessLog(l zerolog.Logger, ex *request.Exchange, o request.Outcome) {
	lg := o.Log
	outcome, _ := outcomeOf(o)
	ev := l.Info()
	if o.Status >= 500 || outcome == metrics.OutcomeUpstreamFailed {
		ev = l.Warn()
	}
	ev.Str("outcome", outcome)
	if lg.StreamFailure != "" {
		ev.Str("stream_failure", lg.StreamFailure)
	}
	if len(lg.Failures) == 0 && lg.LastError != "" {
		ev.Str("last_error", lg.LastError) // a committed stream's end
	}
	ev.Str("request_id", ex.RequestID)
	if ex.ClientRequestID != "" {
		ev.Str("client_request_id", ex.ClientRequestID)
	}
	ev.Str("key", ex.KeyName).Str("path", ex.Path).Str("model", ex.Req.Model).
		Str("route", lg.Route).Str("served_model", lg.ServedModel).Str("worker", lg.Worker).
		Str("reason", lg.Reason).Int("attempts", lg.Attempts).Int("status", o.Status).
		Bool("stream", ex.Req.Stream).Bool("committed", lg.Committed || ex.Committed()).
		Dur("ttfb", streamedTTFB(o)).Dur("duration", time.Since(ex.Received))
	if lg.Prefill != "" {
		ev.Str("prefill", lg.Prefill).Str("protocol", lg.Protocol).Str("prefill_reason", lg.PrefillReason).
			Str("decode_reason", lg.DecodeReason).Int("pairs", lg.Pairs).Dur("prefill_leg", lg.PrefillLeg).Dur("decode_leg", lg.DecodeLeg)
		if lg.TransferWait > 0 {
			ev.Dur("transfer_wait", lg.TransferWait)
		}
		if len(lg.LegFailures) > 0 {
			ev.Strs("leg_failures", lg.LegFailures)
		}
	}
	if lg.Priority != 0 {
		ev.Int("priority", lg.Priority)
	}
	if lg.Objective > 0 {
		ev.Dur("ttft_objective", lg.Objective).Dur("ttft", lg.TTFT)
	}
	if len(lg.Failures) > 0 {
		ev.Strs("failures", lg.Failures).Str("last_error", lg.LastError)
		if lg.Phase != "" {
			ev.Str("phase", lg.Phase)
		}
	}
	if lg.Escalations > 0 || len(lg.Skipped) > 0 {
		ev.Int("cascade_step", lg.CascadeStep).Int("escalations", lg.Escalations)
	}
	if len(lg.Skipped) > 0 {
		ev.Strs("cascade_skipped", lg.Skipped)
	}
	if lg.EscalationFailed != "" {
		ev.Str("escalation_failed", lg.EscalationFailed)
	}
	if lg.NoCapacity != "" {
		ev.Str("no_capacity", lg.NoCapacity)
	}
	if o.Code != "" {
		ev.Str("code", o.Code)
	}
	logUsage(ev, lg.Usage)
	if lg.AbandonedAttempts > 0 {
		ev.Int("abandoned_attempts", lg.AbandonedAttempts)
	}
	if sc := ex.TraceContext(); sc.IsValid() {
		ev.Str("trace_id", sc.TraceID().String()).Str("span_id", sc.SpanID().String())
	}
	ev.Msg("request")
}

// refusedLog writes the access log line of a request refused before it was
// routed (a bad body, no or a wrong key, a rate limit, an unknown model):
// the same "request" message as accessLog, with outcome "refused" and what
// is known of the request by then. Never the key itself.
func refusedLog(l zerolog.Logger, r *http.Request, status int, code string) {
	ev := l.Info().Str("outcome", "refused").Int("status", status).Str("code", code).
		Str("method", r.Method).Str("path", r.URL.Path).Str("client", clientHost(r.RemoteAddr))
	if id := httpedge.RequestIDOf(r); id != "" {
		ev.Str("request_id", id)
	}
	if id := httpedge.ClientRequestID(r); id != "" {
		ev.Str("client_request_id", id)
	}
	if key, ok := auth.FromContext(r.Context()); ok && key.Name != "" {
		ev.Str("key", key.Name)
	}
	ev.Msg("request")
}

// clientHost is the host of a remote address ("" when it has none).
func clientHost(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}

// trafficPeers are the other replicas' traffic rings (fleet sync; none
// with sync off), for the console's view of the fleet.
func (g *Gateway) trafficPeers(ctx context.Context) []traffic.Raw {
	if g.sync == nil {
		return nil
	}
	return g.sync.Traffic(ctx)
}

// ApplyEngines replaces the list of probed engines (SIGHUP reload): new
// ones are probed, removed ones forgotten, unchanged ones left alone; the
// models they name are known from then on (and the models of engines no
// longer listed only as recently served ones).
func (g *Gateway) ApplyEngines(engines []config.Engine) {
	g.sys.Root.Send(g.Router, &router.SetConfigured{Models: configuredModels(engines, g.cfg.Gateway.Discovery)})
	g.probes.Apply(engines)
}

// configuredModels are the models the configuration names outside the
// route table: those of engine entries and of discovery sources.
func configuredModels(engines []config.Engine, sources []config.Discovery) []string {
	var out []string
	for _, e := range engines {
		out = append(out, e.Model)
	}
	for _, d := range sources {
		out = append(out, d.Model)
	}
	return out
}

// Ready reports whether at least one worker is routable.
func (g *Gateway) Ready(ctx context.Context) bool {
	res, err := g.sys.Root.RequestFuture(g.Router, &router.Ready{}, 2*time.Second).Result()
	return err == nil && res.(bool)
}
