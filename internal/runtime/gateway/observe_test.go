package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
	"github.com/tlgate/tlgate/internal/routing/policy"
)

// TestDecisionReasonsAreTheMetricLabels: every reason a pick can carry has
// its own label value on tlgate_route_decision_seconds, not "other".
func TestDecisionReasonsAreTheMetricLabels(t *testing.T) {
	pairs := map[string]string{
		policy.ReasonLeastOutstanding: metrics.DecisionLeastOutstanding,
		policy.ReasonWeighted:         metrics.DecisionWeighted,
		policy.ReasonAffinity:         metrics.DecisionAffinity,
		policy.ReasonLoad:             metrics.DecisionLoad,
		policy.ReasonCache:            metrics.DecisionCache,
	}
	for reason, label := range pairs {
		if reason != label {
			t.Errorf("policy reason %q is counted as %q", reason, label)
		}
	}
}

// TestInstrumentCountsCacheAwareTokens: a routed cache_aware pick adds its
// prompt and matched tokens to the route's counters; another policy's pick
// adds nothing.
func TestInstrumentCountsCacheAwareTokens(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	var d request.Deps
	instrument(&d, m)
	d.OnRouted(nil, router.Target{Route: "m", Reason: policy.ReasonCache, PromptTokens: 500, MatchedTokens: 384}, time.Microsecond)
	d.OnRouted(nil, router.Target{Route: "m", Reason: policy.ReasonLeastOutstanding}, time.Microsecond)
	want := `
# HELP tlgate_cache_aware_matched_tokens_total Of cache_aware_prompt_tokens_total, the tokens of the prefix the prefix index placed on the picked worker, by route: their ratio is the hit rate the gateway expects, to set beside the engines' prefix-cache hit rate.
# TYPE tlgate_cache_aware_matched_tokens_total counter
tlgate_cache_aware_matched_tokens_total{route="m"} 384
# HELP tlgate_cache_aware_prompt_tokens_total Prompt tokens (estimated from bytes, cache_aware_bytes_per_token) of the requests cache_aware routed, by route.
# TYPE tlgate_cache_aware_prompt_tokens_total counter
tlgate_cache_aware_prompt_tokens_total{route="m"} 500
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tlgate_cache_aware_matched_tokens_total", "tlgate_cache_aware_prompt_tokens_total"); err != nil {
		t.Fatal(err)
	}
}
