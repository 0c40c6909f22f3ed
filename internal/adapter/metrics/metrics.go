// Package metrics holds the gateway's Prometheus metrics: one Metrics value
// registered on a Registerer the caller passes in, with one small method per
// event the actors and edges report.
//
// Every label is bounded. Labels with a closed meaning (outcome, reason,
// step, phase, role, state, source, code) take values from fixed sets and
// map anything else to Other; the dynamic ones (route, worker, model) are
// capped (MaxRoutes, MaxWorkers, MaxModels) and map the empty string to
// None. The per-request methods use pre-curried series found by a lock-free
// lookup, so they do not allocate once a route and worker have been seen.
//
// Every method is safe for concurrent use and does nothing on a nil
// *Metrics, so code under test may pass nil.
package metrics

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// ErrNilRegisterer is returned by New when it is given no Registerer.
var ErrNilRegisterer = errors.New("metrics: nil registerer")

const namespace = "tlgate"

// Label names.
const (
	lRoute    = "route"
	lWorker   = "worker"
	lModel    = "model"
	lOutcome  = "outcome"
	lReason   = "reason"
	lStep     = "step"
	lPhase    = "phase"
	lProtocol = "protocol"
	lLeg      = "leg"
	lRole     = "role"
	lState    = "state"
	lCode     = "code"
	lSource   = "source"
	lEndpoint = "endpoint"
)

// latencyBuckets fit time to first byte and prefill: 1 ms to 60 s.
func latencyBuckets() []float64 {
	return []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60}
}

// durationBuckets fit whole requests: 5 ms to 10 min.
func durationBuckets() []float64 {
	return []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600}
}

// decisionBuckets fit one routing decision: 1 µs to 10 ms.
func decisionBuckets() []float64 {
	return []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2}
}

// WorkerKey is one (model, role, state) series of tlgate_workers.
type WorkerKey struct {
	Model string // the served model the worker reports
	Role  string // RoleUnified, RolePrefill or RoleDecode
	State string // StateRoutable, StateDraining or StateDrained
}

// pair keys the (route, worker) cache of tlgate_attempts_total.
type pair struct{ route, worker string }

// stepKey keys the cache of tlgate_cascade_steps_total.
type stepKey struct {
	route    string
	step     int
	accepted bool
}

// routeSeries is every per-route series a request touches, pre-curried.
type routeSeries struct {
	label     string
	requests  []prometheus.Counter // by requestOutcomes index
	failovers []prometheus.Counter // by failoverReasons index
	duration  prometheus.Observer
	ttfb      prometheus.Observer
	// cachePrompt and cacheMatched count cache_aware's estimated prompt
	// tokens and the part of them its pick held.
	cachePrompt, cacheMatched prometheus.Counter
}

// Metrics holds every metric of the gateway. Create it with New.
type Metrics struct {
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	ttfb          *prometheus.HistogramVec
	attempts      *prometheus.CounterVec
	failovers     *prometheus.CounterVec
	decisions     *prometheus.HistogramVec
	cachePrompt   *prometheus.CounterVec
	cacheMatched  *prometheus.CounterVec
	inflight      *prometheus.GaugeVec
	workers       *prometheus.GaugeVec
	evictions     *prometheus.CounterVec
	registrations *prometheus.CounterVec
	hbRejected    *prometheus.CounterVec
	drains        *prometheus.CounterVec
	epoch         prometheus.Gauge
	storeUp       prometheus.Gauge
	cascade       *prometheus.CounterVec
	prefill       prometheus.Histogram
	kvReleased    *prometheus.CounterVec
	disagg        *prometheus.CounterVec
	probes        *prometheus.CounterVec
	admin         *prometheus.CounterVec
	rejected      *prometheus.CounterVec
	connRefused   *prometheus.CounterVec
	endpoints     *prometheus.CounterVec

	routeNames  *names
	workerNames *names
	modelNames  *names

	routeCache    cache[string, *routeSeries]
	attemptCache  cache[pair, prometheus.Counter]
	inflightCache cache[string, prometheus.Gauge]
	stepCache     cache[stepKey, prometheus.Counter]
	decisionBy    []prometheus.Observer // by decisionReasons index

	workersMu   sync.Mutex
	workersLast map[[3]string]struct{}

	overload overloadMetrics // overload.go
	pd       pdMetrics       // disagg.go
	priority priorityMetrics // priority.go
}

// New creates the gateway's metrics and registers them on reg. It fails,
// registering nothing, when reg is nil or refuses a metric (for example
// because New already ran on it).
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, ErrNilRegisterer
	}
	m := newMetrics(MaxRoutes, MaxWorkers, MaxModels)
	cs := m.collectors()
	if err := registerAll(reg, cs...); err != nil {
		return nil, err
	}
	return m, nil
}

// newMetrics builds the metrics, unregistered, with the given label caps.
func newMetrics(maxRoutes, maxWorkers, maxModels int) *Metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}, labels)
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, labels)
	}
	m := &Metrics{
		requests: counter("requests_total",
			"Client inference requests finished, by route (public model, or none) and outcome.", lRoute, lOutcome),
		duration: histogram("request_duration_seconds",
			"Time from a client request's arrival to its last byte or error, by route.", durationBuckets(), lRoute),
		ttfb: histogram("time_to_first_byte_seconds",
			"Time from a streamed request's arrival to the first byte written to the client, by route.", latencyBuckets(), lRoute),
		attempts: counter("attempts_total",
			"Attempts sent to an engine worker (first tries and failovers), by route and worker.", lRoute, lWorker),
		failovers: counter("failovers_total",
			"Attempts that failed before the first byte and were given up for another worker, by route and reason.", lRoute, lReason),
		decisions: histogram("route_decision_seconds",
			"Time the router took to pick a worker, by the reason of the pick.", decisionBuckets(), lReason),
		cachePrompt: counter("cache_aware_prompt_tokens_total",
			"Prompt tokens (estimated from bytes, cache_aware_bytes_per_token) of the requests cache_aware routed, by route.", lRoute),
		cacheMatched: counter("cache_aware_matched_tokens_total",
			"Of cache_aware_prompt_tokens_total, the tokens of the prefix the prefix index placed on the picked worker, by route: "+
				"their ratio is the hit rate the gateway expects, to set beside the engines' prefix-cache hit rate.", lRoute),
		inflight: gauge("inflight_requests",
			"Requests the gateway has in flight on a worker.", lWorker),
		workers: gauge("workers",
			"Live workers by served model, role and state (routable, draining, drained).", lModel, lRole, lState),
		evictions: counter("worker_evictions_total",
			"Workers evicted after missing heartbeats, by served model.", lModel),
		registrations: counter("worker_registrations_total",
			"Workers that joined the registry, by served model and source (heartbeat or probe).", lModel, lSource),
		hbRejected: counter("heartbeats_rejected_total",
			"Heartbeats refused by the registry's gRPC edge, by gRPC status code.", lCode),
		drains: counter("drains_total",
			"Operator drains of a model.", lModel),
		epoch: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "route_epoch",
			Help: "Epoch of the route table in force."}),
		storeUp: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "store_up",
			Help: "1 while the route store (state_dir, or etcd) can be reached, else 0."}),
		cascade: counter("cascade_steps_total",
			"Cascade steps answered, by route, step (0 = first) and outcome (accepted or escalated).", lRoute, lStep, lOutcome),
		prefill: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "prefill_duration_seconds",
			Help: "Duration of the Prefill call of a disaggregated request.", Buckets: latencyBuckets()}),
		kvReleased: counter("kv_handles_released_total",
			"KV handles released on a decode worker after an unfinished disaggregated request, by outcome.", lOutcome),
		disagg: counter("disaggregated_failures_total",
			"Failures of disaggregated requests, by phase (tokenize, prefill, decode, release).", lPhase),
		probes: counter("probes_total",
			"Health probes of probed engines, by worker and outcome.", lWorker, lOutcome),
		admin: counter("admin_writes_total",
			"Admin writes (route table replacements, drains and resumes), by outcome.", lOutcome),
		rejected: counter("http_rejected_total",
			"Requests the HTTP edge refused before routing, by error code.", lCode),
		endpoints: counter("endpoint_requests_total",
			"Client inference requests finished, by endpoint (chat, completions, embeddings, rerank, score, tokenize, "+
				"detokenize, responses, messages) and outcome (as tlgate_requests_total's).", lEndpoint, lOutcome),
		connRefused: counter("http_connections_refused_total",
			"HTTP connections closed as soon as accepted, over the total or the per-client cap, by reason.", lReason),

		routeNames:  newNames(maxRoutes),
		workerNames: newNames(maxWorkers),
		modelNames:  newNames(maxModels),
		overload:    newOverloadMetrics(),
		pd:          newPDMetrics(),
		priority:    newPriorityMetrics(),
	}
	m.decisionBy = make([]prometheus.Observer, len(decisionReasons))
	for i, r := range decisionReasons {
		m.decisionBy[i] = m.decisions.WithLabelValues(r)
	}
	// Series of the small fixed sets start at zero, so rates and alerts see
	// them before the first event.
	for _, o := range []string{ResultOK, ResultError} {
		m.kvReleased.WithLabelValues(o)
	}
	for _, p := range phases {
		m.disagg.WithLabelValues(p)
	}
	for _, o := range adminOutcomes {
		m.admin.WithLabelValues(o)
	}
	for _, c := range rejectCodes {
		m.rejected.WithLabelValues(c)
	}
	for _, r := range connRefusedReasons {
		m.connRefused.WithLabelValues(r)
	}
	for _, c := range []codes.Code{codes.InvalidArgument, codes.Unauthenticated} {
		m.hbRejected.WithLabelValues(c.String())
	}
	return m
}

// collectors lists every metric in registration order.
func (m *Metrics) collectors() []prometheus.Collector {
	return append([]prometheus.Collector{
		m.requests, m.duration, m.ttfb, m.attempts, m.failovers, m.decisions, m.cachePrompt, m.cacheMatched,
		m.inflight, m.workers, m.evictions, m.registrations, m.hbRejected, m.drains, m.epoch, m.storeUp,
		m.cascade, m.prefill, m.kvReleased, m.disagg, m.probes, m.admin, m.rejected,
		m.connRefused, m.endpoints,
	}, append(append(m.overload.collectors(), m.pd.collectors()...), m.priority.collectors()...)...)
}

// route returns the pre-curried series of route r.
func (m *Metrics) route(r string) *routeSeries {
	if rs, ok := m.routeCache.load(r); ok {
		return rs
	}
	return m.routeSlow(r)
}

func (m *Metrics) routeSlow(r string) *routeSeries {
	m.routeCache.mu.Lock()
	defer m.routeCache.mu.Unlock()
	if rs, ok := m.routeCache.load(r); ok {
		return rs
	}
	label := m.routeNames.label(r)
	key := r
	if label != r && r != "" {
		key = label // invalid or over the cap: share the Other entry
		if rs, ok := m.routeCache.load(key); ok {
			return rs
		}
	}
	rs := &routeSeries{
		label:     label,
		requests:  make([]prometheus.Counter, len(requestOutcomes)),
		failovers: make([]prometheus.Counter, len(failoverReasons)),
		duration:  m.duration.WithLabelValues(label),
		ttfb:      m.ttfb.WithLabelValues(label),

		cachePrompt:  m.cachePrompt.WithLabelValues(label),
		cacheMatched: m.cacheMatched.WithLabelValues(label),
	}
	for i, o := range requestOutcomes {
		rs.requests[i] = m.requests.WithLabelValues(label, o)
	}
	for i, f := range failoverReasons {
		rs.failovers[i] = m.failovers.WithLabelValues(label, f)
	}
	m.routeCache.storeLocked(key, rs)
	return rs
}

// seconds converts d to seconds, clamping negative durations to zero.
func seconds(d time.Duration) float64 {
	if d < 0 {
		return 0
	}
	return d.Seconds()
}

// RequestDone records a finished client request: tlgate_requests_total
// {route, outcome} and tlgate_request_duration_seconds{route}. route is the
// public route model the request matched ("" before one matched, labelled
// None); outcome is one of the Outcome constants, anything else counts as
// Other. A not_found request is always labelled route None, so clients
// cannot mint route labels. dur runs from arrival to the last byte or error.
func (m *Metrics) RequestDone(route, outcome string, dur time.Duration) {
	m.RequestDoneTraced(route, outcome, dur, "")
}

// RequestDoneTraced is RequestDone with the request's trace id (when not
// empty) as an exemplar of its duration observation.
func (m *Metrics) RequestDoneTraced(route, outcome string, dur time.Duration, traceID string) {
	if m == nil {
		return
	}
	if outcome == OutcomeNotFound {
		route = ""
	}
	rs := m.route(route)
	if i := requestOutcomes.index(outcome); i >= 0 {
		rs.requests[i].Inc()
	} else {
		m.requests.WithLabelValues(rs.label, Other).Inc()
	}
	observe(rs.duration, seconds(dur), traceID)
}

// EndpointDone records tlgate_endpoint_requests_total{endpoint, outcome}
// for a finished client request; an endpoint or outcome outside the fixed
// sets counts as Other.
func (m *Metrics) EndpointDone(endpoint, outcome string) {
	if m == nil {
		return
	}
	if endpoints.index(endpoint) < 0 {
		endpoint = Other
	}
	if requestOutcomes.index(outcome) < 0 {
		outcome = Other
	}
	m.endpoints.WithLabelValues(endpoint, outcome).Inc()
}

// FirstByte records tlgate_time_to_first_byte_seconds{route} for a streamed
// request: d is the time from arrival to the first byte written to the
// client (the commit point).
func (m *Metrics) FirstByte(route string, d time.Duration) {
	m.FirstByteTraced(route, d, "")
}

// FirstByteTraced is FirstByte with the request's trace id (when not
// empty) as an exemplar.
func (m *Metrics) FirstByteTraced(route string, d time.Duration, traceID string) {
	if m == nil {
		return
	}
	observe(m.route(route).ttfb, seconds(d), traceID)
}

// Attempt counts tlgate_attempts_total{route, worker}: one attempt sent to
// worker, the first try as well as each failover.
func (m *Metrics) Attempt(route, worker string) {
	if m == nil {
		return
	}
	c, ok := m.attemptCache.load(pair{route, worker})
	if !ok {
		c = m.attemptSlow(route, worker)
	}
	c.Inc()
}

func (m *Metrics) attemptSlow(route, worker string) prometheus.Counter {
	rl := m.route(route).label
	m.attemptCache.mu.Lock()
	defer m.attemptCache.mu.Unlock()
	k := pair{route, worker}
	if c, ok := m.attemptCache.load(k); ok {
		return c
	}
	wl := m.workerNames.label(worker)
	c := m.attempts.WithLabelValues(rl, wl)
	if (rl == route || route == "") && (wl == worker || worker == "") {
		m.attemptCache.storeLocked(k, c)
	}
	return c
}

// Failover counts tlgate_failovers_total{route, reason}: an attempt that
// failed before the first byte, after which the request was routed again
// (or answered no_capacity when no worker was left). reason is a Failover
// constant (the proxy.Failure string); anything else counts as Other.
func (m *Metrics) Failover(route, reason string) {
	if m == nil {
		return
	}
	rs := m.route(route)
	if i := failoverReasons.index(reason); i >= 0 {
		rs.failovers[i].Inc()
		return
	}
	m.failovers.WithLabelValues(rs.label, Other).Inc()
}

// CacheAware counts one cache_aware pick of route: prompt estimated
// tokens, of which matched were held by the picked worker
// (tlgate_cache_aware_prompt_tokens_total and
// tlgate_cache_aware_matched_tokens_total).
func (m *Metrics) CacheAware(route string, prompt, matched int) {
	if m == nil || prompt <= 0 {
		return
	}
	rs := m.route(route)
	rs.cachePrompt.Add(float64(prompt))
	rs.cacheMatched.Add(float64(min(max(matched, 0), prompt)))
}

// RouteDecision records tlgate_route_decision_seconds{reason}: the time the
// router spent on one pick. reason is the pick's reason (policy.Reason*:
// least_outstanding, weighted, affinity, load, cache); anything else counts
// as Other.
func (m *Metrics) RouteDecision(reason string, d time.Duration) {
	if m == nil {
		return
	}
	if i := decisionReasons.index(reason); i >= 0 {
		m.decisionBy[i].Observe(seconds(d))
		return
	}
	m.decisions.WithLabelValues(Other).Observe(seconds(d))
}

// Cascade counts tlgate_cascade_steps_total{route, step, outcome}: step
// (0-based) of route's cascade answered and was accepted or escalated to
// the next step. Steps outside [0, MaxCascadeSteps) are labelled Other.
func (m *Metrics) Cascade(route string, step int, accepted bool) {
	if m == nil {
		return
	}
	k := stepKey{route, step, accepted}
	c, ok := m.stepCache.load(k)
	if !ok {
		c = m.cascadeSlow(k)
	}
	c.Inc()
}

func (m *Metrics) cascadeSlow(k stepKey) prometheus.Counter {
	rl := m.route(k.route).label
	m.stepCache.mu.Lock()
	defer m.stepCache.mu.Unlock()
	if c, ok := m.stepCache.load(k); ok {
		return c
	}
	sl := Other
	if k.step >= 0 && k.step < MaxCascadeSteps {
		sl = strconv.Itoa(k.step)
	}
	ol := CascadeEscalated
	if k.accepted {
		ol = CascadeAccepted
	}
	c := m.cascade.WithLabelValues(rl, sl, ol)
	if (rl == k.route || k.route == "") && sl != Other {
		m.stepCache.storeLocked(k, c)
	}
	return c
}

// Prefill records tlgate_prefill_duration_seconds: the duration of one
// Prefill call of a disaggregated request.
func (m *Metrics) Prefill(d time.Duration) {
	if m == nil {
		return
	}
	m.prefill.Observe(seconds(d))
}

// KVReleased counts tlgate_kv_handles_released_total{outcome}: one Release
// of a KV handle on a decode worker, outcome ok or error.
func (m *Metrics) KVReleased(ok bool) {
	if m == nil {
		return
	}
	m.kvReleased.WithLabelValues(result(ok)).Inc()
}

// DisaggFailure counts tlgate_disaggregated_failures_total{phase}: phase is
// a Phase constant (tokenize, prefill, decode, release); anything else
// counts as Other.
func (m *Metrics) DisaggFailure(phase string) {
	if m == nil {
		return
	}
	m.disagg.WithLabelValues(phases.label(phase)).Inc()
}

// Eviction counts tlgate_worker_evictions_total{model}: a worker of served
// model evicted for missing heartbeats. DeleteWorker drops the worker's
// own series.
func (m *Metrics) Eviction(model string) {
	if m == nil {
		return
	}
	m.evictions.WithLabelValues(m.modelNames.label(model)).Inc()
}

// Registration counts tlgate_worker_registrations_total{model, source}: a
// worker of served model joined the registry; source is SourceHeartbeat or
// SourceProbe (anything else counts as Other).
func (m *Metrics) Registration(model, source string) {
	if m == nil {
		return
	}
	m.registrations.WithLabelValues(m.modelNames.label(model), sources.label(source)).Inc()
}

// HeartbeatRejected counts tlgate_heartbeats_rejected_total{code}: the gRPC
// edge refused a heartbeat with code (labelled by its name, e.g.
// "InvalidArgument"). Its signature fits registryrpc's OnReject hook.
func (m *Metrics) HeartbeatRejected(code codes.Code) {
	if m == nil {
		return
	}
	label := Other
	if code <= codes.Unauthenticated {
		label = code.String()
	}
	m.hbRejected.WithLabelValues(label).Inc()
}

// Drain counts tlgate_drains_total{model}: an operator drained model.
func (m *Metrics) Drain(model string) {
	if m == nil {
		return
	}
	m.drains.WithLabelValues(m.modelNames.label(model)).Inc()
}

// StoreUp sets tlgate_store_up: 1 while the route store can be reached.
func (m *Metrics) StoreUp(up bool) {
	if m == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	m.storeUp.Set(v)
}

// Epoch sets tlgate_route_epoch to the route table's epoch e.
func (m *Metrics) Epoch(e uint64) {
	if m == nil {
		return
	}
	m.epoch.Set(float64(e))
}

// Probe counts tlgate_probes_total{worker, outcome}: one health probe of a
// probed engine, outcome ok or error.
func (m *Metrics) Probe(worker string, ok bool) {
	if m == nil {
		return
	}
	m.probes.WithLabelValues(m.workerNames.label(worker), result(ok)).Inc()
}

// AdminWrite counts tlgate_admin_writes_total{outcome}: one route table PUT
// (not a dry run), drain or resume; outcome is an Admin constant (ok or the error code
// answered), anything else counts as Other.
func (m *Metrics) AdminWrite(outcome string) {
	if m == nil {
		return
	}
	m.admin.WithLabelValues(adminOutcomes.label(outcome)).Inc()
}

// Rejected counts tlgate_http_rejected_total{code}: the HTTP edge refused a
// request before routing it; code is a Reject constant (the OpenAI error
// code answered), anything else counts as Other.
func (m *Metrics) Rejected(code string) {
	if m == nil {
		return
	}
	m.rejected.WithLabelValues(rejectCodes.label(code)).Inc()
}

// SetInFlight sets tlgate_inflight_requests{worker} to n, the gateway's
// in-flight count on worker.
func (m *Metrics) SetInFlight(worker string, n int) {
	if m == nil {
		return
	}
	g, ok := m.inflightCache.load(worker)
	if !ok {
		g = m.inflightSlow(worker)
	}
	g.Set(float64(n))
}

func (m *Metrics) inflightSlow(worker string) prometheus.Gauge {
	m.inflightCache.mu.Lock()
	defer m.inflightCache.mu.Unlock()
	if g, ok := m.inflightCache.load(worker); ok {
		return g
	}
	wl := m.workerNames.label(worker)
	g := m.inflight.WithLabelValues(wl)
	if wl == worker || worker == "" {
		m.inflightCache.storeLocked(worker, g)
	}
	return g
}

// DeleteWorker removes worker's series (tlgate_inflight_requests,
// tlgate_attempts_total and tlgate_probes_total) and frees its place under
// MaxWorkers. Call it when the worker leaves the registry. A worker counted
// as Other or None has no series of its own, so nothing is deleted for it.
func (m *Metrics) DeleteWorker(worker string) {
	if m == nil {
		return
	}
	if !m.workerNames.forget(worker) {
		return
	}
	m.inflightCache.mu.Lock()
	m.inflightCache.deleteLocked(func(k string) bool { return k == worker })
	m.inflight.DeleteLabelValues(worker)
	m.inflightCache.mu.Unlock()

	m.attemptCache.mu.Lock()
	m.attemptCache.deleteLocked(func(k pair) bool { return k.worker == worker })
	m.attempts.DeletePartialMatch(prometheus.Labels{lWorker: worker})
	m.attemptCache.mu.Unlock()

	m.probes.DeletePartialMatch(prometheus.Labels{lWorker: worker})
}

// DeleteWorkersExcept deletes, as DeleteWorker, every worker that has a
// tlgate_inflight_requests series and is not in listed (the workers the
// router knows now). Set at each scrape before SetInFlight, it drops the
// series of a worker that left since the last scrape, also one that a
// scrape racing its departure set again after DeleteWorker.
func (m *Metrics) DeleteWorkersExcept(listed map[string]bool) {
	if m == nil {
		return
	}
	var gone []string
	if p := m.inflightCache.p.Load(); p != nil {
		for w := range *p {
			if w != "" && !listed[w] {
				gone = append(gone, w)
			}
		}
	}
	for _, w := range gone {
		m.DeleteWorker(w)
	}
}

// SetWorkers replaces tlgate_workers with counts: series absent from counts
// are deleted, the others set. For every (model, role) in counts all three
// states are exported, missing ones as 0, so "no routable worker" is a
// visible 0 rather than an absent series. Roles and states outside their
// sets, and models over MaxModels, are summed under Other.
func (m *Metrics) SetWorkers(counts map[WorkerKey]int) {
	if m == nil {
		return
	}
	next := make(map[[3]string]float64, 3*len(counts))
	for k, n := range counts {
		ml, rl := m.modelNames.label(k.Model), roles.label(k.Role)
		for _, s := range states {
			if _, ok := next[[3]string{ml, rl, s}]; !ok {
				next[[3]string{ml, rl, s}] = 0
			}
		}
		next[[3]string{ml, rl, states.label(k.State)}] += float64(n)
	}
	m.workersMu.Lock()
	defer m.workersMu.Unlock()
	for k := range m.workersLast {
		if _, ok := next[k]; !ok {
			m.workers.DeleteLabelValues(k[0], k[1], k[2])
		}
	}
	last := make(map[[3]string]struct{}, len(next))
	for k, v := range next {
		m.workers.WithLabelValues(k[0], k[1], k[2]).Set(v)
		last[k] = struct{}{}
	}
	m.workersLast = last
}

// result labels a binary outcome.
func result(ok bool) string {
	if ok {
		return ResultOK
	}
	return ResultError
}

// ConnectionRefused counts tlgate_http_connections_refused_total{reason}:
// an HTTP connection over a cap was closed as soon as it was accepted;
// reason is a ConnRefused constant, anything else counts as Other.
func (m *Metrics) ConnectionRefused(reason string) {
	if m == nil {
		return
	}
	m.connRefused.WithLabelValues(connRefusedReasons.label(reason)).Inc()
}

// registerAll registers every collector of cs with reg, or none: when
// one is refused, those registered before it are unregistered.
func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return fmt.Errorf("metrics: register: %w", err)
		}
	}
	return nil
}
