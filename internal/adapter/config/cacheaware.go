package config

import "math"

// validateCacheAware checks the cache_aware keys (whatever the policy, so
// that switching to it cannot fail later).
func validateCacheAware(v *checker, g *Gateway) {
	finite := func(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
	if !finite(g.CacheAwarePrefillWeight) || g.CacheAwarePrefillWeight < 0 {
		v.add("gateway.cache_aware_prefill_weight", "must be >= 0, got %v", g.CacheAwarePrefillWeight)
	}
	if !finite(g.CacheAwareLoadWeight) || g.CacheAwareLoadWeight < 0 {
		v.add("gateway.cache_aware_load_weight", "must be >= 0, got %v", g.CacheAwareLoadWeight)
	}
	if g.CacheAwarePrefillWeight == 0 && g.CacheAwareLoadWeight == 0 {
		v.add("gateway.cache_aware_load_weight", "must be > 0 when cache_aware_prefill_weight is 0")
	}
	if g.CacheAwareBalanceAbs < 0 {
		v.add("gateway.cache_aware_balance_abs", "must be >= 0, got %d", g.CacheAwareBalanceAbs)
	}
	if !finite(g.CacheAwareBalanceRel) || g.CacheAwareBalanceRel < 1 {
		v.add("gateway.cache_aware_balance_rel", "must be >= 1, got %v", g.CacheAwareBalanceRel)
	}
	if g.CacheAwareChunkBytes < 16 || g.CacheAwareChunkBytes > 4096 {
		v.add("gateway.cache_aware_chunk_bytes", "must be in 16..4096, got %d", g.CacheAwareChunkBytes)
	}
	if !finite(g.CacheAwareBytesPerToken) || g.CacheAwareBytesPerToken <= 0 || g.CacheAwareBytesPerToken > 64 {
		v.add("gateway.cache_aware_bytes_per_token", "must be > 0 and <= 64, got %v", g.CacheAwareBytesPerToken)
	}
	if !(g.CacheAwareMaxRequestShare > 0 && g.CacheAwareMaxRequestShare <= 1) {
		v.add("gateway.cache_aware_max_request_share", "must be > 0 and <= 1, got %v", g.CacheAwareMaxRequestShare)
	}
}
