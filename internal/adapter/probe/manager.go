package probe

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// RegistryTimeout bounds the Manager's wait for the registry actor to answer
// one Heartbeat or Forget.
const RegistryTimeout = 2 * time.Second

// ErrRegistryAnswer: the registry actor answered with something other than
// what the message asks for.
var ErrRegistryAnswer = errors.New("unexpected registry answer")

// ManagerConfig is what a Manager needs.
type ManagerConfig struct {
	// Root sends to the registry actor (required).
	Root *actor.RootContext
	// Registry is the registry actor (actors/registry; required).
	Registry *actor.PID
	// MissLimit is heartbeat_miss_limit (k): a live engine stops being live
	// after k consecutive failed probes. Below 1 means DefaultFall.
	MissLimit int
	// Client makes the probes' HTTP requests; nil means http.DefaultClient.
	Client *http.Client
	// Logger receives transitions (live, not live) and registry errors.
	Logger zerolog.Logger
	// OnProbe, if set, is called after every probe with whether it
	// succeeded (a status that fails fleet.Validate counts as a failure).
	// It is called from the probe loops, concurrently for different
	// engines, and must not block for long.
	OnProbe func(id string, ok bool)
	// OnDown, if set, is given every engine that is down (not live, its
	// last probe failed), sorted by id, each time that set or an engine's
	// error changes. Calls never overlap and come in order; it must not
	// block.
	OnDown func(down []fleet.Down)
}

// Manager runs one probe loop per configured engine and feeds the registry
// actor the way an engine's own heartbeats would, so that a probed engine is
// a worker like any other (policies, routable view, drains, admin listing,
// eviction).
//
// Each loop probes its engine at once and then every ProbeInterval, and
// feeds the outcome to a Tracker with Rise DefaultRise (2) and Fall
// MissLimit (k). While the Tracker says live, every probe sends the
// registry a Heartbeat (Source fleet.SourceProbe, Kind the engine's kind,
// Arrived the probe's end): a good probe sends the status it read; a failed
// one, which the Tracker tolerates, repeats the last good status, so the
// worker keeps its place and its last known load. The probe that makes the
// Tracker say not live (the k-th consecutive failure) sends registry.Forget
// instead, and the worker is gone from that moment. While not live, nothing
// is sent.
//
// With P the engine's probe interval, T the registry's heartbeat interval
// and t0 the last probe sent while live, the registry's own deadline is
// t0 + k·T, and the next probe ends about P (plus its duration, at most
// DefaultTimeout, 1.5 s more for SGLang) later. So:
//
//   - an engine becomes routable with the heartbeat of its 2nd consecutive
//     good probe, about P after its first;
//   - while P (plus a probe's duration) stays below k·T, the Manager alone
//     decides: a single failed probe (fewer than k in a row) never removes
//     the worker, and the k-th consecutive failure removes it at once, about
//     k·P after the last good probe, whether P is shorter or longer than T;
//   - if probes stop altogether (a probe hangs, the process stalls), the
//     registry evicts the worker at t0 + k·T as it would a silent engine;
//   - with P at or above k·T the registry evicts the worker between any two
//     probes and the next probe registers it again: such a configuration
//     flaps, and the Manager logs a warning once per loop when the first
//     heartbeat ack tells it T.
//
// A probed worker's last_heartbeat is therefore the end of its last probe
// while live, good or tolerated, and its figures are those of its last good
// probe.
type Manager struct {
	cfg  ManagerConfig
	fall int

	mu      sync.Mutex
	loops   map[string]*loop
	static  []config.Engine
	sources map[string][]Engine // discovered engines by source name
	dups    map[string]bool     // ids whose duplicate was logged
	shared  map[string]bool     // addresses whose sharing by several ids was logged
	closed  bool
	// retiring are loops stopped by a reconcile and not known to have
	// ended, by id: a new loop of the same id waits for its predecessor.
	retiring map[string]*loop

	// downMu orders the OnDown calls; down is what they report.
	downMu sync.Mutex
	down   map[string]fleet.Down
}

// Engine is an engine to probe with what a discovery source knows of it
// beyond a configured engine's keys.
type Engine struct {
	config.Engine
	// Role is the role its heartbeats carry (unspecified means unified).
	Role controlv1.Role
	// Draining makes its heartbeats say draining: it is routed nothing
	// new while requests in flight on it finish.
	Draining bool
}

// NewManager returns a Manager with no engines; Apply gives it some.
func NewManager(cfg ManagerConfig) *Manager {
	fall := cfg.MissLimit
	if fall < 1 {
		fall = DefaultFall
	}
	return &Manager{cfg: cfg, fall: fall, loops: map[string]*loop{}, sources: map[string][]Engine{}, dups: map[string]bool{},
		shared: map[string]bool{}, retiring: map[string]*loop{}, down: map[string]fleet.Down{}}
}

// target is what a loop probes and how often; two engines with equal
// targets are probed alike.
type target struct {
	probe    Config
	interval time.Duration
	role     controlv1.Role
	// bootstrapPort is an SGLang prefill engine's bootstrap port.
	bootstrapPort int
}

// targetOf resolves a configured engine: its kind, its Authorization header
// (reading auth_header_env now) and its interval (DefaultProbeInterval when
// zero).
func (m *Manager) targetOf(e Engine) (target, error) {
	kind, err := ParseKind(e.Kind)
	if err != nil {
		return target{}, err
	}
	auth, err := e.Authorization()
	if err != nil {
		return target{}, fmt.Errorf("probe: %w", err)
	}
	interval := e.ProbeInterval.Duration
	if interval == 0 {
		interval = config.DefaultProbeInterval
	}
	if interval < 0 {
		return target{}, fmt.Errorf("probe: %w: probe interval %v is negative", ErrInvalidConfig, interval)
	}
	pc := Config{ID: e.ID, HTTPAddress: e.HTTPAddress, Model: e.Model, Kind: kind, AuthHeader: auth, Client: m.cfg.Client,
		KVEvents: fleet.KVEvents{Endpoint: e.KVEvents, Replay: e.KVEventsReplay, Topic: e.KVEventsTopic}}
	if err := pc.Validate(); err != nil {
		return target{}, err
	}
	role := e.Role
	if role == controlv1.Role_ROLE_UNSPECIFIED && e.Engine.Role != "" {
		role = RoleOf(e.Engine.Role)
	}
	return target{probe: pc, interval: interval, role: role, bootstrapPort: e.BootstrapPort}, nil
}

// RoleOf maps a configured role (unified, prefill, decode; empty is
// unified) to the contract's; anything else is unified.
func RoleOf(role string) controlv1.Role {
	switch role {
	case config.RolePrefill:
		return controlv1.Role_ROLE_PREFILL
	case config.RoleDecode:
		return controlv1.Role_ROLE_DECODE
	}
	return controlv1.Role_ROLE_UNIFIED
}

// Apply makes the running loops match the configured engines and the
// discovered ones (SetSource): it starts a loop for each new engine, stops
// the loop of each engine no longer listed and forgets its worker, and
// restarts the loop of each engine whose probe changed (address, model,
// kind, role, Authorization header or interval), leaving every other loop
// alone. A restart whose only change is the interval keeps the engine's
// liveness and its worker; any other change forgets the worker first, so
// nothing is routed to the old address or model, and the engine is routable
// again after two good probes. A change of Draining alone only changes what
// the next heartbeats say. Apply returns once every stopped loop has ended
// and every worker to forget is forgotten; it waits for them without
// holding the Manager's lock, so a loop's last registry call, which may
// take RegistryTimeout, never holds up another Apply or SetSource.
//
// An engine that cannot be probed (unknown kind, invalid id or address,
// unset auth_header_env) is logged and treated as not listed; of engines
// sharing an id, a configured one wins over a discovered one, and among
// those the first (sources in name order). Two ids at one address are
// logged (one engine registered twice takes twice its share). Apply is
// safe to call again (on SIGHUP) and from several goroutines; after Close
// it does nothing.
func (m *Manager) Apply(engines []config.Engine) {
	m.mu.Lock()
	m.static = slices.Clone(engines)
	stopped := m.reconcile()
	m.mu.Unlock()
	waitLoops(stopped)
}

// SetSource replaces the engines discovery source name found (none removes
// the source's engines) and reconciles the loops as Apply does.
func (m *Manager) SetSource(name string, engines []Engine) {
	m.mu.Lock()
	if len(engines) == 0 {
		delete(m.sources, name)
	} else {
		m.sources[name] = slices.Clone(engines)
	}
	stopped := m.reconcile()
	m.mu.Unlock()
	waitLoops(stopped)
}

// waitLoops waits for each of ls to end.
func waitLoops(ls []*loop) {
	for _, l := range ls {
		<-l.done
	}
}

// reconcile makes the loops match m.static and m.sources and returns the
// loops it stopped, which end (forgetting their worker, when they must)
// by themselves; m.mu is held.
func (m *Manager) reconcile() []*loop {
	if m.closed {
		return nil
	}
	all := make([]Engine, 0, len(m.static))
	for _, e := range m.static {
		all = append(all, Engine{Engine: e})
	}
	for _, name := range slices.Sorted(maps.Keys(m.sources)) {
		all = append(all, m.sources[name]...)
	}
	want := make(map[string]target, len(all))
	draining := make(map[string]bool, len(all))
	order := make([]string, 0, len(all))
	dups := map[string]bool{}
	for _, e := range all {
		if _, dup := want[e.ID]; dup {
			dups[e.ID] = true
			if !m.dups[e.ID] {
				m.cfg.Logger.Error().Str("engine", e.ID).Msg("probe: duplicate engine id ignored")
			}
			continue
		}
		t, err := m.targetOf(e)
		if err != nil {
			m.cfg.Logger.Error().Err(err).Str("engine", e.ID).Msg("probe: engine not probed")
			continue
		}
		want[e.ID] = t
		draining[e.ID] = e.Draining
		order = append(order, e.ID)
	}
	m.dups = dups
	m.warnShared(want, order)
	for id, l := range m.retiring {
		select {
		case <-l.done:
			delete(m.retiring, id)
		default:
		}
	}

	var stopped []*loop
	retire := func(l *loop, why string) {
		l.why = why
		l.cancel()
		m.retiring[l.target.probe.ID] = l
		stopped = append(stopped, l)
	}
	for id, l := range m.loops {
		if _, ok := want[id]; !ok {
			retire(l, "removed from the configuration or discovery")
			delete(m.loops, id)
		}
	}
	for _, id := range order {
		t := want[id]
		old, running := m.loops[id]
		var l *loop
		switch {
		case running && old.target == t:
			l = old
		case running && old.target.probe == t.probe && old.target.role == t.role && old.target.bootstrapPort == t.bootstrapPort:
			retire(old, "")
			l = m.start(t, old, true)
			m.cfg.Logger.Info().Str("engine", id).Dur("interval", t.interval).Msg("probe: interval changed")
		case running:
			retire(old, "configuration changed")
			l = m.start(t, old, false)
		default:
			l = m.start(t, m.retiring[id], false)
		}
		m.loops[id] = l
		if l.draining.Swap(draining[id]) != draining[id] {
			m.cfg.Logger.Info().Str("engine", id).Bool("draining", draining[id]).Msg("probe: engine drain changed by discovery")
		}
	}
	return stopped
}

// warnShared logs, once per address, engines of several ids probed at one
// address: one engine registered twice takes twice its share of the
// traffic, and its figures count twice.
func (m *Manager) warnShared(want map[string]target, order []string) {
	byAddr := map[string][]string{}
	for _, id := range order {
		a := want[id].probe.HTTPAddress
		byAddr[a] = append(byAddr[a], id)
	}
	shared := map[string]bool{}
	for a, ids := range byAddr {
		if len(ids) < 2 {
			continue
		}
		shared[a] = true
		if !m.shared[a] {
			m.cfg.Logger.Warn().Str("http_address", a).Strs("engines", ids).
				Msg("probe: several engine ids at one address: the engine is registered once per id and takes a share per id")
		}
	}
	m.shared = shared
}

// Close stops every loop and waits for them to end; an engine's worker is
// left to the registry (the gateway is shutting down). Apply does nothing
// after Close. Close is idempotent.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	stopped := make([]*loop, 0, len(m.loops)+len(m.retiring))
	for id, l := range m.loops {
		l.cancel()
		stopped = append(stopped, l)
		delete(m.loops, id)
	}
	for _, l := range m.retiring {
		stopped = append(stopped, l)
	}
	m.mu.Unlock()
	waitLoops(stopped)
}

// start runs a loop for t. It first waits for prev (the loop of the same
// id it replaces, or nil) to end, and resumes from its tracker and last
// good status when keep is set.
func (m *Manager) start(t target, prev *loop, keep bool) *loop {
	ctx, cancel := context.WithCancel(context.Background())
	l := &loop{
		m:      m,
		target: t,
		prober: New(t.probe),
		log:    m.cfg.Logger.With().Str("engine", t.probe.ID).Str("kind", string(t.probe.Kind)).Logger(),
		cancel: cancel,
		done:   make(chan struct{}),
		prev:   prev,
		keep:   keep,
	}
	go l.run(ctx)
	return l
}

// forget tells the registry to drop worker id at once.
func (m *Manager) forget(id, why string) {
	res, err := m.cfg.Root.RequestFuture(m.cfg.Registry, &registry.Forget{ID: id}, RegistryTimeout).Result()
	if err != nil {
		m.cfg.Logger.Warn().Err(err).Str("engine", id).Msg("probe: registry did not answer Forget")
		return
	}
	if known, _ := res.(bool); known {
		m.cfg.Logger.Info().Str("engine", id).Str("reason", why).Msg("probe: worker removed")
	}
}

// loop probes one engine until its context ends. tracker and last belong to
// the loop's goroutine until done is closed, then to whoever stopped it.
type loop struct {
	m      *Manager
	target target
	prober *Prober
	log    zerolog.Logger
	cancel context.CancelFunc
	// done is closed once the loop ended and, when why is set, its worker
	// was forgotten.
	done chan struct{}
	// prev is the loop of the same id this one replaces, whose end it
	// waits for before its first probe; keep: resume from prev's tracker
	// and last good status. Both are set before the loop starts.
	prev *loop
	keep bool
	// why, set (under Manager.mu) before the loop is stopped, is the reason
	// its worker is forgotten when it ends; empty leaves the worker.
	why string

	tracker Tracker
	last    *controlv1.WorkerStatus // the last good status, nil before one
	warned  bool                    // the interval warning was logged
	// skipped are the adapters the last good probe left out (id → reason),
	// each logged when it first appeared.
	skipped map[string]string

	// draining is what the heartbeats say of draining (set by discovery).
	draining atomic.Bool
}

func (l *loop) run(ctx context.Context) {
	defer close(l.done)
	defer l.retire()
	if p := l.prev; p != nil {
		<-p.done
		if l.keep {
			l.tracker, l.last = p.tracker, p.last
		}
		l.prev = nil
	}
	l.tracker.Rise, l.tracker.Fall = DefaultRise, l.m.fall
	tick := time.NewTicker(l.target.interval)
	defer tick.Stop()
	for ctx.Err() == nil {
		l.once(ctx)
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// retire runs when the loop ends: its worker is forgotten when it must be,
// and it is no longer reported down (a loop that replaces it reports
// afresh).
func (l *loop) retire() {
	if l.why != "" {
		l.m.forget(l.target.probe.ID, l.why)
		l.m.setDown(l.target.probe.ID, nil)
	}
}

// once runs one probe and tells the registry what it means.
func (l *loop) once(ctx context.Context) {
	res, err := l.prober.ProbeDetail(ctx)
	if ctx.Err() != nil {
		return // stopped: the outcome says nothing about the engine
	}
	if err == nil {
		if verr := fleet.Validate(res.Status); verr != nil {
			err = fmt.Errorf("probe %s: status rejected: %w", l.target.probe.ID, verr)
		}
	}
	ok := err == nil
	if l.m.cfg.OnProbe != nil {
		l.m.cfg.OnProbe(l.target.probe.ID, ok)
	}
	if ok {
		l.last = res.Status
		l.noteSkipped(res.SkippedAdapters)
		if res.MetricsErr != nil {
			l.log.Debug().Err(res.MetricsErr).Msg("probe: metrics unusable, fallback figures")
		}
	} else {
		l.log.Debug().Err(err).Msg("probe: failed")
	}
	live, changed := l.tracker.Observe(ok)
	if errors.Is(err, ErrModelNotServed) && live {
		// Not a passing failure: every request would be the engine's 404.
		l.tracker = Tracker{Rise: l.tracker.Rise, Fall: l.tracker.Fall}
		live, changed = false, true
	}
	switch {
	case live && l.last != nil:
		if changed {
			l.log.Info().Str("model", l.last.GetModel()).Msg("probe: engine live")
		}
		l.m.setDown(l.target.probe.ID, nil)
		l.heartbeat(l.last)
	case changed:
		l.log.Warn().Err(err).Int("failures", l.m.fall).Msg("probe: engine not live")
		l.m.forget(l.target.probe.ID, "probes failed")
		l.markDown(err, false)
	case !live && !ok:
		l.markDown(err, true)
	}
}

// noteSkipped logs the adapters a good probe left out that the previous
// good probe did not (one line per reason), so that a skip is logged once
// however many probes repeat it, and again if it goes and comes back.
func (l *loop) noteSkipped(skipped []SkippedAdapter) {
	if len(skipped) == 0 && len(l.skipped) == 0 {
		return
	}
	now := make(map[string]string, len(skipped))
	fresh := map[string][]string{}
	for _, s := range skipped {
		now[s.ID] = s.Reason
		if l.skipped[s.ID] != s.Reason {
			fresh[s.Reason] = append(fresh[s.Reason], s.ID)
		}
	}
	l.skipped = now
	for _, reason := range slices.Sorted(maps.Keys(fresh)) {
		ids := fresh[reason]
		shown := make([]string, 0, min(len(ids), maxLoggedAdapters))
		for _, id := range ids[:cap(shown)] {
			if len(id) > maxLoggedIDLen {
				id = id[:maxLoggedIDLen] + "…"
			}
			shown = append(shown, id)
		}
		l.log.Warn().Str("reason", reason).Int("count", len(ids)).Strs("adapters", shown).Int("max_adapters", fleet.MaxAdapters).
			Msg("probe: LoRA adapters left out; the model and its other adapters are served")
	}
}

// maxLoggedAdapters and maxLoggedIDLen bound what one log line names of
// the adapters left out.
const (
	maxLoggedAdapters = 10
	maxLoggedIDLen    = 128
)

// markDown reports the engine down with err, from now when it was not
// down; logNew logs it when it was not (an engine down from the start, or
// one whose error changed kind while down is otherwise only in the debug
// log).
func (l *loop) markDown(err error, logNew bool) {
	id := l.target.probe.ID
	d := fleet.Down{ID: id, HTTPAddress: l.prober.hostport, Model: l.target.probe.Model, Kind: string(l.target.probe.Kind),
		Role: fleet.RoleUnified, LastError: err.Error(), Since: time.Now()}
	if d.Model == "" && l.last != nil {
		d.Model = l.last.GetModel()
	}
	if r, rerr := fleet.RoleOf(l.target.role); rerr == nil {
		d.Role = r
	}
	if l.m.setDown(id, &d) && logNew {
		l.log.Warn().Err(err).Msg("probe: engine down")
	}
}

// setDown records engine id down (d) or not (nil) and reports the set
// when it changed; it returns whether id was not down before. A down
// engine keeps the time it went down.
func (m *Manager) setDown(id string, d *fleet.Down) (isNew bool) {
	m.downMu.Lock()
	defer m.downMu.Unlock()
	old, was := m.down[id]
	switch {
	case d == nil && !was:
		return false
	case d == nil:
		delete(m.down, id)
	case was && old.LastError == d.LastError && old.Model == d.Model && old.HTTPAddress == d.HTTPAddress:
		return false
	default:
		if was {
			d.Since = old.Since
		}
		m.down[id] = *d
	}
	if m.cfg.OnDown != nil {
		list := slices.SortedFunc(maps.Values(m.down), func(a, b fleet.Down) int { return strings.Compare(a.ID, b.ID) })
		m.cfg.OnDown(list)
	}
	return d != nil && !was
}

// heartbeat sends st to the registry as a probed heartbeat arriving now.
func (l *loop) heartbeat(last *controlv1.WorkerStatus) {
	st := last
	if l.target.role != controlv1.Role_ROLE_UNSPECIFIED || l.draining.Load() {
		st = proto.CloneOf(last)
		if l.target.role != controlv1.Role_ROLE_UNSPECIFIED {
			st.Role = l.target.role
		}
		st.Draining = st.Draining || l.draining.Load()
	}
	msg := &registry.Heartbeat{Status: st, Arrived: time.Now(), Source: fleet.SourceProbe, Kind: string(l.target.probe.Kind),
		BootstrapPort: l.target.bootstrapPort}
	res, err := l.m.cfg.Root.RequestFuture(l.m.cfg.Registry, msg, RegistryTimeout).Result()
	if err != nil {
		l.log.Warn().Err(err).Msg("probe: registry did not answer the heartbeat")
		return
	}
	ack, isAck := res.(*controlv1.HeartbeatAck)
	if !isAck {
		l.log.Warn().Err(fmt.Errorf("probe: %w %T", ErrRegistryAnswer, res)).Msg("probe: heartbeat not acknowledged")
		return
	}
	ttl := time.Duration(l.m.fall) * time.Duration(ack.GetIntervalMs()) * time.Millisecond
	if !l.warned && ttl > 0 && l.target.interval >= ttl {
		l.warned = true
		l.log.Warn().Dur("probe_interval", l.target.interval).Dur("registry_ttl", ttl).
			Msg("probe: probe interval is not below heartbeat_miss_limit × heartbeat_interval: the registry evicts the engine between probes")
	}
}
