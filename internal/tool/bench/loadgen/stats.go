package loadgen

import (
	"math"
	"slices"
	"time"
)

// Summary condenses a set of latency samples.
type Summary struct {
	Count                    int
	Mean, P50, P90, P99, Max time.Duration
}

// Summarize sorts a copy of samples and returns its summary; the zero
// Summary for no samples.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	var sum time.Duration
	for _, v := range s {
		sum += v
	}
	return Summary{
		Count: len(s),
		Mean:  sum / time.Duration(len(s)),
		P50:   Percentile(s, 50),
		P90:   Percentile(s, 90),
		P99:   Percentile(s, 99),
		Max:   s[len(s)-1],
	}
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted samples
// by the nearest-rank method: the smallest sample with at least p percent
// of the samples at or below it. It returns 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	// rank = ceil(p/100 * n) in 1..n; the epsilon keeps exact ranks exact
	// despite float rounding (p=50, n=10 is rank 5).
	rank := int(math.Ceil(p*float64(n)/100 - 1e-9))
	rank = max(1, min(n, rank))
	return sorted[rank-1]
}
