package config

import (
	"maps"
	"slices"
	"time"

	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Ejection is the [gateway.ejection] table: passive health (outlier
// ejection). A worker whose attempts fail before the first byte
// ConsecutiveFailures times in a row (ConsecutiveRefused times for refused
// connections) stops receiving requests for BaseTime × the number of times
// it has been ejected, at most MaxTime. At most MaxPercent of a model's
// workers of one role are ejected at once; 0 turns ejection off.
type Ejection struct {
	// ConsecutiveFailures is N: failures (refused, reset, 5xx, timeouts, an
	// engine closing before its answer) in a row that eject a worker.
	ConsecutiveFailures int `toml:"consecutive_failures"`
	// ConsecutiveRefused is the N for refused connections (a dead engine).
	ConsecutiveRefused int `toml:"consecutive_refused"`
	// BaseTime is the first ejection's length; the k-th lasts k × BaseTime.
	BaseTime Duration `toml:"base_time"`
	// MaxTime caps an ejection's length.
	MaxTime Duration `toml:"max_time"`
	// MaxPercent bounds the share of a pool's workers ejected at once
	// (rounded down; 0 disables ejection).
	MaxPercent int `toml:"max_percent"`
}

// Admission is the [gateway.admission] table: a concurrency limit per
// worker and, when a model's workers are full, a bounded per-model queue
// with a deadline, in priority bands, fair across API keys.
type Admission struct {
	// Enabled turns limits and the queue on (the default); off, requests
	// go straight to the engines' own queues.
	Enabled bool `toml:"enabled"`
	// LimitScope is LimitScopePool (the default: the limits bind on a
	// model's workers together, so below their sum a request goes where
	// the route policy sends it, as with admission off) or
	// LimitScopeWorker (each worker's limit binds: one at its limit is no
	// candidate).
	LimitScope string `toml:"limit_scope"`
	// SaturationQueueDepth, SaturationKVUse and SaturationTTFT say when an
	// engine's reports show it saturated: that many queued or more, that
	// share of its KV cache in use or more, a recent TTFT that long or
	// more (0: not judged by it). When every worker of a model is, its
	// requests wait and its sheddable ones are refused.
	SaturationQueueDepth int      `toml:"saturation_queue_depth"`
	SaturationKVUse      float64  `toml:"saturation_kv_use"`
	SaturationTTFT       Duration `toml:"saturation_ttft"`
	// WorkerConcurrency is the gateway's in-flight limit per worker; 0
	// derives it from the engine's reports (the most sequences it reported
	// running while it also reported a queue; no limit until it has).
	WorkerConcurrency int `toml:"worker_concurrency"`
	// ModelConcurrency overrides the limit for the workers of a served
	// model id.
	ModelConcurrency map[string]int `toml:"model_concurrency"`
	// EngineConcurrency overrides the limit for one worker id (it wins over
	// ModelConcurrency).
	EngineConcurrency map[string]int `toml:"engine_concurrency"`
	// QueueSize bounds each model's queue (requests waiting).
	QueueSize int `toml:"queue_size"`
	// QueueTimeout is how long a request may wait in the queue.
	QueueTimeout Duration `toml:"queue_timeout"`
}

// Defaults of the overload tables.
const (
	DefaultConsecutiveFailures = 3
	DefaultConsecutiveRefused  = 1
	DefaultEjectionBase        = 10 * time.Second
	DefaultEjectionMax         = 5 * time.Minute
	DefaultEjectionMaxPercent  = 50
	DefaultQueueSize           = 1024
	DefaultQueueTimeout        = 30 * time.Second
	DefaultSaturationQueue     = 5
)

// Scopes of the admission limits (gateway.admission.limit_scope).
const (
	LimitScopePool   = "pool"
	LimitScopeWorker = "worker"
)

func defaultEjection() Ejection {
	return Ejection{
		ConsecutiveFailures: DefaultConsecutiveFailures, ConsecutiveRefused: DefaultConsecutiveRefused,
		BaseTime: D(DefaultEjectionBase), MaxTime: D(DefaultEjectionMax), MaxPercent: DefaultEjectionMaxPercent,
	}
}

func defaultAdmission() Admission {
	return Admission{Enabled: true, LimitScope: LimitScopePool, SaturationQueueDepth: DefaultSaturationQueue,
		ModelConcurrency: map[string]int{}, EngineConcurrency: map[string]int{}, QueueSize: DefaultQueueSize, QueueTimeout: D(DefaultQueueTimeout)}
}

func (v *checker) overload(e Ejection, a Admission) {
	if e.ConsecutiveFailures < 1 {
		v.add("gateway.ejection.consecutive_failures", "must be >= 1, got %d", e.ConsecutiveFailures)
	}
	if e.ConsecutiveRefused < 1 {
		v.add("gateway.ejection.consecutive_refused", "must be >= 1, got %d", e.ConsecutiveRefused)
	}
	v.positive("gateway.ejection.base_time", e.BaseTime)
	v.positive("gateway.ejection.max_time", e.MaxTime)
	if e.MaxTime.Duration > 0 && e.MaxTime.Duration < e.BaseTime.Duration {
		v.add("gateway.ejection.max_time", "must be >= base_time (%s), got %s", e.BaseTime.Duration, e.MaxTime.Duration)
	}
	if e.MaxPercent < 0 || e.MaxPercent > 100 {
		v.add("gateway.ejection.max_percent", "must be from 0 to 100, got %d", e.MaxPercent)
	}

	if a.WorkerConcurrency < 0 {
		v.add("gateway.admission.worker_concurrency", "must be >= 0 (0: from the engine's reports), got %d", a.WorkerConcurrency)
	}
	for _, k := range slices.Sorted(maps.Keys(a.ModelConcurrency)) {
		if err := routes.CheckModelID(k); err != nil {
			v.add("gateway.admission.model_concurrency."+k, "%s", err)
		}
		if n := a.ModelConcurrency[k]; n < 1 {
			v.add("gateway.admission.model_concurrency."+k, "must be >= 1, got %d", n)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(a.EngineConcurrency)) {
		if err := checkEngineID(k); err != nil {
			v.add("gateway.admission.engine_concurrency."+k, "%s", err)
		}
		if n := a.EngineConcurrency[k]; n < 1 {
			v.add("gateway.admission.engine_concurrency."+k, "must be >= 1, got %d", n)
		}
	}
	if a.QueueSize < 0 {
		v.add("gateway.admission.queue_size", "must be >= 0 (0: no queue, 503 at once), got %d", a.QueueSize)
	}
	v.positive("gateway.admission.queue_timeout", a.QueueTimeout)
	switch a.LimitScope {
	case LimitScopePool, LimitScopeWorker:
	default:
		v.add("gateway.admission.limit_scope", "must be %q or %q, got %q", LimitScopePool, LimitScopeWorker, a.LimitScope)
	}
	if a.SaturationQueueDepth < 0 {
		v.add("gateway.admission.saturation_queue_depth", "must be >= 0 (0: not judged by the queue), got %d", a.SaturationQueueDepth)
	}
	if !(a.SaturationKVUse >= 0 && a.SaturationKVUse <= 1) {
		v.add("gateway.admission.saturation_kv_use", "must be from 0 (not judged by the KV cache) to 1, got %v", a.SaturationKVUse)
	}
	if a.SaturationTTFT.Duration < 0 {
		v.add("gateway.admission.saturation_ttft", "must be >= 0 (0: not judged by the TTFT), got %s", a.SaturationTTFT.Duration)
	}
}
