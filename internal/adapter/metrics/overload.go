package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Ejection reasons: the reason label of tlgate_worker_ejections_total, the
// proxy's failure reasons plus status_5xx (a 5xx answer other than 503).
const EjectStatus5xx = "status_5xx"

// Queue outcomes: the outcome label of tlgate_queue_wait_seconds.
const (
	QueueServed     = "served"                // a worker freed up: the request was routed
	QueueOverloaded = "overloaded"            // timed out or displaced: 503 overloaded
	QueueGone       = "gone"                  // the client went away while waiting
	QueueShed       = "shed"                  // sheddable, shed: its model saturated (429 saturated)
	QueueObjective  = "objective_unreachable" // its TTFT objective went out of reach (429)
)

// Overload reasons: the reason label of tlgate_overloaded_total.
const (
	OverloadQueueFull    = "queue_full"    // no room in the queue (or displaced by a lighter key)
	OverloadQueueTimeout = "queue_timeout" // waited queue_timeout
)

var (
	ejectReasons    = fixedSet{FailoverRefused, FailoverReset, FailoverTimeout, FailoverStatus503, FailoverEOF, FailoverTransport, EjectStatus5xx}
	queueOutcomes   = fixedSet{QueueServed, QueueOverloaded, QueueGone, QueueShed, QueueObjective}
	overloadReasons = fixedSet{OverloadQueueFull, OverloadQueueTimeout}
)

// waitBuckets fit a wait in the admission queue: 1 ms to 60 s.
func waitBuckets() []float64 {
	return []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60}
}

// overloadMetrics are the metrics of outlier ejection and admission
// control.
type overloadMetrics struct {
	ejections  *prometheus.CounterVec
	ejected    *prometheus.GaugeVec
	queueLen   *prometheus.GaugeVec
	queueWait  *prometheus.HistogramVec
	overloaded *prometheus.CounterVec
}

func newOverloadMetrics() overloadMetrics {
	return overloadMetrics{
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "worker_ejections_total",
			Help: "Workers ejected by passive health after failing before the first byte, by served model and the failure that ejected them."}, []string{lModel, lReason}),
		ejected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "ejected_workers",
			Help: "Workers ejected now, by served model."}, []string{lModel}),
		queueLen: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "queue_length",
			Help: "Requests waiting in the admission queue, by model queue."}, []string{lModel}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "queue_wait_seconds",
			Help: "Time requests waited in the admission queue, by model queue and outcome (served, overloaded, gone, shed, objective_unreachable).", Buckets: waitBuckets()}, []string{lModel, lOutcome}),
		overloaded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "overloaded_total",
			Help: "Requests answered 503 overloaded, by model queue and reason (queue_full, queue_timeout)."}, []string{lModel, lReason}),
	}
}

func (o *overloadMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{o.ejections, o.ejected, o.queueLen, o.queueWait, o.overloaded}
}

// Ejected counts tlgate_worker_ejections_total{model, reason}: a worker of
// served model was ejected after reason (a Failover constant or
// EjectStatus5xx; anything else counts as Other).
func (m *Metrics) Ejected(model, reason string) {
	if m == nil {
		return
	}
	m.overload.ejections.WithLabelValues(m.modelNames.label(model), ejectReasons.label(reason)).Inc()
}

// QueueLeft observes tlgate_queue_wait_seconds{model, outcome}: a request
// left queue after waited, with a Queue outcome.
func (m *Metrics) QueueLeft(queue, outcome string, waited time.Duration) {
	if m == nil {
		return
	}
	m.overload.queueWait.WithLabelValues(m.modelNames.label(queue), queueOutcomes.label(outcome)).Observe(seconds(waited))
}

// Overloaded counts tlgate_overloaded_total{model, reason}.
func (m *Metrics) Overloaded(queue, reason string) {
	if m == nil {
		return
	}
	m.overload.overloaded.WithLabelValues(m.modelNames.label(queue), overloadReasons.label(reason)).Inc()
}

// SetOverload replaces tlgate_queue_length and tlgate_ejected_workers with
// the given counts per model (models absent are deleted).
func (m *Metrics) SetOverload(queued, ejected map[string]int) {
	if m == nil {
		return
	}
	set := func(g *prometheus.GaugeVec, counts map[string]int) {
		g.Reset()
		for model, n := range counts {
			g.WithLabelValues(m.modelNames.label(model)).Add(float64(n))
		}
	}
	set(m.overload.queueLen, queued)
	set(m.overload.ejected, ejected)
}
