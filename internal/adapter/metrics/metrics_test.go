package metrics

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
)

// newTest returns metrics registered on a fresh registry.
func newTest(t testing.TB) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m, reg
}

// newCapped returns metrics with small label caps on a fresh registry.
func newCapped(t testing.TB, routes, workers, models int) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m := newMetrics(routes, workers, models)
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			t.Fatalf("Register: %v", err)
		}
	}
	return m, reg
}

// touchAll calls every recording method once.
func touchAll(m *Metrics) {
	m.RequestDone("smol", OutcomeOK, 120*time.Millisecond)
	m.EndpointDone(EndpointEmbeddings, OutcomeOK)
	m.EndpointDone("bogus", "bogus")
	m.FirstByte("smol", 15*time.Millisecond)
	m.Attempt("smol", "w1")
	m.Failover("smol", FailoverRefused)
	m.RouteDecision(DecisionAffinity, 3*time.Microsecond)
	m.CacheAware("smol", 300, 128)
	m.Cascade("auto", 0, false)
	m.Prefill(40 * time.Millisecond)
	m.KVReleased(true)
	m.DisaggFailure(PhasePrefill)
	m.Disaggregated(ProtocolVLLM, 2, 30*time.Millisecond, time.Second, 5*time.Millisecond, []LegFailure{{LegDecode, FailoverStatus503}, {"bogus", "bogus"}})
	m.Eviction("smol-v3")
	m.Registration("smol-v3", SourceHeartbeat)
	m.HeartbeatRejected(codes.InvalidArgument)
	m.Drain("smol-v3")
	m.Epoch(7)
	m.Probe("w9", true)
	m.AdminWrite(AdminOK)
	m.Rejected(RejectInvalidAPIKey)
	m.ConnectionRefused(ConnRefusedPerClient)
	m.SetInFlight("w1", 2)
	m.SetWorkers(map[WorkerKey]int{{Model: "smol-v3", Role: RoleUnified, State: StateRoutable}: 2})
}

// family gathers reg and returns the family called name, or nil.
func family(t *testing.T, reg prometheus.Gatherer, name string) *dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}

// series returns the series of family name whose labels are exactly
// labels, or nil.
func series(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mf := family(t, reg, name)
	if mf == nil {
		return nil
	}
	for _, mt := range mf.GetMetric() {
		got := map[string]string{}
		for _, lp := range mt.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		if maps.Equal(got, labels) {
			return mt
		}
	}
	return nil
}

// value returns the value of a counter or gauge series; it fails the test
// when the series is absent.
func value(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mt := series(t, reg, name, labels)
	if mt == nil {
		t.Fatalf("%s%v: no such series", name, labels)
	}
	switch {
	case mt.Counter != nil:
		return mt.Counter.GetValue()
	case mt.Gauge != nil:
		return mt.Gauge.GetValue()
	}
	t.Fatalf("%s%v: not a counter or gauge", name, labels)
	return 0
}

// observations returns the sample count of a histogram series; it fails
// the test when the series is absent.
func observations(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) uint64 {
	t.Helper()
	mt := series(t, reg, name, labels)
	if mt == nil || mt.Histogram == nil {
		t.Fatalf("%s%v: no such histogram series", name, labels)
	}
	return mt.Histogram.GetSampleCount()
}

func TestNewNilRegisterer(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, ErrNilRegisterer) {
		t.Fatalf("New(nil) error = %v, want ErrNilRegisterer", err)
	}
}

func TestNewRegistersNothingOnFailure(t *testing.T) {
	reg := prometheus.NewRegistry()
	blocker := prometheus.NewGauge(prometheus.GaugeOpts{Name: "tlgate_route_epoch", Help: "Epoch of the route table in force."})
	reg.MustRegister(blocker)
	_, err := New(reg)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		t.Fatalf("New error = %v, want AlreadyRegisteredError", err)
	}
	// The metrics registered before the clash were withdrawn: once the
	// blocker is gone, New succeeds on the same registry.
	reg.Unregister(blocker)
	if _, err := New(reg); err != nil {
		t.Fatalf("New after the clash: %v", err)
	}
	if _, err := New(reg); err == nil {
		t.Fatal("second New on the same registry succeeded")
	}
}

func TestEveryMetricExposed(t *testing.T) {
	m, reg := newTest(t)
	touchAll(m)
	want := map[string]struct {
		typ    dto.MetricType
		labels []string
	}{
		"tlgate_requests_total":                   {dto.MetricType_COUNTER, []string{"outcome", "route"}},
		"tlgate_request_duration_seconds":         {dto.MetricType_HISTOGRAM, []string{"route"}},
		"tlgate_time_to_first_byte_seconds":       {dto.MetricType_HISTOGRAM, []string{"route"}},
		"tlgate_attempts_total":                   {dto.MetricType_COUNTER, []string{"route", "worker"}},
		"tlgate_failovers_total":                  {dto.MetricType_COUNTER, []string{"reason", "route"}},
		"tlgate_route_decision_seconds":           {dto.MetricType_HISTOGRAM, []string{"reason"}},
		"tlgate_cache_aware_prompt_tokens_total":  {dto.MetricType_COUNTER, []string{"route"}},
		"tlgate_cache_aware_matched_tokens_total": {dto.MetricType_COUNTER, []string{"route"}},
		"tlgate_inflight_requests":                {dto.MetricType_GAUGE, []string{"worker"}},
		"tlgate_workers":                          {dto.MetricType_GAUGE, []string{"model", "role", "state"}},
		"tlgate_worker_evictions_total":           {dto.MetricType_COUNTER, []string{"model"}},
		"tlgate_worker_registrations_total":       {dto.MetricType_COUNTER, []string{"model", "source"}},
		"tlgate_heartbeats_rejected_total":        {dto.MetricType_COUNTER, []string{"code"}},
		"tlgate_drains_total":                     {dto.MetricType_COUNTER, []string{"model"}},
		"tlgate_route_epoch":                      {dto.MetricType_GAUGE, nil},
		"tlgate_cascade_steps_total":              {dto.MetricType_COUNTER, []string{"outcome", "route", "step"}},
		"tlgate_prefill_duration_seconds":         {dto.MetricType_HISTOGRAM, nil},
		"tlgate_kv_handles_released_total":        {dto.MetricType_COUNTER, []string{"outcome"}},
		"tlgate_disaggregated_failures_total":     {dto.MetricType_COUNTER, []string{"phase"}},
		"tlgate_probes_total":                     {dto.MetricType_COUNTER, []string{"outcome", "worker"}},
		"tlgate_admin_writes_total":               {dto.MetricType_COUNTER, []string{"outcome"}},
		"tlgate_http_rejected_total":              {dto.MetricType_COUNTER, []string{"code"}},
		"tlgate_store_up":                         {dto.MetricType_GAUGE, nil},
		"tlgate_http_connections_refused_total":   {dto.MetricType_COUNTER, []string{"reason"}},
		"tlgate_endpoint_requests_total":          {dto.MetricType_COUNTER, []string{"endpoint", "outcome"}},
		"tlgate_disagg_leg_duration_seconds":      {dto.MetricType_HISTOGRAM, []string{"leg", "protocol"}},
		"tlgate_disagg_transfer_wait_seconds":     {dto.MetricType_HISTOGRAM, []string{"protocol"}},
		"tlgate_disagg_pairs_tried":               {dto.MetricType_HISTOGRAM, []string{"protocol"}},
		"tlgate_disagg_leg_failures_total":        {dto.MetricType_COUNTER, []string{"leg", "protocol", "reason"}},
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		name := mf.GetName()
		got[name] = true
		w, ok := want[name]
		if !ok {
			t.Errorf("unexpected family %s", name)
			continue
		}
		if mf.GetType() != w.typ {
			t.Errorf("%s type = %v, want %v", name, mf.GetType(), w.typ)
		}
		for _, mt := range mf.GetMetric() {
			var ls []string
			for _, lp := range mt.GetLabel() {
				ls = append(ls, lp.GetName())
			}
			if !slices.Equal(ls, w.labels) {
				t.Errorf("%s labels = %v, want %v", name, ls, w.labels)
			}
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s has no help", name)
		}
	}
	for name := range want {
		if !got[name] {
			t.Errorf("family %s not exposed", name)
		}
	}
	// Two routes seen (smol, auto): every outcome and reason pre-curried.
	if n := testutil.CollectAndCount(m.requests); n != 2*len(requestOutcomes) {
		t.Errorf("requests series = %d, want %d", n, 2*len(requestOutcomes))
	}
	if n := testutil.CollectAndCount(m.failovers); n != 2*len(failoverReasons) {
		t.Errorf("failover series = %d, want %d", n, 2*len(failoverReasons))
	}
}

func TestLint(t *testing.T) {
	m, reg := newTest(t)
	touchAll(m)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatalf("GatherAndLint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestExposition(t *testing.T) {
	m, reg := newTest(t)
	m.RequestDone("smol", OutcomeOK, time.Second)
	m.RequestDone("smol", OutcomeOK, time.Second)
	m.RequestDone("smol", OutcomeNoCapacity, time.Second)
	m.RequestDone("gpt-9", OutcomeNotFound, time.Millisecond)
	m.Epoch(42)
	want := `
# HELP tlgate_requests_total Client inference requests finished, by route (public model, or none) and outcome.
# TYPE tlgate_requests_total counter
tlgate_requests_total{outcome="client_error",route="none"} 0
tlgate_requests_total{outcome="client_error",route="smol"} 0
tlgate_requests_total{outcome="client_gone",route="none"} 0
tlgate_requests_total{outcome="client_gone",route="smol"} 0
tlgate_requests_total{outcome="internal_error",route="none"} 0
tlgate_requests_total{outcome="internal_error",route="smol"} 0
tlgate_requests_total{outcome="no_capacity",route="none"} 0
tlgate_requests_total{outcome="no_capacity",route="smol"} 1
tlgate_requests_total{outcome="not_found",route="none"} 1
tlgate_requests_total{outcome="not_found",route="smol"} 0
tlgate_requests_total{outcome="objective_unreachable",route="none"} 0
tlgate_requests_total{outcome="objective_unreachable",route="smol"} 0
tlgate_requests_total{outcome="ok",route="none"} 0
tlgate_requests_total{outcome="ok",route="smol"} 2
tlgate_requests_total{outcome="overloaded",route="none"} 0
tlgate_requests_total{outcome="overloaded",route="smol"} 0
tlgate_requests_total{outcome="shed",route="none"} 0
tlgate_requests_total{outcome="shed",route="smol"} 0
tlgate_requests_total{outcome="upstream_failed",route="none"} 0
tlgate_requests_total{outcome="upstream_failed",route="smol"} 0
# HELP tlgate_route_epoch Epoch of the route table in force.
# TYPE tlgate_route_epoch gauge
tlgate_route_epoch 42
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tlgate_requests_total", "tlgate_route_epoch"); err != nil {
		t.Fatal(err)
	}
}

func TestRequestDone(t *testing.T) {
	tests := []struct {
		name             string
		route, outcome   string
		wantRoute, wantO string
	}{
		{"ok", "smol", OutcomeOK, "smol", OutcomeOK},
		{"client error", "smol", OutcomeClientError, "smol", OutcomeClientError},
		{"no capacity", "big", OutcomeNoCapacity, "big", OutcomeNoCapacity},
		{"upstream failed", "big", OutcomeUpstreamFailed, "big", OutcomeUpstreamFailed},
		{"client gone", "big", OutcomeClientGone, "big", OutcomeClientGone},
		{"internal error", "big", OutcomeInternalError, "big", OutcomeInternalError},
		{"not found never labels the client's model", "made-up-model", OutcomeNotFound, None, OutcomeNotFound},
		{"no route yet", "", OutcomeClientError, None, OutcomeClientError},
		{"unknown outcome", "smol", "exploded", "smol", Other},
		{"invalid utf-8 route", "bad\xff", OutcomeOK, Other, OutcomeOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, reg := newTest(t)
			m.RequestDone(tt.route, tt.outcome, 250*time.Millisecond)
			if got := value(t, reg, "tlgate_requests_total", map[string]string{"route": tt.wantRoute, "outcome": tt.wantO}); got != 1 {
				t.Errorf("requests = %v, want 1", got)
			}
			if got := observations(t, reg, "tlgate_request_duration_seconds", map[string]string{"route": tt.wantRoute}); got != 1 {
				t.Errorf("duration observations = %d, want 1", got)
			}
		})
	}
}

func TestHistogramBuckets(t *testing.T) {
	m, reg := newTest(t)
	m.RequestDone("smol", OutcomeOK, 7*time.Minute)
	m.RequestDone("smol", OutcomeOK, -time.Second) // clamped to 0
	m.FirstByte("smol", 1500*time.Microsecond)
	m.RouteDecision(DecisionWeighted, 800*time.Nanosecond)
	m.Prefill(45 * time.Second)

	bucketCount := func(name string, labels map[string]string, le float64) uint64 {
		t.Helper()
		mt := series(t, reg, name, labels)
		if mt == nil {
			t.Fatalf("%s%v: no series", name, labels)
		}
		for _, b := range mt.Histogram.GetBucket() {
			if b.GetUpperBound() == le {
				return b.GetCumulativeCount()
			}
		}
		t.Fatalf("%s has no bucket le=%v", name, le)
		return 0
	}
	checks := []struct {
		name   string
		labels map[string]string
		le     float64
		want   uint64
	}{
		{"tlgate_request_duration_seconds", map[string]string{"route": "smol"}, 300, 1}, // only the clamped one
		{"tlgate_request_duration_seconds", map[string]string{"route": "smol"}, 600, 2},
		{"tlgate_time_to_first_byte_seconds", map[string]string{"route": "smol"}, .001, 0},
		{"tlgate_time_to_first_byte_seconds", map[string]string{"route": "smol"}, .0025, 1},
		{"tlgate_route_decision_seconds", map[string]string{"reason": DecisionWeighted}, 1e-6, 1},
		{"tlgate_prefill_duration_seconds", map[string]string{}, 30, 0},
		{"tlgate_prefill_duration_seconds", map[string]string{}, 60, 1},
	}
	for _, c := range checks {
		if got := bucketCount(c.name, c.labels, c.le); got != c.want {
			t.Errorf("%s%v le=%v: %d, want %d", c.name, c.labels, c.le, got, c.want)
		}
	}
	if mt := series(t, reg, "tlgate_request_duration_seconds", map[string]string{"route": "smol"}); mt.Histogram.GetSampleSum() != 420 {
		t.Errorf("duration sum = %v, want 420 (negative clamped to 0)", mt.Histogram.GetSampleSum())
	}
}

func TestFixedSetsMapUnknownToOther(t *testing.T) {
	tests := []struct {
		name   string
		call   func(m *Metrics)
		metric string
		labels map[string]string
	}{
		{"failover reason", func(m *Metrics) { m.Failover("smol", "gremlins") },
			"tlgate_failovers_total", map[string]string{"route": "smol", "reason": Other}},
		{"failover canceled is not a failover reason", func(m *Metrics) { m.Failover("smol", "canceled") },
			"tlgate_failovers_total", map[string]string{"route": "smol", "reason": Other}},
		{"decision reason", func(m *Metrics) { m.RouteDecision("random", time.Microsecond) },
			"tlgate_route_decision_seconds", map[string]string{"reason": Other}},
		{"disagg phase", func(m *Metrics) { m.DisaggFailure("transfer") },
			"tlgate_disaggregated_failures_total", map[string]string{"phase": Other}},
		{"registration source", func(m *Metrics) { m.Registration("smol-v3", "static") },
			"tlgate_worker_registrations_total", map[string]string{"model": "smol-v3", "source": Other}},
		{"admin outcome", func(m *Metrics) { m.AdminWrite("teapot") },
			"tlgate_admin_writes_total", map[string]string{"outcome": Other}},
		{"reject code", func(m *Metrics) { m.Rejected("418") },
			"tlgate_http_rejected_total", map[string]string{"code": Other}},
		{"grpc code out of range", func(m *Metrics) { m.HeartbeatRejected(codes.Code(99)) },
			"tlgate_heartbeats_rejected_total", map[string]string{"code": Other}},
		{"cascade step too deep", func(m *Metrics) { m.Cascade("auto", MaxCascadeSteps, true) },
			"tlgate_cascade_steps_total", map[string]string{"route": "auto", "step": Other, "outcome": CascadeAccepted}},
		{"cascade step negative", func(m *Metrics) { m.Cascade("auto", -1, false) },
			"tlgate_cascade_steps_total", map[string]string{"route": "auto", "step": Other, "outcome": CascadeEscalated}},
		{"empty model", func(m *Metrics) { m.Eviction("") },
			"tlgate_worker_evictions_total", map[string]string{"model": None}},
		{"invalid utf-8 worker", func(m *Metrics) { m.Probe("w\xfe", false) },
			"tlgate_probes_total", map[string]string{"worker": Other, "outcome": ResultError}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, reg := newTest(t)
			tt.call(m)
			mt := series(t, reg, tt.metric, tt.labels)
			if mt == nil {
				t.Fatalf("%s%v: no series", tt.metric, tt.labels)
			}
			if mt.Histogram != nil {
				if mt.Histogram.GetSampleCount() != 1 {
					t.Errorf("observations = %d, want 1", mt.Histogram.GetSampleCount())
				}
			} else if got := value(t, reg, tt.metric, tt.labels); got != 1 {
				t.Errorf("value = %v, want 1", got)
			}
		})
	}
}

func TestKnownValuesKeepTheirLabel(t *testing.T) {
	m, reg := newTest(t)
	for _, r := range failoverReasons {
		m.Failover("smol", r)
	}
	for _, r := range decisionReasons {
		m.RouteDecision(r, time.Microsecond)
	}
	for _, p := range phases {
		m.DisaggFailure(p)
	}
	for _, s := range sources {
		m.Registration("smol-v3", s)
	}
	for _, o := range adminOutcomes {
		m.AdminWrite(o)
	}
	for _, c := range rejectCodes {
		m.Rejected(c)
	}
	m.KVReleased(true)
	m.KVReleased(false)
	m.KVReleased(false)
	m.Probe("w1", true)
	m.Probe("w1", false)
	m.HeartbeatRejected(codes.Unauthenticated)
	m.HeartbeatRejected(codes.OK) // the lowest code still has its name

	for _, r := range failoverReasons {
		if got := testutil.ToFloat64(m.failovers.WithLabelValues("smol", r)); got != 1 {
			t.Errorf("failovers{reason=%q} = %v, want 1", r, got)
		}
	}
	for _, r := range decisionReasons {
		if got := observations(t, reg, "tlgate_route_decision_seconds", map[string]string{"reason": r}); got != 1 {
			t.Errorf("decisions{reason=%q} = %d, want 1", r, got)
		}
	}
	for _, p := range phases {
		if got := testutil.ToFloat64(m.disagg.WithLabelValues(p)); got != 1 {
			t.Errorf("disagg{phase=%q} = %v, want 1", p, got)
		}
	}
	for _, s := range sources {
		if got := testutil.ToFloat64(m.registrations.WithLabelValues("smol-v3", s)); got != 1 {
			t.Errorf("registrations{source=%q} = %v, want 1", s, got)
		}
	}
	for _, o := range adminOutcomes {
		if got := testutil.ToFloat64(m.admin.WithLabelValues(o)); got != 1 {
			t.Errorf("admin{outcome=%q} = %v, want 1", o, got)
		}
	}
	for _, c := range rejectCodes {
		if got := testutil.ToFloat64(m.rejected.WithLabelValues(c)); got != 1 {
			t.Errorf("rejected{code=%q} = %v, want 1", c, got)
		}
	}
	checks := []struct {
		c    prometheus.Collector
		want float64
	}{
		{m.kvReleased.WithLabelValues(ResultOK), 1},
		{m.kvReleased.WithLabelValues(ResultError), 2},
		{m.probes.WithLabelValues("w1", ResultOK), 1},
		{m.probes.WithLabelValues("w1", ResultError), 1},
		{m.hbRejected.WithLabelValues("Unauthenticated"), 1},
		{m.hbRejected.WithLabelValues("OK"), 1},
		{m.hbRejected.WithLabelValues("InvalidArgument"), 0},
	}
	for i, c := range checks {
		if got := testutil.ToFloat64(c.c); got != c.want {
			t.Errorf("check %d = %v, want %v", i, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.failovers); n != len(failoverReasons) {
		t.Errorf("failover series = %d, want %d (no Other)", n, len(failoverReasons))
	}
}

func TestPerRequestCounters(t *testing.T) {
	m, reg := newTest(t)
	m.Attempt("smol", "w1")
	m.Attempt("smol", "w1")
	m.Attempt("smol", "w2")
	m.Attempt("big", "w1")
	m.FirstByte("smol", time.Millisecond)
	m.FirstByte("smol", time.Millisecond)
	m.Cascade("auto", 0, false)
	m.Cascade("auto", 1, true)
	m.Cascade("auto", 1, true)
	m.Prefill(time.Second)
	m.Eviction("smol-v3")
	m.Drain("smol-v3")
	m.Drain("smol-v3")
	m.Epoch(3)
	m.Epoch(4)

	counts := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"tlgate_attempts_total", map[string]string{"route": "smol", "worker": "w1"}, 2},
		{"tlgate_attempts_total", map[string]string{"route": "smol", "worker": "w2"}, 1},
		{"tlgate_attempts_total", map[string]string{"route": "big", "worker": "w1"}, 1},
		{"tlgate_cascade_steps_total", map[string]string{"route": "auto", "step": "0", "outcome": CascadeEscalated}, 1},
		{"tlgate_cascade_steps_total", map[string]string{"route": "auto", "step": "1", "outcome": CascadeAccepted}, 2},
		{"tlgate_worker_evictions_total", map[string]string{"model": "smol-v3"}, 1},
		{"tlgate_drains_total", map[string]string{"model": "smol-v3"}, 2},
		{"tlgate_route_epoch", map[string]string{}, 4},
	}
	for _, c := range counts {
		if got := value(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := observations(t, reg, "tlgate_time_to_first_byte_seconds", map[string]string{"route": "smol"}); got != 2 {
		t.Errorf("ttfb observations = %d, want 2", got)
	}
	if got := testutil.CollectAndCount(m.prefill); got != 1 {
		t.Errorf("prefill series = %d, want 1", got)
	}
	if n := testutil.CollectAndCount(m.cascade); n != 2 {
		t.Errorf("cascade series = %d, want 2", n)
	}
}

func TestDynamicLabelsCapped(t *testing.T) {
	m, reg := newCapped(t, 2, 2, 2)
	for _, r := range []string{"a", "b", "c", "d"} {
		m.RequestDone(r, OutcomeOK, time.Millisecond)
		m.Attempt(r, "w1")
	}
	for _, w := range []string{"w1", "w2", "w3", "w4"} {
		m.SetInFlight(w, 1)
	}
	for _, md := range []string{"m1", "m2", "m3"} {
		m.Eviction(md)
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"tlgate_requests_total", map[string]string{"route": "a", "outcome": OutcomeOK}, 1},
		{"tlgate_requests_total", map[string]string{"route": "b", "outcome": OutcomeOK}, 1},
		{"tlgate_requests_total", map[string]string{"route": Other, "outcome": OutcomeOK}, 2},
		{"tlgate_attempts_total", map[string]string{"route": Other, "worker": "w1"}, 2},
		{"tlgate_inflight_requests", map[string]string{"worker": "w2"}, 1},
		{"tlgate_inflight_requests", map[string]string{"worker": Other}, 1},
		{"tlgate_worker_evictions_total", map[string]string{"model": Other}, 1},
	}
	for _, c := range checks {
		if got := value(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.inflight); n != 3 {
		t.Errorf("inflight series = %d, want 3 (w1, w2, other)", n)
	}
	if n := testutil.CollectAndCount(m.requests); n != 3*len(requestOutcomes) {
		t.Errorf("request series = %d, want %d", n, 3*len(requestOutcomes))
	}
	// Deleting a worker frees its place for the next one.
	m.DeleteWorker("w1")
	m.SetInFlight("w5", 4)
	if got := value(t, reg, "tlgate_inflight_requests", map[string]string{"worker": "w5"}); got != 4 {
		t.Errorf("inflight{w5} = %v, want 4", got)
	}
	// Deleting a worker that only ever counted as Other deletes nothing.
	m.DeleteWorker("w3")
	if series(t, reg, "tlgate_inflight_requests", map[string]string{"worker": Other}) == nil {
		t.Error("DeleteWorker of an overflow worker deleted the Other series")
	}
}

func TestDeleteWorker(t *testing.T) {
	m, reg := newTest(t)
	m.SetInFlight("w1", 3)
	m.SetInFlight("w2", 1)
	m.Attempt("smol", "w1")
	m.Attempt("big", "w1")
	m.Attempt("smol", "w2")
	m.Probe("w1", true)
	m.Probe("w2", false)

	m.DeleteWorker("w1")
	for _, name := range []string{"tlgate_inflight_requests", "tlgate_attempts_total", "tlgate_probes_total"} {
		for _, mt := range family(t, reg, name).GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "worker" && lp.GetValue() == "w1" {
					t.Errorf("%s still has a w1 series after DeleteWorker", name)
				}
			}
		}
	}
	if got := value(t, reg, "tlgate_inflight_requests", map[string]string{"worker": "w2"}); got != 1 {
		t.Errorf("inflight{w2} = %v, want 1", got)
	}
	if got := value(t, reg, "tlgate_attempts_total", map[string]string{"route": "smol", "worker": "w2"}); got != 1 {
		t.Errorf("attempts{smol,w2} = %v, want 1", got)
	}
	// A returning worker starts afresh, and its series are exported again
	// (the caches no longer hold the deleted children).
	m.Attempt("smol", "w1")
	m.SetInFlight("w1", 1)
	if got := value(t, reg, "tlgate_attempts_total", map[string]string{"route": "smol", "worker": "w1"}); got != 1 {
		t.Errorf("attempts{smol,w1} after return = %v, want 1", got)
	}
	if got := value(t, reg, "tlgate_inflight_requests", map[string]string{"worker": "w1"}); got != 1 {
		t.Errorf("inflight{w1} after return = %v, want 1", got)
	}
	m.DeleteWorker("never-seen") // no-op
}

func TestSetWorkers(t *testing.T) {
	m, reg := newTest(t)
	m.SetWorkers(map[WorkerKey]int{
		{Model: "smol-v3", Role: RoleUnified, State: StateRoutable}: 2,
		{Model: "smol-v3", Role: RoleUnified, State: StateDraining}: 1,
		{Model: "big", Role: RoleDecode, State: StateRoutable}:      2,
		{Model: "big", Role: "weird", State: "sleepy"}:              1,
	})
	want := map[[3]string]float64{
		{"smol-v3", RoleUnified, StateRoutable}: 2,
		{"smol-v3", RoleUnified, StateDraining}: 1,
		{"smol-v3", RoleUnified, StateDrained}:  0,
		{"big", RoleDecode, StateRoutable}:      2,
		{"big", RoleDecode, StateDraining}:      0,
		{"big", RoleDecode, StateDrained}:       0,
		{"big", Other, StateRoutable}:           0,
		{"big", Other, StateDraining}:           0,
		{"big", Other, StateDrained}:            0,
		{"big", Other, Other}:                   1,
	}
	checkWorkers(t, reg, want)

	// Replacing: the big model left, smol's drain finished.
	m.SetWorkers(map[WorkerKey]int{
		{Model: "smol-v3", Role: RoleUnified, State: StateDrained}: 3,
	})
	checkWorkers(t, reg, map[[3]string]float64{
		{"smol-v3", RoleUnified, StateRoutable}: 0,
		{"smol-v3", RoleUnified, StateDraining}: 0,
		{"smol-v3", RoleUnified, StateDrained}:  3,
	})
	m.SetWorkers(nil)
	if n := testutil.CollectAndCount(m.workers); n != 0 {
		t.Errorf("workers series after SetWorkers(nil) = %d, want 0", n)
	}
}

func checkWorkers(t *testing.T, reg prometheus.Gatherer, want map[[3]string]float64) {
	t.Helper()
	got := map[[3]string]float64{}
	for _, mt := range family(t, reg, "tlgate_workers").GetMetric() {
		l := map[string]string{}
		for _, lp := range mt.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		got[[3]string{l["model"], l["role"], l["state"]}] = mt.GetGauge().GetValue()
	}
	if !maps.Equal(got, want) {
		t.Errorf("tlgate_workers = %v, want %v", got, want)
	}
}

func TestNilReceiver(t *testing.T) {
	var m *Metrics
	touchAll(m)
	m.DeleteWorker("w1")
	m.RequestDone("smol", "bogus", -1)
	onReject := m.HeartbeatRejected // fits registryrpc's OnReject hook even on nil
	onReject(codes.Internal)
}

// TestHotPathDoesNotAllocate checks that the per-request methods reuse
// their pre-curried series once a route and worker have been seen.
func TestHotPathDoesNotAllocate(t *testing.T) {
	m, _ := newTest(t)
	touchAll(m)
	calls := []struct {
		name string
		f    func()
	}{
		{"RequestDone", func() { m.RequestDone("smol", OutcomeOK, time.Second) }},
		{"FirstByte", func() { m.FirstByte("smol", time.Millisecond) }},
		{"Attempt", func() { m.Attempt("smol", "w1") }},
		{"Failover", func() { m.Failover("smol", FailoverStatus503) }},
		{"RouteDecision", func() { m.RouteDecision(DecisionAffinity, time.Microsecond) }},
		{"Cascade", func() { m.Cascade("auto", 0, false) }},
		{"SetInFlight", func() { m.SetInFlight("w1", 5) }},
		{"Prefill", func() { m.Prefill(time.Millisecond) }},
		{"Epoch", func() { m.Epoch(9) }},
	}
	for _, c := range calls {
		c.f()
		if a := testing.AllocsPerRun(100, c.f); a != 0 {
			t.Errorf("%s: %v allocs per call, want 0", c.name, a)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	m, reg := newTest(t)
	const goroutines, perG = 8, 200
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			route := fmt.Sprintf("r%d", g%3)
			worker := fmt.Sprintf("w%d", g%4)
			for i := range perG {
				m.Attempt(route, worker)
				m.RequestDone(route, OutcomeOK, time.Duration(i)*time.Millisecond)
				m.SetInFlight(worker, i)
				m.Cascade(route, i%3, i%2 == 0)
				if i%50 == 0 {
					m.DeleteWorker("churn")
					m.Attempt(route, "churn")
					m.SetWorkers(map[WorkerKey]int{{Model: "m", Role: RoleUnified, State: StateRoutable}: i})
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			if _, err := reg.Gather(); err != nil {
				t.Errorf("Gather: %v", err)
				return
			}
		}
	})
	wg.Wait()
	var total float64
	for _, mt := range family(t, reg, "tlgate_requests_total").GetMetric() {
		total += mt.GetCounter().GetValue()
	}
	if total != goroutines*perG {
		t.Errorf("requests total = %v, want %d", total, goroutines*perG)
	}
	var attempts float64
	for _, mt := range family(t, reg, "tlgate_attempts_total").GetMetric() {
		for _, lp := range mt.GetLabel() {
			if lp.GetName() == "worker" && lp.GetValue() != "churn" {
				attempts += mt.GetCounter().GetValue()
			}
		}
	}
	if attempts != goroutines*perG {
		t.Errorf("attempts on stable workers = %v, want %d", attempts, goroutines*perG)
	}
}

func TestOverloadMetrics(t *testing.T) {
	m, reg := newTest(t)
	m.Ejected("smol", FailoverRefused)
	m.Ejected("smol", "weird")
	m.QueueLeft("smol", QueueServed, 2*time.Second)
	m.Overloaded("smol", OverloadQueueTimeout)
	m.SetOverload(map[string]int{"smol": 3}, map[string]int{"smol": 1})
	m.SetOverload(map[string]int{"big": 2}, nil)
	want := `
# HELP tlgate_worker_ejections_total Workers ejected by passive health after failing before the first byte, by served model and the failure that ejected them.
# TYPE tlgate_worker_ejections_total counter
tlgate_worker_ejections_total{model="smol",reason="other"} 1
tlgate_worker_ejections_total{model="smol",reason="refused"} 1
# HELP tlgate_queue_length Requests waiting in the admission queue, by model queue.
# TYPE tlgate_queue_length gauge
tlgate_queue_length{model="big"} 2
# HELP tlgate_overloaded_total Requests answered 503 overloaded, by model queue and reason (queue_full, queue_timeout).
# TYPE tlgate_overloaded_total counter
tlgate_overloaded_total{model="smol",reason="queue_timeout"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tlgate_worker_ejections_total", "tlgate_queue_length", "tlgate_overloaded_total", "tlgate_ejected_workers"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.overload.queueWait); n != 1 {
		t.Errorf("queue wait series = %d, want 1", n)
	}
	var nilM *Metrics
	nilM.Ejected("x", "y")
	nilM.SetOverload(nil, nil)
}

// TestCacheAwareTokens: cache_aware's estimated prompt tokens and the part
// its picks held are counted per route; a matched count above the prompt
// is clamped to it and an empty prompt counts nothing.
func TestCacheAwareTokens(t *testing.T) {
	m, _ := newTest(t)
	m.CacheAware("smol", 100, 40)
	m.CacheAware("smol", 50, 80)
	m.CacheAware("smol", 0, 10)
	m.CacheAware("big", 10, 0)
	for _, c := range []struct {
		vec         *prometheus.CounterVec
		route       string
		want        float64
		description string
	}{
		{m.cachePrompt, "smol", 150, "prompt tokens"},
		{m.cacheMatched, "smol", 90, "matched tokens"},
		{m.cachePrompt, "big", 10, "prompt tokens"},
		{m.cacheMatched, "big", 0, "matched tokens"},
	} {
		if got := testutil.ToFloat64(c.vec.WithLabelValues(c.route)); got != c.want {
			t.Errorf("%s of %s = %v, want %v", c.description, c.route, got, c.want)
		}
	}
}

func TestPriorityMetrics(t *testing.T) {
	m, reg := newTest(t)
	m.Admission("chat", 10, "team", AdmissionQueued)
	m.Admission("chat", 10, "team", AdmissionDispatched)
	m.Admission("chat", -1, "batch", AdmissionShed)
	m.Admission("chat", -1, "batch", "weird")
	m.SetWaiting([]Waiting{{Queue: "chat", Priority: 10, Key: "team", N: 2}})
	m.SetWaiting([]Waiting{{Queue: "chat", Priority: -1, Key: "batch", N: 5}})
	m.Objective(10, "team", ObjectiveMet)
	m.Objective(10, "team", ObjectiveMissed)
	want := `
# HELP tlgate_admission_total Admission control's decisions on requests, by model queue, priority band, API key and outcome (dispatched, queued, shed, objective_unreachable, overloaded, gone); a request that waits counts queued, then its way out.
# TYPE tlgate_admission_total counter
tlgate_admission_total{key="batch",model="chat",outcome="other",priority="-1"} 1
tlgate_admission_total{key="batch",model="chat",outcome="shed",priority="-1"} 1
tlgate_admission_total{key="team",model="chat",outcome="dispatched",priority="10"} 1
tlgate_admission_total{key="team",model="chat",outcome="queued",priority="10"} 1
# HELP tlgate_queue_waiting Requests waiting in the admission queue, by model queue, priority band and API key.
# TYPE tlgate_queue_waiting gauge
tlgate_queue_waiting{key="batch",model="chat",priority="-1"} 5
# HELP tlgate_ttft_objective_total Requests with a time-to-first-token objective, by priority band, API key and result (met, missed: answered later, refused: by admission control).
# TYPE tlgate_ttft_objective_total counter
tlgate_ttft_objective_total{key="team",priority="10",result="met"} 1
tlgate_ttft_objective_total{key="team",priority="10",result="missed"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tlgate_admission_total", "tlgate_queue_waiting", "tlgate_ttft_objective_total"); err != nil {
		t.Fatal(err)
	}
	// Priorities past the cap share one series.
	for p := range MaxPriorities + 5 {
		m.Objective(p+100, "team", ObjectiveMet)
	}
	if n := testutil.CollectAndCount(m.priority.objective); n > MaxPriorities+2 {
		t.Errorf("%d objective series, want at most %d", n, MaxPriorities+2)
	}
	var nilM *Metrics
	nilM.Admission("chat", 0, "k", AdmissionQueued)
	nilM.SetWaiting(nil)
	nilM.Objective(0, "k", ObjectiveMet)
}

// TestDeleteWorkersExcept: a worker with an in-flight series that the
// router no longer lists loses its series, also when a scrape set it again
// after DeleteWorker; a listed one keeps them.
func TestDeleteWorkersExcept(t *testing.T) {
	m, reg := newTest(t)
	m.SetInFlight("w1", 2)
	m.SetInFlight("w2", 1)
	m.Attempt("smol", "w1")
	m.DeleteWorker("w1")
	m.SetInFlight("w1", 2) // a scrape whose view predates w1's departure
	m.DeleteWorkersExcept(map[string]bool{"w2": true})
	for _, name := range []string{"tlgate_inflight_requests", "tlgate_attempts_total"} {
		if series(t, reg, name, map[string]string{"worker": "w1"}) != nil {
			t.Errorf("%s still has a w1 series", name)
		}
	}
	if got := value(t, reg, "tlgate_inflight_requests", map[string]string{"worker": "w2"}); got != 1 {
		t.Errorf("inflight{w2} = %v, want 1", got)
	}
}
