// Package enginesim is the reference engine: a real inference engine
// without a GPU that speaks every contract the gateway uses, so the gateway
// can be run, tested, demonstrated and benchmarked against it.
//
// It serves OpenAI-compatible HTTP (completions and chat completions,
// streamed and not, with logprobs; /v1/tokenize; /v1/models; /health; vLLM
// named /metrics), runs a deterministic toy model (package toymodel) with a
// reversible tokenizer (package tokenizer), keeps a prefix cache of
// 16-token KV blocks, queues requests beyond MaxRunning, and plays one of
// three roles: unified, prefill (tl.engine.v1 EngineControl.Prefill, pushing
// KV over tl.kv.v1) or decode (tl.kv.v1 KvTransferService, resuming a
// request from the X-TL-KV-Handle header). It heartbeats to gateways over
// tl.control.v1 and injects faults on demand (Faults).
//
// Start engines in process with Start; cmd/enginesim runs one as a program.
package enginesim

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/tlgate/tlgate/enginesim/kvevents"
	"github.com/tlgate/tlgate/enginesim/tokenizer"
	"github.com/tlgate/tlgate/enginesim/toymodel"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
	enginev1 "github.com/tlgate/tlgate/protos/tl/engine/v1"
	kvv1 "github.com/tlgate/tlgate/protos/tl/kv/v1"
)

// HeaderKVHandle is the HTTP header carrying a KV handle from the gateway to
// a decode engine.
const HeaderKVHandle = "X-TL-KV-Handle"

// Engine is a running reference engine.
type Engine struct {
	cfg     Config
	log     zerolog.Logger
	role    controlv1.Role
	tok     *tokenizer.Tokenizer
	model   *toymodel.Model
	hash    *hasher // the prefix cache's chained block hashes
	started time.Time
	core    *core
	kvpub   *kvevents.Publisher // nil without KV events
	latency latencyMetrics
	api     *apiServer // nil without an API server stage

	ctx    context.Context // cancelled by Close and Kill
	cancel context.CancelFunc
	wg     sync.WaitGroup // serve loops and heartbeats

	httpLis, grpcLis, kvLis, controlLis *gateListener
	bootLis                             *gateListener // SGLang's bootstrap port (prefill role)
	httpSrv, controlSrv, bootSrv        *http.Server
	bootClient                          *http.Client // joins bootstrap rooms (decode role)
	rooms                               *rooms
	blockIDs                            atomic.Uint64 // names blocks held for remote decodes
	grpcSrv, kvSrv                      *grpc.Server
	handlers                            tracker

	mu       sync.Mutex
	faults   Faults
	adapters []string // loaded LoRA adapters, sorted
	draining bool
	kvConns  map[string]*grpc.ClientConn // prefill role: decode targets
	idle     map[net.Conn]bool           // HTTP connections, true when idle
	arrivals map[string]chan struct{}    // KV awaited by requests in bootstrap rooms

	sampled atomic.Uint64 // tokens sampled so far (Stats.TokensSampled)
	stored  responseStore // Responses API responses kept (store: true)

	stopOnce sync.Once
	stopErr  error
}

// Start listens on the configured addresses and starts serving. ctx is used
// only while starting; stop the engine with Close (graceful) or Kill
// (abrupt).
func Start(ctx context.Context, cfg Config) (*Engine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("enginesim: start: %w", err)
	}
	role, _ := roleOf(cfg.Role)
	seed := cfg.WeightsSeed
	if seed == 0 {
		seed = toymodel.SeedOf(cfg.Model)
	}
	e := &Engine{
		cfg:     cfg,
		log:     cfg.Logger,
		role:    role,
		tok:     tokenizer.Default(),
		hash:    newHasher(cfg.HashSeed),
		started: time.Now(),
		core:    newCore(cfg.KVBlocks, cfg.MaxRunning, cfg.HoldTimeout),
		faults:  cfg.Faults,
		kvConns: make(map[string]*grpc.ClientConn),
		idle:    make(map[net.Conn]bool),

		arrivals:   make(map[string]chan struct{}),
		rooms:      &rooms{m: make(map[uint64]*room), timeout: cfg.RoomTimeout},
		bootClient: &http.Client{Transport: &http.Transport{}, Timeout: cfg.RoomTimeout},
	}
	e.model = toymodel.New(e.tok, seed, cfg.Confidence)
	e.core.hash = e.hash
	e.latency = newLatencyMetrics(cfg.Model)
	if cfg.Step != nil {
		e.core.sched = newStepSched(e.core, *cfg.Step, cfg.MaxRunning)
		e.core.sched.observe = e.latency.observe
		if !cfg.Step.APIServer.zero() {
			e.api = newAPIServer(cfg.Step.APIServer, e.core.sched.clock)
		}
	}
	e.adapters = slices.Compact(slices.Sorted(slices.Values(cfg.Adapters)))
	e.ctx, e.cancel = context.WithCancel(context.Background())
	if err := e.listen(); err != nil {
		e.closeListeners()
		e.cancel()
		return nil, err
	}
	if e.cfg.ID == "" {
		e.cfg.ID = "enginesim-" + strconv.Itoa(e.httpLis.Addr().(*net.TCPAddr).Port)
	}
	e.log = e.log.With().Str("engine", e.cfg.ID).Logger()
	e.core.onExpire = func(id string) {
		e.log.Info().Str("handle", id).Msg("KV hold timed out; blocks freed")
		e.hook(func(h *hooks) chan struct{} { return h.expired })
	}
	e.core.onQueued = func() { e.hook(func(h *hooks) chan struct{} { return h.queued }) }
	if cfg.KVEvents.Endpoint != "" {
		kc := cfg.KVEvents
		kc.Logger = e.log
		if e.kvpub, err = kvevents.Start(kc); err != nil {
			e.closeListeners()
			e.cancel()
			return nil, fmt.Errorf("enginesim: KV events: %w", err)
		}
		e.core.publish = e.kvpub.Publish
		e.kvpub.SetFaults(cfg.Faults.kvEvents())
	}
	if sched := e.core.sched; sched != nil {
		e.wg.Go(func() { sched.loop(e.ctx) })
		if e.api != nil {
			e.wg.Go(func() { e.api.run(e.ctx) })
		}
	}
	e.serve()
	if cfg.Faults.Refuse {
		e.applyRefuse(true)
	}
	for _, g := range cfg.Gateways {
		e.wg.Go(func() { e.gatewayLoop(g) })
	}
	e.log.Info().Str("model", cfg.Model).Str("role", cfg.Role).
		Str("http", e.HTTPAddr()).Str("grpc", e.GRPCAddr()).Str("kv", e.KVAddr()).
		Str("control", e.ControlAddr()).Int("kv_blocks", cfg.KVBlocks).
		Float64("confidence", e.model.Confidence()).Msg("engine started")
	return e, nil
}

func (e *Engine) listen() error {
	var err error
	if e.httpLis, err = listen(e.cfg.HTTPAddr); err != nil {
		return err
	}
	if e.cfg.Role == RolePrefill {
		if e.grpcLis, err = listen(e.cfg.GRPCAddr); err != nil {
			return err
		}
	}
	if e.cfg.Role == RoleDecode {
		if e.kvLis, err = listen(e.cfg.KVAddr); err != nil {
			return err
		}
	}
	if e.cfg.ControlAddr != "" {
		if e.controlLis, err = listen(e.cfg.ControlAddr); err != nil {
			return err
		}
	}
	if e.cfg.BootstrapAddr != "" {
		if e.bootLis, err = listen(e.cfg.BootstrapAddr); err != nil {
			return err
		}
	}
	return nil
}

func (e *Engine) closeListeners() {
	for _, l := range []*gateListener{e.httpLis, e.grpcLis, e.kvLis, e.controlLis, e.bootLis} {
		if l != nil {
			l.Close()
		}
	}
}

// serve starts the servers on the listeners.
func (e *Engine) serve() {
	errLog := log.New(logWriter{e.log}, "", 0)
	e.httpSrv = &http.Server{
		Handler:           e.httpHandler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return e.ctx },
		ConnState:         e.connState,
		ErrorLog:          errLog,
	}
	e.wg.Go(func() { e.httpSrv.Serve(e.httpLis) })
	// A side server: the control plane, SGLang's bootstrap.
	side := func(h http.Handler, lis *gateListener) *http.Server {
		srv := &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			BaseContext:       func(net.Listener) context.Context { return e.ctx },
			ErrorLog:          errLog,
		}
		e.wg.Go(func() { srv.Serve(lis) })
		return srv
	}
	if e.controlLis != nil {
		e.controlSrv = side(e.controlHandler(), e.controlLis)
	}
	if e.bootLis != nil {
		e.bootSrv = side(e.bootstrapHandler(), e.bootLis)
	}
	if e.grpcLis != nil {
		e.grpcSrv = grpc.NewServer(append(e.grpcTracing(), grpc.WaitForHandlers(true))...)
		enginev1.RegisterEngineControlServer(e.grpcSrv, &controlServer{e: e})
		// Pull, for decode engines reading KV held for them (vLLM's
		// NixlConnector stand-in).
		kvv1.RegisterKvTransferServiceServer(e.grpcSrv, &kvServer{e: e})
		e.wg.Go(func() { e.grpcSrv.Serve(e.grpcLis) })
	}
	if e.kvLis != nil {
		e.kvSrv = grpc.NewServer(append(e.grpcTracing(), grpc.WaitForHandlers(true))...)
		kvv1.RegisterKvTransferServiceServer(e.kvSrv, &kvServer{e: e})
		e.wg.Go(func() { e.kvSrv.Serve(e.kvLis) })
	}
}

// ID returns the worker id.
func (e *Engine) ID() string { return e.cfg.ID }

// Model returns the served model id.
func (e *Engine) Model() string { return e.cfg.Model }

// Role returns "unified", "prefill" or "decode".
func (e *Engine) Role() string { return e.cfg.Role }

// HTTPAddr returns the HTTP host:port.
func (e *Engine) HTTPAddr() string { return addrOf(e.httpLis) }

// GRPCAddr returns the EngineControl host:port ("" unless prefill).
func (e *Engine) GRPCAddr() string { return addrOf(e.grpcLis) }

// KVAddr returns the KvTransferService host:port ("" unless decode).
func (e *Engine) KVAddr() string { return addrOf(e.kvLis) }

// ControlAddr returns the /sim control host:port ("" unless configured).
func (e *Engine) ControlAddr() string { return addrOf(e.controlLis) }

// KVEventsAddr returns the KV events PUB endpoint, e.g.
// "tcp://127.0.0.1:5557" ("" without KV events).
func (e *Engine) KVEventsAddr() string {
	if e.kvpub == nil {
		return ""
	}
	return e.kvpub.Addr()
}

// KVEventsPublisher returns the engine's KV events publisher (nil
// without KV events), for tests and drills to inject its faults.
func (e *Engine) KVEventsPublisher() *kvevents.Publisher { return e.kvpub }

// KVEventsReplayAddr returns the KV events replay endpoint ("" without
// one).
func (e *Engine) KVEventsReplayAddr() string {
	if e.kvpub == nil {
		return ""
	}
	return e.kvpub.ReplayAddr()
}

// BootstrapAddr returns SGLang's bootstrap host:port ("" without one).
func (e *Engine) BootstrapAddr() string { return addrOf(e.bootLis) }

// URL returns the HTTP base URL, e.g. "http://127.0.0.1:8000".
func (e *Engine) URL() string { return "http://" + e.HTTPAddr() }

func addrOf(l *gateListener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// advertised returns addr with an unspecified host replaced by
// AdvertiseHost.
func (e *Engine) advertised(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || addr == "" {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = e.cfg.AdvertiseHost
	}
	return net.JoinHostPort(host, port)
}

// Faults returns the faults injected now.
func (e *Engine) Faults() Faults {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.faults
}

// SetFaults replaces the injected faults. Turning Refuse off listens again
// on the same ports, which fails if another process took a port meanwhile.
func (e *Engine) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	e.mu.Lock()
	was, restarted := e.faults.Refuse, e.faults.KVEventsRestartSeq
	e.faults = f
	e.mu.Unlock()
	e.log.Info().Interface("faults", f).Msg("faults set")
	if e.kvpub != nil {
		e.kvpub.SetFaults(f.kvEvents())
		if f.KVEventsRestartSeq && !restarted {
			e.kvpub.RestartSequence()
		}
	}
	if f.Refuse == was {
		return nil
	}
	return e.applyRefuse(f.Refuse)
}

// applyRefuse closes or reopens the listeners (the control listener stays).
func (e *Engine) applyRefuse(on bool) error {
	var errs []error
	for _, l := range []*gateListener{e.httpLis, e.grpcLis, e.kvLis} {
		if l == nil {
			continue
		}
		if on {
			l.refuse()
		} else {
			errs = append(errs, l.reopen())
		}
	}
	if on {
		// gRPC multiplexes on one connection: close them all, or clients
		// would never notice. Idle HTTP connections close too.
		for _, l := range []*gateListener{e.grpcLis, e.kvLis} {
			if l != nil {
				l.closeConns()
			}
		}
		e.closeIdleHTTP()
	}
	return errors.Join(errs...)
}

// connState tracks idle HTTP connections, closing them while refusing.
func (e *Engine) connState(c net.Conn, s http.ConnState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch s {
	case http.StateHijacked, http.StateClosed:
		delete(e.idle, c)
	case http.StateIdle:
		if e.faults.Refuse {
			c.Close()
			delete(e.idle, c)
			return
		}
		e.idle[c] = true
	default:
		e.idle[c] = false
	}
}

func (e *Engine) closeIdleHTTP() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for c, idle := range e.idle {
		if idle {
			c.Close()
			delete(e.idle, c)
		}
	}
}

// SetDraining sets or clears draining: a draining engine answers 503 to new
// inference requests (and Unavailable to Prefill and Push), finishes those
// in flight, and reports draining in its heartbeats. A HeartbeatAck with
// drain sets it, and a later ack from the same gateway without drain (the
// model was resumed) clears it again.
func (e *Engine) SetDraining(on bool) {
	e.mu.Lock()
	changed := e.draining != on
	e.draining = on
	e.mu.Unlock()
	if changed {
		e.log.Info().Bool("draining", on).Msg("draining changed")
	}
}

// Draining reports whether the engine is draining.
func (e *Engine) Draining() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.draining
}

// Stats are an engine's figures: gauges now and counters since start.
type Stats struct {
	// Requests counts HTTP inference requests received (completions and
	// chat completions, whatever their outcome; not those refused).
	Requests uint64
	// Completed counts inference requests answered in full; Aborted those
	// cut off by a client going away, an error after admission, or the Die
	// fault.
	Completed, Aborted uint64
	// Waiting and Running are the queue depth and the running sequences
	// (inference requests and Prefill calls).
	Waiting, Running int
	// WaitingForKV are the requests of a decode engine waiting for their
	// prompt's KV from a prefill engine (vLLM's WAITING_FOR_REMOTE_KVS:
	// pulling it, or in an SGLang bootstrap room).
	WaitingForKV int
	// Steps counts the step scheduler's steps; Preemptions the sequences
	// it preempted (recomputed) when KV blocks ran out.
	Steps, Preemptions uint64
	// HeldHandles and HeldBlocks are the KV handles pushed and not yet
	// resumed, released or expired, and their blocks.
	HeldHandles, HeldBlocks int
	// FreeBlocks are the KV blocks not referenced by a sequence or handle
	// (idle cached blocks count as free); TotalBlocks is KVBlocks.
	FreeBlocks, TotalBlocks int
	// PrefixQueries and PrefixHits count prompt tokens looked up in the
	// prefix cache and found there (vLLM's prefix_cache_queries/hits).
	PrefixQueries, PrefixHits uint64
	// PromptTokens and GenerationTokens count tokens of finished and
	// aborted requests.
	PromptTokens, GenerationTokens uint64
	// Prefills counts Prefill calls answered; Pushes KV pushes accepted
	// (decode); Releases Release calls received, HandlesReleased those that
	// freed a handle, HandlesExpired handles freed by the hold timeout.
	Prefills, Pushes, Releases, HandlesReleased, HandlesExpired uint64
	// HeartbeatsSent, HeartbeatsFailed and HeartbeatsSkipped count
	// heartbeats acknowledged, failed, and skipped by the NoHeartbeat fault.
	HeartbeatsSent, HeartbeatsFailed, HeartbeatsSkipped uint64
	// Draining reports draining.
	Draining bool
	// Resumes counts requests that resumed a pushed KV handle;
	// ResumesUnseeded those refused because their body had no seed (a real
	// engine would sample them with a seed of its own, not the prefill's);
	// LastResumeSeed is the seed the body of the last resume carried.
	Resumes, ResumesUnseeded, LastResumeSeed uint64
	// BusySlotTime is the running sequences integrated over time
	// (slot-seconds); StalledSlotTime the free running slots integrated
	// over the time sequences waited anyway, the head of the queue not
	// fitting the free KV blocks. The change of either over a span of time,
	// divided by the span, is a mean number of slots.
	BusySlotTime, StalledSlotTime time.Duration
	// TokensSampled counts the tokens sampled so far, by requests finished
	// or still running: tests wait on progress, not on a guess of how fast
	// the machine is.
	TokensSampled uint64
}

// Stats returns the engine's figures.
func (e *Engine) Stats() Stats {
	draining := e.Draining()
	c := e.core
	c.mu.Lock()
	defer c.mu.Unlock()
	c.settleLocked()
	k := c.counters
	waiting, running := c.waiting.Len(), c.running
	var steps, preemptions uint64
	if s := c.sched; s != nil {
		waiting, running = len(s.waiting), len(s.running)
		steps, preemptions = s.steps, s.preemptions
	}
	return Stats{
		Requests: k.requests, Completed: k.completed, Aborted: k.aborted,
		Waiting: waiting, Running: running, WaitingForKV: c.awaitingKV, Steps: steps, Preemptions: preemptions,
		HeldHandles: len(c.handles), HeldBlocks: c.heldBlocks,
		FreeBlocks: c.pool.total - c.pool.referenced(), TotalBlocks: c.pool.total,
		PrefixQueries: k.prefixQueries, PrefixHits: k.prefixHits,
		PromptTokens: k.promptTokens, GenerationTokens: k.generationTokens,
		Prefills: k.prefills, Pushes: k.pushes, Releases: k.releases,
		HandlesReleased: k.handlesReleased, HandlesExpired: k.handlesExpired,
		HeartbeatsSent: k.heartbeatsSent, HeartbeatsFailed: k.heartbeatsFailed,
		HeartbeatsSkipped: k.heartbeatsSkipped,
		Draining:          draining,
		Resumes:           k.resumes, ResumesUnseeded: k.resumesUnseeded, LastResumeSeed: k.lastResumeSeed,
		BusySlotTime: c.slots.busy, StalledSlotTime: c.slots.stalled,
		TokensSampled: e.sampled.Load(),
	}
}

// Status returns the WorkerStatus the engine heartbeats.
func (e *Engine) Status() *controlv1.WorkerStatus {
	s := e.Stats()
	return &controlv1.WorkerStatus{
		WorkerId:        e.cfg.ID,
		HttpAddress:     e.advertised(e.HTTPAddr()),
		GrpcAddress:     e.advertised(e.GRPCAddr()),
		KvAddress:       e.advertised(e.KVAddr()),
		Role:            e.role,
		Model:           e.cfg.Model,
		KvFormat:        e.cfg.KVFormat,
		QueueDepth:      uint32(s.Waiting),
		Running:         uint32(s.Running),
		KvFreeBlocks:    uint32(s.FreeBlocks),
		KvTotalBlocks:   uint32(s.TotalBlocks),
		Draining:        s.Draining,
		KvBlockTokens:   BlockTokens,
		StartedAtUnixMs: uint64(e.started.UnixMilli()),
		LoraAdapters:    e.Adapters(),
		KvEvents:        e.kvEventsStatus(),
	}
}

// kvEventsStatus is where the engine's KV events are, as its heartbeats
// tell the gateway (nil without KV events, or when the PUB socket
// connects to a subscriber rather than binding).
func (e *Engine) kvEventsStatus() *controlv1.KvEvents {
	if e.kvpub == nil || e.cfg.KVEvents.Connect {
		return nil
	}
	tcp := func(ep string) string {
		if hp, ok := strings.CutPrefix(ep, "tcp://"); ok {
			return "tcp://" + e.advertised(hp)
		}
		return ep
	}
	return &controlv1.KvEvents{Endpoint: tcp(e.kvpub.Addr()), ReplayEndpoint: tcp(e.kvpub.ReplayAddr()), Topic: e.kvpub.Topic()}
}

// Kill stops the engine abruptly, like a process death: every listener and
// every open connection closes at once and in-flight work is cancelled. It
// returns when the engine's goroutines have ended.
func (e *Engine) Kill() {
	e.stop(true)
}

// Close stops the engine gracefully: it stops heartbeating and accepting,
// lets in-flight requests finish (up to ShutdownTimeout, then cuts them
// off), frees held KV and returns when its goroutines have ended.
func (e *Engine) Close() error {
	return e.stop(false)
}

func (e *Engine) stop(abrupt bool) error {
	e.stopOnce.Do(func() {
		if abrupt {
			e.log.Warn().Msg("engine killed")
		} else {
			e.log.Info().Msg("engine closing")
			e.SetDraining(true)
		}
		var errs []error
		e.closeListeners()
		if abrupt {
			errs = append(errs, e.closeHTTP(context.Background(), false))
			e.stopGRPC(false)
			e.cancel()
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), e.cfg.ShutdownTimeout)
			errs = append(errs, e.closeHTTP(ctx, true))
			e.stopGRPC(true)
			cancel()
			e.cancel()
		}
		e.handlers.wait()
		if e.core.sched != nil {
			e.core.sched.close()
		}
		e.core.close()
		e.wg.Wait()
		if e.kvpub != nil {
			errs = append(errs, e.kvpub.Close())
		}
		e.bootClient.CloseIdleConnections()
		e.mu.Lock()
		for addr, c := range e.kvConns {
			errs = append(errs, c.Close())
			delete(e.kvConns, addr)
		}
		e.mu.Unlock()
		e.stopErr = errors.Join(errs...)
		if e.stopErr != nil {
			e.stopErr = fmt.Errorf("enginesim: stop: %w", e.stopErr)
		}
		e.log.Info().Msg("engine stopped")
	})
	return e.stopErr
}

// closeHTTP shuts the HTTP servers down, gracefully within ctx or at once.
func (e *Engine) closeHTTP(ctx context.Context, graceful bool) error {
	var errs []error
	for _, s := range []*http.Server{e.httpSrv, e.controlSrv, e.bootSrv} {
		if s == nil {
			continue
		}
		if graceful {
			if err := s.Shutdown(ctx); err == nil {
				continue
			}
			e.log.Warn().Msg("in-flight HTTP requests cut off at shutdown timeout")
		}
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// stopGRPC stops the gRPC servers, gracefully (bounded by
// ShutdownTimeout) or at once.
func (e *Engine) stopGRPC(graceful bool) {
	for _, s := range []*grpc.Server{e.grpcSrv, e.kvSrv} {
		if s == nil {
			continue
		}
		if !graceful {
			s.Stop()
			continue
		}
		done := make(chan struct{})
		go func() {
			s.GracefulStop()
			close(done)
		}()
		t := time.NewTimer(e.cfg.ShutdownTimeout)
		select {
		case <-done:
		case <-t.C:
			s.Stop()
			<-done
		}
		t.Stop()
	}
}

// tracker counts running HTTP handlers so Kill and Close can wait for them.
type tracker struct {
	mu     sync.Mutex
	n      int
	closed bool
	zero   chan struct{}
}

// enter registers a handler; false once waiting has begun.
func (t *tracker) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.n++
	return true
}

func (t *tracker) exit() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 && t.zero != nil {
		close(t.zero)
		t.zero = nil
	}
}

// wait refuses new handlers and waits for the running ones.
func (t *tracker) wait() {
	t.mu.Lock()
	t.closed = true
	if t.n == 0 {
		t.mu.Unlock()
		return
	}
	zero := make(chan struct{})
	t.zero = zero
	t.mu.Unlock()
	<-zero
}

// logWriter adapts zerolog to the standard logger net/http uses.
type logWriter struct{ log zerolog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Warn().Str("source", "net/http").Msg(string(p))
	return len(p), nil
}
