package policy

import (
	"errors"
	"fmt"
	"math"
)

// ReasonCache: the cache-aware pick was the cheapest worker and it holds a
// prefix of the prompt. A cache-aware pick without any cached prefix, or
// one the balance guard moved to the least loaded worker, is ReasonLoad.
const ReasonCache = "cache"

// NameCacheAware is the cache-aware policy's route_policy value.
const NameCacheAware Name = "cache_aware"

// Defaults of CacheAwareConfig (see docs/BENCHMARKS.md for the runs that
// chose them).
const (
	// DefaultPrefillWeight is the cost of one prompt token to prefill.
	DefaultPrefillWeight = 1.0
	// DefaultLoadWeight is the cost of one engine slot of load, in prompt
	// tokens to prefill: a cached prefix of more than this many tokens is
	// worth one more request queued on the worker holding it. On the
	// reference engines of tlbench a queued request waits about 12 ms per
	// request ahead, the prefill of about 220 estimated tokens; 64 leans
	// towards the cache, whose gains (shorter prefills, fewer copies of a
	// prefix, more room in KV) outlast the request, and measured better
	// there than 96, 128, 192 and 256 (docs/BENCHMARKS.md).
	DefaultLoadWeight = 64.0
	// DefaultBalanceAbs and DefaultBalanceRel are the balance guard's
	// thresholds, SGLang's: the cheapest worker is passed over for the least
	// loaded one when its load exceeds the least by more than 64 slots and
	// more than 1.5 times.
	DefaultBalanceAbs = 64
	DefaultBalanceRel = 1.5
)

// ErrCacheAwareConfig is wrapped by the errors of an invalid
// CacheAwareConfig.
var ErrCacheAwareConfig = errors.New("policy: invalid cache_aware config")

// CacheAwareConfig weighs the cache-aware cost and sets its balance guard.
type CacheAwareConfig struct {
	// PrefillWeight multiplies the prompt tokens a worker would prefill;
	// LoadWeight the load it carries in engine slots. Both >= 0, not both 0.
	PrefillWeight, LoadWeight float64
	// BalanceAbs (>= 0) and BalanceRel (>= 1) are the guard's thresholds.
	BalanceAbs int
	BalanceRel float64
}

// DefaultCacheAware returns the default weights and thresholds.
func DefaultCacheAware() CacheAwareConfig {
	return CacheAwareConfig{PrefillWeight: DefaultPrefillWeight, LoadWeight: DefaultLoadWeight,
		BalanceAbs: DefaultBalanceAbs, BalanceRel: DefaultBalanceRel}
}

// Validate reports a config the policy cannot use, naming the field.
func (c CacheAwareConfig) Validate() error {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !finite(c.PrefillWeight) || c.PrefillWeight < 0:
		return fmt.Errorf("%w: prefill weight %v must be >= 0", ErrCacheAwareConfig, c.PrefillWeight)
	case !finite(c.LoadWeight) || c.LoadWeight < 0:
		return fmt.Errorf("%w: load weight %v must be >= 0", ErrCacheAwareConfig, c.LoadWeight)
	case c.PrefillWeight == 0 && c.LoadWeight == 0:
		return fmt.Errorf("%w: prefill and load weights are both 0", ErrCacheAwareConfig)
	case c.BalanceAbs < 0:
		return fmt.Errorf("%w: absolute balance threshold %d must be >= 0", ErrCacheAwareConfig, c.BalanceAbs)
	case !finite(c.BalanceRel) || c.BalanceRel < 1:
		return fmt.Errorf("%w: relative balance threshold %v must be >= 1", ErrCacheAwareConfig, c.BalanceRel)
	}
	return nil
}

// Cost is a candidate's cost to CacheAware: PrefillWeight × the prompt
// tokens it would prefill + LoadWeight × the load it carries.
func (c CacheAwareConfig) Cost(prefill, load int) float64 {
	return c.PrefillWeight*float64(prefill) + c.LoadWeight*float64(load)
}

// Overloaded reports whether load is past the balance guard against the
// least load: more than BalanceAbs above it and more than BalanceRel times
// it.
func (c CacheAwareConfig) Overloaded(load, least int) bool {
	return load-least > c.BalanceAbs && float64(load) > c.BalanceRel*float64(least)
}

// CacheAware picks among cands, whose Load is the load each carries in
// engine slots, given prefill[i], the prompt tokens candidate i would have
// to prefill (the prompt minus its cached prefix). The cost of a candidate
// is PrefillWeight × prefill + LoadWeight × Load; the cheapest wins, ties
// to the lower load, then the smallest Tie and ID. When the cheapest is
// overloaded against the least loaded candidate (Overloaded) the least
// loaded wins instead (ties to the fewer tokens to prefill, then the
// smallest Tie and ID).
//
// It returns the pick's index and ReasonCache when the pick is the
// cheapest and prefills less than the most any candidate would (it holds
// some of the prompt that another does not), ReasonLoad otherwise; (-1,
// "") when cands is empty. prefill must be as long as cands.
func CacheAware(cands []Candidate, prefill []int, c CacheAwareConfig) (idx int, reason string) {
	if len(cands) == 0 || len(prefill) < len(cands) {
		return -1, ""
	}
	best, least := 0, 0
	bestCost := c.Cost(prefill[0], cands[0].Load)
	most := prefill[0]
	for i := 1; i < len(cands); i++ {
		ci, cb, cl := &cands[i], &cands[best], &cands[least]
		cost := c.Cost(prefill[i], ci.Load)
		if cost < bestCost || cost == bestCost && (ci.Load < cb.Load || ci.Load == cb.Load && ci.before(cb)) {
			best, bestCost = i, cost
		}
		if ci.Load < cl.Load || ci.Load == cl.Load && (prefill[i] < prefill[least] || prefill[i] == prefill[least] && ci.before(cl)) {
			least = i
		}
		most = max(most, prefill[i])
	}
	if best != least && c.Overloaded(cands[best].Load, cands[least].Load) {
		return least, ReasonLoad
	}
	if prefill[best] < most {
		return best, ReasonCache
	}
	return best, ReasonLoad
}
