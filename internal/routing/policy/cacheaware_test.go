package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
)

func TestCacheAwarePrefersCachedWorker(t *testing.T) {
	c := DefaultCacheAware()
	// A 1,000-token prompt; b holds 900 tokens of it.
	tests := []struct {
		name       string
		loads      []int
		prefill    []int
		want       string
		wantReason string
	}{
		{"cached worker, equal loads", []int{2, 2, 2}, []int{1000, 100, 1000}, "b", ReasonCache},
		// 900 cached tokens are worth 900/64 ≈ 14 slots.
		{"cached worker, a few more requests", []int{0, 13, 0}, []int{1000, 100, 1000}, "b", ReasonCache},
		{"cached worker, too many more requests", []int{0, 15, 1}, []int{1000, 100, 1000}, "a", ReasonLoad},
		{"longer prefix wins", []int{3, 3, 3}, []int{600, 100, 300}, "b", ReasonCache},
		{"nothing cached: least loaded", []int{3, 1, 2}, []int{1000, 1000, 1000}, "b", ReasonLoad},
		{"nothing cached, tie: smallest id", []int{1, 1, 1}, []int{1000, 1000, 1000}, "a", ReasonLoad},
		{"equal cost: lower load", []int{1, 0}, []int{936, 1000}, "b", ReasonLoad},
		{"same prefix everywhere: least loaded", []int{4, 2, 3}, []int{100, 100, 100}, "b", ReasonLoad},
		{"one candidate", []int{50}, []int{1000}, "a", ReasonLoad},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := make([]Candidate, len(tt.loads))
			for i, l := range tt.loads {
				cands[i] = Candidate{ID: string(rune('a' + i)), Load: l}
			}
			i, reason := CacheAware(cands, tt.prefill, c)
			if i < 0 || cands[i].ID != tt.want || reason != tt.wantReason {
				t.Fatalf("picked %d (%s), want %s (%s)", i, reason, tt.want, tt.wantReason)
			}
		})
	}
	if i, r := CacheAware(nil, nil, c); i != -1 || r != "" {
		t.Fatalf("no candidates: %d %q", i, r)
	}
}

func TestCacheAwareSpillsWhenOverloaded(t *testing.T) {
	// Prefill counts for nothing next to the load here: only the guard can
	// move the pick off the cached worker.
	c := CacheAwareConfig{PrefillWeight: 1, LoadWeight: 0.001, BalanceAbs: 64, BalanceRel: 1.5}
	tests := []struct {
		name       string
		cached     int // the cached worker's load
		other      int // the least loaded other's
		want       string
		wantReason string
	}{
		{"both thresholds passed", 200, 100, "b", ReasonLoad},
		{"absolute passed, relative not", 200, 134, "a", ReasonCache},
		{"relative passed, absolute not", 60, 0, "a", ReasonCache},
		{"exactly at the absolute threshold", 64, 0, "a", ReasonCache},
		{"just past both", 65, 0, "b", ReasonLoad},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := []Candidate{{ID: "a", Load: tt.cached}, {ID: "b", Load: tt.other}, {ID: "c", Load: tt.other + 1}}
			i, reason := CacheAware(cands, []int{10, 1000, 1000}, c)
			if cands[i].ID != tt.want || reason != tt.wantReason {
				t.Fatalf("picked %s (%s), want %s (%s)", cands[i].ID, reason, tt.want, tt.wantReason)
			}
		})
	}
}

// TestCacheAwareTies: candidates the cost and the guard find equal go to
// the smallest Tie, then the smallest ID, on both the cheapest's and the
// guard's side.
func TestCacheAwareTies(t *testing.T) {
	guard := CacheAwareConfig{PrefillWeight: 1, LoadWeight: 0.001, BalanceAbs: 64, BalanceRel: 1.5}
	tests := []struct {
		name    string
		c       CacheAwareConfig
		loads   []int
		prefill []int
		ties    []uint64
		want    string
	}{
		{"cost tie: smallest Tie", DefaultCacheAware(), []int{1, 1, 1}, []int{1000, 1000, 1000}, []uint64{7, 2, 5}, "b"},
		{"cost tie, equal Ties: smallest id", DefaultCacheAware(), []int{1, 1, 1}, []int{1000, 1000, 1000}, []uint64{4, 4, 4}, "a"},
		{"Tie never beats a cheaper cost", DefaultCacheAware(), []int{1, 1, 1}, []int{1000, 100, 1000}, []uint64{1, 9, 2}, "b"},
		{"guard's tie: smallest Tie", guard, []int{200, 0, 0}, []int{10, 1000, 1000}, []uint64{0, 8, 3}, "c"},
		{"guard's tie, equal Ties: smallest id", guard, []int{200, 0, 0}, []int{10, 1000, 1000}, []uint64{0, 3, 3}, "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := make([]Candidate, len(tt.loads))
			for i, l := range tt.loads {
				cands[i] = Candidate{ID: string(rune('a' + i)), Load: l, Tie: tt.ties[i]}
			}
			if i, _ := CacheAware(cands, tt.prefill, tt.c); i < 0 || cands[i].ID != tt.want {
				t.Fatalf("picked %d, want %s", i, tt.want)
			}
		})
	}
}

// TestCacheAwareNeverPassesThresholds is the guard's property: whatever the
// loads and the cached prefixes, the pick is never overloaded against the
// least loaded candidate; so a fleet fed only by the policy, starting
// balanced, never has a worker past the thresholds against the least
// loaded one.
func TestCacheAwareNeverPassesThresholds(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 13))
	for trial := range 200 {
		c := CacheAwareConfig{PrefillWeight: rng.Float64() * 2, LoadWeight: rng.Float64() * 200,
			BalanceAbs: rng.IntN(20), BalanceRel: 1 + rng.Float64()}
		if c.PrefillWeight == 0 && c.LoadWeight == 0 {
			continue
		}
		n := 1 + rng.IntN(16)
		cands := make([]Candidate, n)
		for i := range cands {
			cands[i] = Candidate{ID: fmt.Sprintf("w%02d", i)}
		}
		// Skewed popularity: a few prompts hold most of the traffic, so
		// the cost alone would pile onto their holders.
		holders := make([][]bool, 4)
		for p := range holders {
			holders[p] = make([]bool, n)
		}
		prefill := make([]int, n)
		for step := range 2000 {
			p := min(3, int(rng.ExpFloat64()))
			for i := range cands {
				prefill[i] = 2000
				if holders[p][i] {
					prefill[i] = 50
				}
			}
			i, _ := CacheAware(cands, prefill, c)
			least := cands[LeastOutstanding(cands)].Load
			if c.Overloaded(cands[i].Load, least) {
				t.Fatalf("trial %d step %d: picked %s at load %d, least %d, config %+v", trial, step, cands[i].ID, cands[i].Load, least, c)
			}
			cands[i].Load++
			holders[p][i] = true
			lo, hi := cands[0].Load, cands[0].Load
			for _, x := range cands {
				lo, hi = min(lo, x.Load), max(hi, x.Load)
			}
			// One pick past a threshold at most: the guard refused the rest.
			if c.Overloaded(hi-1, lo) {
				t.Fatalf("trial %d step %d: loads %d..%d passed the thresholds (%+v)", trial, step, lo, hi, c)
			}
			if rng.IntN(3) > 0 { // releases keep the loads moving both ways
				j := rng.IntN(n)
				if cands[j].Load > 0 && !c.Overloaded(hi, cands[j].Load-1) {
					cands[j].Load--
				}
			}
		}
	}
}

func TestCacheAwareConfigValidate(t *testing.T) {
	nan := func() float64 { f, _ := strconv.ParseFloat("NaN", 64); return f }()
	tests := []struct {
		name string
		c    CacheAwareConfig
		ok   bool
	}{
		{"defaults", DefaultCacheAware(), true},
		{"load only", CacheAwareConfig{LoadWeight: 1, BalanceRel: 1}, true},
		{"negative prefill", CacheAwareConfig{PrefillWeight: -1, LoadWeight: 1, BalanceRel: 1.5}, false},
		{"NaN load", CacheAwareConfig{PrefillWeight: 1, LoadWeight: nan, BalanceRel: 1.5}, false},
		{"both zero", CacheAwareConfig{BalanceRel: 1.5}, false},
		{"negative abs", CacheAwareConfig{PrefillWeight: 1, BalanceAbs: -1, BalanceRel: 1.5}, false},
		{"rel below 1", CacheAwareConfig{PrefillWeight: 1, BalanceRel: 0.9}, false},
	}
	for _, tt := range tests {
		err := tt.c.Validate()
		if (err == nil) != tt.ok || err != nil && !errors.Is(err, ErrCacheAwareConfig) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

func BenchmarkCacheAware(b *testing.B) {
	cands := candidates(64, func(i int) int { return i % 5 }, func(int) int { return 1 })
	prefill := make([]int, 64)
	for i := range prefill {
		prefill[i] = 2000 - (i%3)*700
	}
	c := DefaultCacheAware()
	b.ReportAllocs()
	for b.Loop() {
		CacheAware(cands, prefill, c)
	}
}
