package tlbench

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
)

// cacheWeights describes the cache_aware weights of the runs.
func cacheWeights(c Config) string {
	d := config.Default().Gateway
	lw := d.CacheAwareLoadWeight
	if c.CacheLoadWeight > 0 {
		lw = c.CacheLoadWeight
	}
	return fmt.Sprintf("prefill weight %v, load weight %v, balance thresholds %d and %v, %d-byte chunks",
		d.CacheAwarePrefillWeight, lw, d.CacheAwareBalanceAbs, d.CacheAwareBalanceRel, d.CacheAwareChunkBytes)
}

// The targets cache_aware is held to on each workload of the routing runs:
// against the best other route policy, against least_outstanding, and on
// load balance.
const (
	caTTFTSlack   = 1.10 // TTFT p50 and p99 within 10% of the best other route policy's
	caHitSlack    = 0.02 // hit rate at least the best other's minus 2 points
	caHitVsLO     = 2.0  // hit rate ≥ 2× least_outstanding's ...
	caTTFTVsLO    = 0.7  // ... and TTFT p50 ≤ 0.7× (multi-turn, rag, shared ≥ 16)
	caMaxMean     = 1.25 // busiest engine ≤ 1.25× the mean
	caSharedFloor = 16
)

// caGroup is one workload (a sweep point is one) with its rows.
type caGroup struct {
	label string
	kind  loadgen.Kind
	n     int
	rows  []routingRow
}

// cacheAwareTargets checks cache_aware against the others on every
// workload of the main table and every point of the sweep.
func cacheAwareTargets(rows, sweep []routingRow) (*table, []string) {
	var groups []caGroup
	add := func(label string, kind loadgen.Kind, n int, r routingRow) {
		for i := range groups {
			if groups[i].label == label {
				groups[i].rows = append(groups[i].rows, r)
				return
			}
		}
		groups = append(groups, caGroup{label: label, kind: kind, n: n, rows: []routingRow{r}})
	}
	for _, r := range rows {
		label := string(r.workload)
		if r.workload == loadgen.Shared {
			label = "shared " + strconv.Itoa(r.prompts)
		}
		add(label, r.workload, r.prompts, r)
	}
	fromMain := len(groups)
	for _, r := range sweep {
		label := "shared " + strconv.Itoa(r.prompts)
		if slices.ContainsFunc(groups[:fromMain], func(g caGroup) bool { return g.label == label }) {
			continue // the main table's runs of the same workload
		}
		add(label, loadgen.Shared, r.prompts, r)
	}
	t := &table{header: []string{"workload", "cache_aware hit rate", "best other hit rate", "TTFT p50 ms (best other)", "TTFT p99 ms (best other)",
		"vs least_outstanding: hit ×, TTFT p50 ×", "max/mean load", "verdict", "client-side baselines: best TTFT p50 / p99 ms"}}
	met, total := 0, 0
	var missed []string
	for _, g := range groups {
		ca, lo, bestHit, bestP50, bestP99, base50, base99, ok := caCompare(g.rows)
		if !ok {
			continue
		}
		var fails []string
		check := func(pass bool, what string) {
			if !pass {
				fails = append(fails, what)
			}
		}
		check(float64(ca.ttft.P50) <= caTTFTSlack*float64(bestP50.ttft.P50), "TTFT p50")
		check(float64(ca.ttft.P99) <= caTTFTSlack*float64(bestP99.ttft.P99), "TTFT p99")
		check(ca.hitRate >= bestHit.hitRate-caHitSlack, "hit rate")
		check(ca.maxMean <= caMaxMean, "max/mean")
		strict := g.kind == loadgen.MultiTurn || g.kind == loadgen.RAG || g.kind == loadgen.Shared && g.n >= caSharedFloor
		hitX, p50X := fratio(ca.hitRate, lo.hitRate), fratio(float64(ca.ttft.P50), float64(lo.ttft.P50))
		vsLO := fmt.Sprintf("%s, %s", fx(hitX), fx(p50X))
		if strict {
			check(hitX >= caHitVsLO, "hit ≥ 2× LO")
			check(p50X <= caTTFTVsLO, "TTFT p50 ≤ 0.7× LO")
		} else {
			vsLO += " (not required)"
		}
		verdict := "met"
		total++
		if len(fails) > 0 {
			verdict = "MISSED: " + joinComma(fails)
			missed = append(missed, g.label)
		} else {
			met++
		}
		t.add(g.label, pct(ca.hitRate), pct(bestHit.hitRate)+" ("+bestHit.policy+")",
			ms(ca.ttft.P50)+" ("+ms(bestP50.ttft.P50)+", "+bestP50.policy+")",
			ms(ca.ttft.P99)+" ("+ms(bestP99.ttft.P99)+", "+bestP99.policy+")",
			vsLO, f2(ca.maxMean), verdict, base50+" / "+base99)
	}
	note := fmt.Sprintf("cache_aware meets every target on %d of %d workloads", met, total)
	if len(missed) > 0 {
		note += "; missed on " + joinComma(missed)
	}
	return t, []string{note + "."}
}

// caCompare finds cache_aware's and least_outstanding's rows and the best
// other route policy's hit rate, TTFT p50 and TTFT p99: the targets hold
// cache_aware to the gateway's other policies, what an operator could turn
// on instead. The client-side baselines (random, round_robin) send straight
// to the engines without the gateway's hop; their best TTFT p50 and p99
// are returned apart, formatted ("-" without any).
func caCompare(rows []routingRow) (ca, lo, bestHit, bestP50, bestP99 routingRow, base50, base99 string, ok bool) {
	var haveCA, haveLO, haveOther bool
	var b50, b99 time.Duration
	for _, r := range rows {
		if !viaGateway(r.policy) {
			if b50 == 0 || r.ttft.P50 < b50 {
				b50 = r.ttft.P50
			}
			if b99 == 0 || r.ttft.P99 < b99 {
				b99 = r.ttft.P99
			}
			continue
		}
		switch r.policy {
		case config.PolicyCacheAware:
			ca, haveCA = r, true
			continue
		case config.PolicyLeastOutstanding:
			lo, haveLO = r, true
		}
		if !haveOther {
			bestHit, bestP50, bestP99, haveOther = r, r, r, true
			continue
		}
		if r.hitRate > bestHit.hitRate {
			bestHit = r
		}
		if r.ttft.P50 < bestP50.ttft.P50 {
			bestP50 = r
		}
		if r.ttft.P99 < bestP99.ttft.P99 {
			bestP99 = r
		}
	}
	base50, base99 = "-", "-"
	if b50 > 0 {
		base50, base99 = ms(b50), ms(b99)
	}
	return ca, lo, bestHit, bestP50, bestP99, base50, base99, haveCA && haveLO && haveOther
}

// fratio is a/b: 1 when both are 0, +Inf when only b is.
func fratio(a, b float64) float64 {
	if b == 0 {
		if a == 0 {
			return 1
		}
		return math.Inf(1)
	}
	return a / b
}

func fx(f float64) string { return fmt.Sprintf("%.2f×", f) }

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ", "
		}
		out += x
	}
	return out
}
