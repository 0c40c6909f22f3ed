package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Disaggregation protocols: the protocol label of the tlgate_disagg_*
// metrics (fleet.Protocol's values).
const (
	ProtocolTLGate = "tlgate"
	ProtocolVLLM   = "vllm"
	ProtocolSGLang = "sglang"
)

// Legs of a disaggregated request: the leg label of
// tlgate_disagg_leg_duration_seconds and tlgate_disagg_leg_failures_total
// (tlgate's contract also fails in its tokenize phase).
const (
	LegPrefill  = "prefill"
	LegDecode   = "decode"
	LegTokenize = "tokenize"
)

var (
	protocols   = fixedSet{ProtocolTLGate, ProtocolVLLM, ProtocolSGLang}
	failedLegs  = fixedSet{LegPrefill, LegDecode, LegTokenize}
	legFailures = fixedSet{FailoverRefused, FailoverReset, FailoverTimeout, FailoverStatus503, FailoverEOF,
		FailoverTransport, FailoverTooLarge, FailoverStatus5xx, FailoverBadAnswer, FailoverTruncated, "engine_error", "canceled"}
)

// pairBuckets count the pairs a disaggregated request tried.
func pairBuckets() []float64 { return []float64{1, 2, 3, 4, 5, 8} }

// pdMetrics are the metrics of disaggregated requests.
type pdMetrics struct {
	legs     *prometheus.HistogramVec
	transfer *prometheus.HistogramVec
	pairs    *prometheus.HistogramVec
	failures *prometheus.CounterVec
}

func newPDMetrics() pdMetrics {
	return pdMetrics{
		legs: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "disagg_leg_duration_seconds",
			Help: "Duration of the legs of disaggregated requests that ended, by protocol (tlgate, vllm, sglang) and leg: " +
				"prefill (the prefill engine's request, or tlgate's Prefill call) and decode (the decode engine's request, to its answer's end).",
			Buckets: durationBuckets()}, []string{lProtocol, lLeg}),
		transfer: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "disagg_transfer_wait_seconds",
			Help: "Time from a disaggregated request's prefill leg's end to its decode engine's first byte (streamed requests), by protocol: " +
				"the KV transfer and the first decode step.", Buckets: latencyBuckets()}, []string{lProtocol}),
		pairs: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "disagg_pairs_tried",
			Help: "Prefill/decode pairs a disaggregated request tried, by protocol.", Buckets: pairBuckets()}, []string{lProtocol}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "disagg_leg_failures_total",
			Help: "Legs of disaggregated requests that failed before the first byte, by protocol, leg and reason (the proxy's failure reasons)."},
			[]string{lProtocol, lLeg, lReason}),
	}
}

func (p *pdMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{p.legs, p.transfer, p.pairs, p.failures}
}

// LegFailure is one failed leg of a disaggregated request.
type LegFailure struct{ Leg, Reason string }

// Disaggregated records a finished disaggregated request of protocol:
// tlgate_disagg_pairs_tried, its last pair's leg durations and transfer
// wait (zero: not measured) and its failed legs.
func (m *Metrics) Disaggregated(protocol string, pairs int, prefill, decode, transfer time.Duration, failures []LegFailure) {
	if m == nil {
		return
	}
	pl := protocols.label(protocol)
	m.pd.pairs.WithLabelValues(pl).Observe(float64(pairs))
	if prefill > 0 {
		m.pd.legs.WithLabelValues(pl, LegPrefill).Observe(seconds(prefill))
	}
	if decode > 0 {
		m.pd.legs.WithLabelValues(pl, LegDecode).Observe(seconds(decode))
	}
	if transfer > 0 {
		m.pd.transfer.WithLabelValues(pl).Observe(seconds(transfer))
	}
	for _, f := range failures {
		m.pd.failures.WithLabelValues(pl, failedLegs.label(f.Leg), legFailures.label(f.Reason)).Inc()
	}
}
