package metrics

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestKeyMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	k, err := NewKeyMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewKeyMetrics(reg); err == nil {
		t.Fatal("registering twice succeeded")
	}
	if _, err := NewKeyMetrics(nil); err == nil {
		t.Fatal("nil registerer accepted")
	}
	k.Tokens("alice", "smol", 10, 5)
	k.Tokens("alice", "smol", 1, 0)
	k.Tokens("bob", "big", 0, 7)
	k.Tokens("bob", "big", 0, 0)
	k.KeyRequest("alice", OutcomeOK)
	k.KeyRequest("alice", "weird")
	k.RateLimited("bob", LimitTokens)
	k.RateLimited("bob", "nonsense")
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"tlgate_tokens_total", map[string]string{"key": "alice", "model": "smol", "kind": "prompt"}, 11},
		{"tlgate_tokens_total", map[string]string{"key": "alice", "model": "smol", "kind": "completion"}, 5},
		{"tlgate_tokens_total", map[string]string{"key": "bob", "model": "big", "kind": "completion"}, 7},
		{"tlgate_key_requests_total", map[string]string{"key": "alice", "outcome": "ok"}, 1},
		{"tlgate_key_requests_total", map[string]string{"key": "alice", "outcome": Other}, 1},
		{"tlgate_key_requests_total", map[string]string{"key": "bob", "outcome": "rate_limited"}, 2},
		{"tlgate_rate_limited_total", map[string]string{"key": "bob", "limit": "tokens"}, 1},
		{"tlgate_rate_limited_total", map[string]string{"key": "bob", "limit": Other}, 1},
	} {
		if got := value(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	var nilK *KeyMetrics
	nilK.Tokens("a", "b", 1, 1)
	nilK.KeyRequest("a", OutcomeOK)
	nilK.RateLimited("a", LimitRequests)
}

func TestKeyMetricsCapped(t *testing.T) {
	k := newKeyMetrics(2, 2)
	for i := range 10 {
		k.Tokens(fmt.Sprintf("key%d", i), fmt.Sprintf("model%d", i), 1, 1)
		k.KeyRequest(fmt.Sprintf("key%d", i), OutcomeOK)
	}
	// 2 keys × 2 models admitted, the rest under other: (k0,m0), (k1,m1),
	// (other, other), 2 kinds each.
	if n := testutil.CollectAndCount(k.tokens); n != 6 {
		t.Errorf("token series = %d, want 6", n)
	}
	if n := testutil.CollectAndCount(k.requests); n != 3 {
		t.Errorf("request series = %d, want 3", n)
	}
	if got := testutil.ToFloat64(k.tokens.WithLabelValues(Other, Other, KindPrompt)); got != 8 {
		t.Errorf("other prompt tokens = %v, want 8", got)
	}
}

func TestKeyTokensDoNotAllocate(t *testing.T) {
	k := newKeyMetrics(MaxKeys, MaxModels)
	k.Tokens("alice", "smol", 1, 1)
	if a := testing.AllocsPerRun(100, func() { k.Tokens("alice", "smol", 3, 4) }); a != 0 {
		t.Fatalf("%v allocations per Tokens, want 0", a)
	}
}
