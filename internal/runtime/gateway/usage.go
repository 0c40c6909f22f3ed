package gateway

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
	"github.com/tlgate/tlgate/internal/guard/ratelimit"
	"github.com/tlgate/tlgate/internal/wire/usage"
)

// limiterOf builds the per-key limiter from the configured keys; keys
// without limits are not limited.
func limiterOf(keys []config.APIKey, now func() time.Time) *ratelimit.Limiter {
	return ratelimit.New(limitsOf(keys), now)
}

// limitsOf is the limits of each key, by name.
func limitsOf(keys []config.APIKey) map[string]ratelimit.Limits {
	limits := make(map[string]ratelimit.Limits, len(keys))
	for _, k := range keys {
		limits[k.Name] = ratelimit.Limits{
			RequestsPerMinute: k.RequestsPerMinute, TokensPerMinute: k.TokensPerMinute, MaxConcurrent: k.MaxConcurrent,
		}
	}
	return limits
}

// observeKey records a finished request per key: its outcome and the
// tokens its answers used, under the public model (the route) it matched.
func observeKey(k *metrics.KeyMetrics, ex *request.Exchange, o request.Outcome) {
	outcome, _ := outcomeOf(o)
	k.KeyRequest(ex.KeyName, outcome)
	u := o.Log.Usage
	if u.Total() > 0 && o.Log.Route != "" {
		k.Tokens(ex.KeyName, o.Log.Route, u.PromptTokens, u.CompletionTokens)
	}
}

// logUsage adds a request's usage to its access-log line.
func logUsage(ev *zerolog.Event, u usage.Usage) {
	ev.Int("prompt_tokens", u.PromptTokens).Int("completion_tokens", u.CompletionTokens)
	if u.Estimated {
		ev.Bool("usage_estimated", true)
	}
}
