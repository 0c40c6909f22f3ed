package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// MaxKeys caps the distinct values of the key label. Keys come from the
// configuration, so the cap only guards against a configuration with very
// many keys.
const MaxKeys = 1024

// Token kinds: the kind label of tlgate_tokens_total.
const (
	KindPrompt     = "prompt"
	KindCompletion = "completion"
)

// OutcomeRateLimited is the outcome of tlgate_key_requests_total for a
// request refused by its key's limits (429 rate_limit_exceeded).
const OutcomeRateLimited = "rate_limited"

// Limits: the limit label of tlgate_rate_limited_total (ratelimit.Limit*).
const (
	LimitRequests   = "requests"
	LimitTokens     = "tokens"
	LimitConcurrent = "concurrent"
)

var (
	keyOutcomes = append(append(fixedSet{}, requestOutcomes...), OutcomeRateLimited)
	limitNames  = fixedSet{LimitRequests, LimitTokens, LimitConcurrent}
)

const (
	lKey   = "key"
	lKind  = "kind"
	lLimit = "limit"
)

// keyModel keys the cache of tlgate_tokens_total.
type keyModel struct{ key, model string }

// KeyMetrics are the per-key usage metrics: tokens by key, model and kind,
// requests by key and outcome, and requests refused by a key's limits. Like
// Metrics, every label is bounded (key by MaxKeys, model by MaxModels,
// kind, outcome and limit by fixed sets), its methods are safe for
// concurrent use and do nothing on a nil *KeyMetrics, and the token
// counters are pre-curried so that counting does not allocate once a (key,
// model) pair has been seen.
type KeyMetrics struct {
	tokens   *prometheus.CounterVec
	requests *prometheus.CounterVec
	limited  *prometheus.CounterVec
	share    *prometheus.GaugeVec

	keyNames   *names
	modelNames *names
	tokenCache cache[keyModel, *[2]prometheus.Counter]
}

// NewKeyMetrics creates the per-key metrics and registers them on reg; it
// fails, registering nothing, when reg is nil or refuses one.
func NewKeyMetrics(reg prometheus.Registerer) (*KeyMetrics, error) {
	if reg == nil {
		return nil, ErrNilRegisterer
	}
	k := newKeyMetrics(MaxKeys, MaxModels)
	cs := []prometheus.Collector{k.tokens, k.requests, k.limited, k.share}
	if err := registerAll(reg, cs...); err != nil {
		return nil, err
	}
	return k, nil
}

func newKeyMetrics(maxKeys, maxModels int) *KeyMetrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	}
	return &KeyMetrics{
		tokens: counter("tokens_total",
			"Tokens used by answers, from the engines' usage (or the documented estimate), by API key, public model and kind (prompt or completion).",
			lKey, lModel, lKind),
		requests: counter("key_requests_total",
			"Client inference requests finished, by API key and outcome (those of tlgate_requests_total, and rate_limited).", lKey, lOutcome),
		limited: counter("rate_limited_total",
			"Requests refused by their API key's limits, by key and limit (requests, tokens, concurrent).", lKey, lLimit),
		share: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "key_limit_share",
			Help: "This replica's part of an API key's limit, by key and limit (requests, tokens: per minute; concurrent): " +
				"the whole limit, unless fleet sync splits the keys' limits between the replicas."}, []string{lKey, lLimit}),
		keyNames:   newNames(maxKeys),
		modelNames: newNames(maxModels),
	}
}

// Tokens counts tlgate_tokens_total{key, model, kind}: prompt and
// completion tokens of one request of key on model (the public model asked
// for).
func (k *KeyMetrics) Tokens(key, model string, prompt, completion int) {
	if k == nil || (prompt <= 0 && completion <= 0) {
		return
	}
	c, ok := k.tokenCache.load(keyModel{key, model})
	if !ok {
		c = k.tokensSlow(key, model)
	}
	if prompt > 0 {
		c[0].Add(float64(prompt))
	}
	if completion > 0 {
		c[1].Add(float64(completion))
	}
}

func (k *KeyMetrics) tokensSlow(key, model string) *[2]prometheus.Counter {
	k.tokenCache.mu.Lock()
	defer k.tokenCache.mu.Unlock()
	km := keyModel{key, model}
	if c, ok := k.tokenCache.load(km); ok {
		return c
	}
	kl, ml := k.keyNames.label(key), k.modelNames.label(model)
	c := &[2]prometheus.Counter{
		k.tokens.WithLabelValues(kl, ml, KindPrompt),
		k.tokens.WithLabelValues(kl, ml, KindCompletion),
	}
	if (kl == key || key == "") && (ml == model || model == "") {
		k.tokenCache.storeLocked(km, c)
	}
	return c
}

// KeyRequest counts tlgate_key_requests_total{key, outcome}: one finished
// or refused request of key. outcome is an Outcome constant or
// OutcomeRateLimited; anything else counts as Other.
func (k *KeyMetrics) KeyRequest(key, outcome string) {
	if k == nil {
		return
	}
	k.requests.WithLabelValues(k.keyNames.label(key), keyOutcomes.label(outcome)).Inc()
}

// KeyShare is this replica's part of one limit of one key.
type KeyShare struct {
	Key, Limit string
	Local      int
}

// SetShares replaces tlgate_key_limit_share with ss.
func (k *KeyMetrics) SetShares(ss []KeyShare) {
	if k == nil {
		return
	}
	k.share.Reset()
	for _, s := range ss {
		k.share.WithLabelValues(k.keyNames.label(s.Key), limitNames.label(s.Limit)).Set(float64(s.Local))
	}
}

// RateLimited counts tlgate_rate_limited_total{key, limit} and the
// request's tlgate_key_requests_total{key, outcome="rate_limited"}: a
// request of key refused by limit (a Limit constant; anything else counts
// as Other).
func (k *KeyMetrics) RateLimited(key, limit string) {
	if k == nil {
		return
	}
	kl := k.keyNames.label(key)
	k.limited.WithLabelValues(kl, limitNames.label(limit)).Inc()
	k.requests.WithLabelValues(kl, OutcomeRateLimited).Inc()
}
