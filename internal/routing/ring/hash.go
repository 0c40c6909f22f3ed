// Package ring implements a consistent hash ring with virtual nodes and
// consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
// 2016), plus the gateway's 64-bit hash.
//
// A Ring is pure data: it performs no I/O and starts no goroutines. Like
// most Go types it is not safe for concurrent use: its owner (the router
// actor) calls it from one goroutine at a time. GetBounded and
// GetBoundedFunc reuse scratch space held in the Ring so that a pick makes
// no allocation.
package ring

import "github.com/cespare/xxhash/v2"

// Hash64 returns the 64-bit xxHash (XXH64, seed 0) of b. It is the gateway's
// one hash: ring positions, prefix keys and the canary draw all use it.
func Hash64(b []byte) uint64 { return xxhash.Sum64(b) }

// Hash64String is Hash64 of the bytes of s, without converting s.
func Hash64String(s string) uint64 { return xxhash.Sum64String(s) }

// Uniform maps s to a number in [0, 1): the top 53 bits of
// Hash64String(s) divided by 2^53, exact in a float64. The router draws a
// request's canary backend with it, so one request id
// always lands on the same backend.
func Uniform(s string) float64 {
	return float64(Hash64String(s)>>11) / (1 << 53)
}
