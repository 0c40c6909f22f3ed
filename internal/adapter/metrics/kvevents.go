package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Label names of the KV events metrics.
const (
	lProblem   = "problem"
	lTier      = "tier"
	lView      = "view"
	lOp        = "op"
	lRecovered = "recovered"
	lResult    = "result"
)

// Sources of a KV events batch: the source label of
// tlgate_kv_events_batches_total.
const (
	KVLive     = "live"
	KVReplayed = "replay"
)

// Cache views of a cache_aware pick: the view label of
// tlgate_cache_aware_picks_total.
const (
	ViewExact       = "exact"
	ViewApproximate = "approximate"
	// ViewAgreed: the prefix index, which agreed with the exact view
	// lately, without tokenizing the request (router.ViewAgreed).
	ViewAgreed = "agreed"
)

// Results of an exact pick's check against the prefix index: the result
// label of tlgate_cache_aware_agreement_checks_total.
const (
	CheckAgreed    = "agreed"
	CheckDisagreed = "disagreed"
)

// Outcomes of a tokenization: the outcome label of
// tlgate_tokenize_seconds.
const (
	TokenizeOK      = "ok"      // the tokenizer answered
	TokenizeCached  = "cached"  // the cache had the prompt, whole or a verified prefix
	TokenizeTimeout = "timeout" // past the deadline: routed on the prefix index
	TokenizeError   = "error"   // the tokenizer failed (or is known to fail): routed on the prefix index
)

var (
	kvProblems  = fixedSet{"malformed", "oversized", "flood", "queue_full", "backwards", "restart", "disconnected", "unrecovered"}
	kvTiers     = fixedSet{"gpu", "cpu", "disk", "other"}
	kvViews     = fixedSet{ViewExact, ViewApproximate, ViewAgreed}
	checks      = fixedSet{CheckAgreed, CheckDisagreed}
	kvOps       = fixedSet{"stored", "removed", "cleared", "unresolved", "evicted"}
	tokOutcomes = fixedSet{TokenizeOK, TokenizeCached, TokenizeTimeout, TokenizeError}
	tokCache    = fixedSet{"hit", "prefix", "miss"}
)

// KVMetrics are the metrics of routing on the engines' KV cache events:
// what each engine's subscription received and lost, what the exact views
// hold, the tokenizations routing on them needed, and the picks made on
// them. The methods are safe for concurrent use and do nothing on a nil
// *KVMetrics.
type KVMetrics struct {
	workers   *names
	batches   *prometheus.CounterVec
	events    *prometheus.CounterVec
	gaps      *prometheus.CounterVec
	replays   *prometheus.CounterVec
	problems  *prometheus.CounterVec
	connected *prometheus.GaugeVec
	blocks    *prometheus.CounterVec
	index     *prometheus.GaugeVec
	stale     prometheus.Gauge
	views     *prometheus.GaugeVec
	picks     *prometheus.CounterVec
	tokenize  *prometheus.HistogramVec
	tokCache  *prometheus.CounterVec
	agreement *prometheus.CounterVec
}

// NewKVMetrics creates the KV events metrics and registers them on reg; it
// fails, registering nothing, when reg is nil or refuses one.
func NewKVMetrics(reg prometheus.Registerer) (*KVMetrics, error) {
	if reg == nil {
		return nil, ErrNilRegisterer
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, labels)
	}
	k := &KVMetrics{
		workers: newNames(MaxWorkers),
		batches: counter("kv_events_batches_total", "KV event batches received and decoded, by worker and source (live: the PUB socket; replay: the replay socket).", lWorker, lSource),
		events:  counter("kv_events_total", "KV cache events received in those batches, by worker.", lWorker),
		gaps:    counter("kv_events_gaps_total", "Gaps in a worker's batch sequence, by worker and whether the replay filled it.", lWorker, lRecovered),
		replays: counter("kv_events_replays_total", "Replay requests to a worker's replay socket, by worker and outcome.", lWorker, lOutcome),
		problems: counter("kv_events_problems_total", "KV events refused or lost, by worker and problem (malformed, oversized, flood, queue_full, "+
			"backwards, restart, disconnected, unrecovered).", lWorker, lProblem),
		connected: gauge("kv_events_connected", "Whether a worker's KV events connection is up (1) or not (0).", lWorker),
		blocks:    counter("kv_index_blocks_total", "Blocks the exact views applied, by worker and op (stored, removed, cleared events, unresolved, evicted).", lWorker, lOp),
		index:     gauge("kv_index_blocks", "Blocks a worker's exact view holds, by worker and tier (a block in two tiers counts in both).", lWorker, lTier),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "kv_events_stale_workers",
			Help: "Workers whose exact view is stale: their events were lost or are late, and they are routed on the prefix index."}),
		views: gauge("kv_events_workers", "Workers with a KV events subscription, by view (exact, stale, approximate while pending).", lView),
		picks: counter("cache_aware_picks_total", "cache_aware picks, by route and the view the picked worker was scored on (exact: its KV events; "+
			"approximate: the prefix index; agreed: the prefix index, without tokenizing, while it agrees with the KV events).", lRoute, lView),
		agreement: counter("cache_aware_agreement_checks_total", "Picks on the KV events checked against the pick the prefix index alone "+
			"would have made, by result (agreed: the same worker, or one as good within a request's load and a block; disagreed).", lResult),
		tokenize: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "tokenize_seconds",
			Help:    "What tokenizing a request for routing on KV events added before its pick, by outcome (ok, cached, timeout, error).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}}, []string{lOutcome}),
		tokCache: counter("tokenize_cache_total", "Lookups of the tokenization cache, by result (hit: the whole prompt; prefix: a conversation's "+
			"earlier turns; miss).", lResult),
	}
	cs := []prometheus.Collector{k.batches, k.events, k.gaps, k.replays, k.problems, k.connected, k.blocks, k.index, k.stale, k.views, k.picks, k.tokenize, k.tokCache, k.agreement}
	if err := registerAll(reg, cs...); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *KVMetrics) worker(w string) string { return k.workers.label(w) }

// Received counts a decoded batch of n events from worker (implements the
// subscriber's observer).
func (k *KVMetrics) Received(worker string, n int, replayed bool) {
	if k == nil {
		return
	}
	src := KVLive
	if replayed {
		src = KVReplayed
	}
	w := k.worker(worker)
	k.batches.WithLabelValues(w, src).Inc()
	k.events.WithLabelValues(w).Add(float64(n))
}

// Gap counts a gap in worker's sequence.
func (k *KVMetrics) Gap(worker string, _ uint64, recovered bool) {
	if k == nil {
		return
	}
	r := "false"
	if recovered {
		r = "true"
	}
	k.gaps.WithLabelValues(k.worker(worker), r).Inc()
}

// Replayed counts a replay request.
func (k *KVMetrics) Replayed(worker string, _ int, err error) {
	if k == nil {
		return
	}
	o := ResultOK
	if err != nil {
		o = ResultError
	}
	k.replays.WithLabelValues(k.worker(worker), o).Inc()
}

// Problem counts a refused or lost event stream's problem.
func (k *KVMetrics) Problem(worker, problem string) {
	if k == nil {
		return
	}
	k.problems.WithLabelValues(k.worker(worker), kvProblems.label(problem)).Inc()
}

// Connected sets whether worker's connection is up.
func (k *KVMetrics) Connected(worker string, up bool) {
	if k == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	k.connected.WithLabelValues(k.worker(worker)).Set(v)
}

// Applied counts what the exact view of worker applied: its stored,
// removed, cleared, unresolved and evicted blocks.
func (k *KVMetrics) Applied(worker string, stored, removed, cleared, unresolved, evicted int) {
	if k == nil {
		return
	}
	w := k.worker(worker)
	for i, n := range []int{stored, removed, cleared, unresolved, evicted} {
		if n > 0 {
			k.blocks.WithLabelValues(w, kvOps[i]).Add(float64(n))
		}
	}
}

// KVView is one worker's exact view for SetViews.
type KVView struct {
	Worker string
	View   string         // exact, stale or approximate (pending)
	Blocks map[string]int // by tier
}

// SetViews replaces the exact views' gauges, at scrape time.
func (k *KVMetrics) SetViews(views []KVView) {
	if k == nil {
		return
	}
	k.index.Reset()
	k.views.Reset()
	stale := 0
	counts := map[string]int{}
	for _, v := range views {
		w := k.worker(v.Worker)
		for _, t := range kvTiers {
			k.index.WithLabelValues(w, t).Set(float64(v.Blocks[t]))
		}
		counts[v.View]++
		if v.View == "stale" {
			stale++
		}
	}
	for view, n := range counts {
		k.views.WithLabelValues(view).Set(float64(n))
	}
	k.stale.Set(float64(stale))
}

// Pick counts a cache_aware pick of route on view ("" counts nothing).
func (k *KVMetrics) Pick(route, view string) {
	if k == nil || view == "" {
		return
	}
	k.picks.WithLabelValues(route, kvViews.label(view)).Inc()
}

// Agreement counts an exact pick's check against the prefix index's.
func (k *KVMetrics) Agreement(_ string, agreed bool) {
	if k == nil {
		return
	}
	r := 1
	if agreed {
		r = 0
	}
	k.agreement.WithLabelValues(checks[r]).Inc()
}

// Tokenized records what tokenizing a request added, by outcome.
func (k *KVMetrics) Tokenized(outcome string, d time.Duration) {
	if k == nil {
		return
	}
	k.tokenize.WithLabelValues(tokOutcomes.label(outcome)).Observe(d.Seconds())
}

// TokenCache counts a lookup of the tokenization cache (hit, prefix,
// miss).
func (k *KVMetrics) TokenCache(result string) {
	if k == nil {
		return
	}
	k.tokCache.WithLabelValues(tokCache.label(result)).Inc()
}

// Forget drops a worker's series (its subscription ended).
func (k *KVMetrics) Forget(worker string) {
	if k == nil || !k.workers.forget(worker) {
		return
	}
	for _, v := range []*prometheus.CounterVec{k.batches, k.events, k.gaps, k.replays, k.problems, k.blocks} {
		v.DeletePartialMatch(prometheus.Labels{lWorker: worker})
	}
	k.connected.DeletePartialMatch(prometheus.Labels{lWorker: worker})
	k.index.DeletePartialMatch(prometheus.Labels{lWorker: worker})
}
