package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxPriorities caps the distinct values of the priority label: the first
// ones seen keep their own series, later ones share Other. Priorities come
// from routes, keys and the x-tlgate-priority header (capped per key).
const MaxPriorities = 32

// Admission outcomes: the outcome label of tlgate_admission_total.
const (
	AdmissionDispatched = "dispatched"            // sent to a worker, at once or after waiting
	AdmissionQueued     = "queued"                // started waiting in the queue
	AdmissionShed       = "shed"                  // sheddable, refused: its model saturated (429 saturated)
	AdmissionObjective  = "objective_unreachable" // its TTFT objective out of reach (429)
	AdmissionOverloaded = "overloaded"            // queue full, displaced or timed out (503 overloaded)
	AdmissionGone       = "gone"                  // its client went away while it waited
)

// Objective results: the result label of tlgate_ttft_objective_total.
const (
	ObjectiveMet     = "met"     // answered within its TTFT objective
	ObjectiveMissed  = "missed"  // answered, its first byte later than its objective
	ObjectiveRefused = "refused" // refused by admission (objective_unreachable, saturated, overloaded)
)

var (
	admissionOutcomes = fixedSet{AdmissionDispatched, AdmissionQueued, AdmissionShed, AdmissionObjective, AdmissionOverloaded, AdmissionGone}
	objectiveResults  = fixedSet{ObjectiveMet, ObjectiveMissed, ObjectiveRefused}
)

const lPriority = "priority"

// priorityMetrics are the metrics of priority bands and TTFT objectives.
type priorityMetrics struct {
	admission *prometheus.CounterVec
	waiting   *prometheus.GaugeVec
	objective *prometheus.CounterVec
	prios     *names
	keys      *names
}

func newPriorityMetrics() priorityMetrics {
	return priorityMetrics{
		admission: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "admission_total",
			Help: "Admission control's decisions on requests, by model queue, priority band, API key and outcome " +
				"(dispatched, queued, shed, objective_unreachable, overloaded, gone); a request that waits counts queued, then its way out."},
			[]string{lModel, lPriority, lKey, lOutcome}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "queue_waiting",
			Help: "Requests waiting in the admission queue, by model queue, priority band and API key."}, []string{lModel, lPriority, lKey}),
		objective: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "ttft_objective_total",
			Help: "Requests with a time-to-first-token objective, by priority band, API key and result " +
				"(met, missed: answered later, refused: by admission control)."}, []string{lPriority, lKey, lResult}),
		prios: newNames(MaxPriorities),
		keys:  newNames(MaxKeys),
	}
}

func (p *priorityMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{p.admission, p.waiting, p.objective}
}

func (p *priorityMetrics) prio(n int) string { return p.prios.label(strconv.Itoa(n)) }

// Admission counts tlgate_admission_total{model, priority, key, outcome}.
func (m *Metrics) Admission(queue string, priority int, key, outcome string) {
	if m == nil {
		return
	}
	p := &m.priority
	p.admission.WithLabelValues(m.modelNames.label(queue), p.prio(priority), p.keys.label(key), admissionOutcomes.label(outcome)).Inc()
}

// Waiting is the requests of one key in one priority band of a queue.
type Waiting struct {
	Queue    string
	Priority int
	Key      string
	N        int
}

// SetWaiting replaces tlgate_queue_waiting with ws.
func (m *Metrics) SetWaiting(ws []Waiting) {
	if m == nil {
		return
	}
	p := &m.priority
	p.waiting.Reset()
	for _, w := range ws {
		p.waiting.WithLabelValues(m.modelNames.label(w.Queue), p.prio(w.Priority), p.keys.label(w.Key)).Add(float64(w.N))
	}
}

// Objective counts tlgate_ttft_objective_total{priority, key, result}.
func (m *Metrics) Objective(priority int, key, result string) {
	if m == nil {
		return
	}
	p := &m.priority
	p.objective.WithLabelValues(p.prio(priority), p.keys.label(key), objectiveResults.label(result)).Inc()
}
