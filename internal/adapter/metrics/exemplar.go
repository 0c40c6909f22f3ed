package metrics

import "github.com/prometheus/client_golang/prometheus"

// ExemplarTraceID is the exemplar label that names a trace.
const ExemplarTraceID = "trace_id"

// observe records v on o, with traceID as an exemplar when it is not empty
// (exemplars show on /metrics in the OpenMetrics format). Without a trace
// id it is a plain Observe and allocates nothing.
func observe(o prometheus.Observer, v float64, traceID string) {
	if traceID != "" {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, prometheus.Labels{ExemplarTraceID: traceID})
			return
		}
	}
	o.Observe(v)
}
