package metrics

import (
	"sync"
	"sync/atomic"
)

// maxCached bounds each cache of pre-curried series; past it, lookups take
// the slow path (a locked label check and the vector's own lookup) instead
// of growing the cache.
const maxCached = 16384

// cache maps raw label values to pre-curried series. Reads are lock-free (an
// atomic load and a map lookup, no allocation); writes copy the map under
// mu, which is cheap because a cache only grows when a new route or worker
// is first seen.
type cache[K comparable, V any] struct {
	mu sync.Mutex
	p  atomic.Pointer[map[K]V]
}

// load returns the value cached for k.
func (c *cache[K, V]) load(k K) (V, bool) {
	if p := c.p.Load(); p != nil {
		v, ok := (*p)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

// storeLocked caches v under k unless the cache is full; c.mu must be held.
func (c *cache[K, V]) storeLocked(k K, v V) {
	old := c.p.Load()
	n := 0
	if old != nil {
		n = len(*old)
	}
	if n >= maxCached {
		return
	}
	next := make(map[K]V, n+1)
	if old != nil {
		for ok, ov := range *old {
			next[ok] = ov
		}
	}
	next[k] = v
	c.p.Store(&next)
}

// deleteLocked drops every key drop selects; c.mu must be held.
func (c *cache[K, V]) deleteLocked(drop func(K) bool) {
	old := c.p.Load()
	if old == nil {
		return
	}
	next := make(map[K]V, len(*old))
	for k, v := range *old {
		if !drop(k) {
			next[k] = v
		}
	}
	c.p.Store(&next)
}
