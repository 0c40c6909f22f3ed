package gateway

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
)

// overloadConfig fills the router's passive health and admission control
// from the configuration, with their events going to m and the log.
func overloadConfig(rc *router.Config, gw config.Gateway, m *metrics.Metrics, log zerolog.Logger) {
	e, a := gw.Ejection, gw.Admission
	rc.Ejection = router.EjectionConfig{
		Failures: e.ConsecutiveFailures, Refused: e.ConsecutiveRefused,
		Base: e.BaseTime.Duration, Max: e.MaxTime.Duration, MaxPercent: e.MaxPercent,
	}
	rc.Admission = router.AdmissionConfig{
		Enabled: a.Enabled, PerWorker: a.LimitScope == config.LimitScopeWorker,
		Worker: a.WorkerConcurrency, Model: a.ModelConcurrency, Engine: a.EngineConcurrency,
		QueueSize: a.QueueSize, QueueTimeout: a.QueueTimeout.Duration,
		Saturation: router.SaturationConfig{QueueDepth: a.SaturationQueueDepth, KVUse: a.SaturationKVUse, TTFT: a.SaturationTTFT.Duration},
	}
	rc.Observe = router.Observer{
		OnEject: func(worker, model, reason string, until time.Time) {
			m.Ejected(model, reason)
			log.Warn().Str("worker", worker).Str("model", model).Str("reason", reason).Time("ejected_until", until).Msg("worker ejected")
		},
		OnQueueLeft:  m.QueueLeft,
		OnOverloaded: m.Overloaded,
		OnAdmission:  m.Admission,
	}
}

// ejectedByModel counts the workers ejected now per served model.
func ejectedByModel(ws []router.WorkerView) map[string]int {
	out := map[string]int{}
	for _, w := range ws {
		if !w.EjectedUntil.IsZero() {
			out[w.Model]++
		}
	}
	return out
}
