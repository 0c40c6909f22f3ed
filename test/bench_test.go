package test

import (
	"bufio"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
)

// BenchmarkTTFTDisaggregated measures time to first token through the
// gateway for the same long prompt on a unified worker and on a
// prefill/decode pair, with a realistic prefill cost (100 µs per uncached
// prompt token) and decode cost (2 ms per token). Each request has a
// distinct prompt so the prefix cache never hides the prefill. It reports
// ttft-p50 and ttft-p99 (ms) per variant.
//
//	go test -run '^$' -bench TTFT -benchtime 50x ./test
func BenchmarkTTFTDisaggregated(b *testing.B) {
	for _, variant := range []string{"unified", "disaggregated"} {
		b.Run(variant, func(b *testing.B) {
			c := newBenchCluster(b)
			model := "big"
			if variant == "disaggregated" {
				model = "big-pd"
			}
			system := strings.Repeat("You are a careful assistant who answers in full sentences. ", 24) // ~1.4 KB
			var ttfts []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":4,"stream":true,"seed":1}`, model, fmt.Sprintf("%d %s question %d", i, system, i))
				start := time.Now()
				resp, err := http.Post(c.url+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				line, err := bufio.NewReader(resp.Body).ReadString('\n')
				ttft := time.Since(start)
				resp.Body.Close()
				if err != nil || !strings.HasPrefix(line, "data: ") {
					b.Fatalf("%s: first line %q %v", variant, line, err)
				}
				ttfts = append(ttfts, ttft)
			}
			b.StopTimer()
			sort.Slice(ttfts, func(i, j int) bool { return ttfts[i] < ttfts[j] })
			b.ReportMetric(float64(ttfts[len(ttfts)/2].Microseconds())/1000, "ttft-p50-ms")
			b.ReportMetric(float64(ttfts[len(ttfts)*99/100].Microseconds())/1000, "ttft-p99-ms")
		})
	}
}

func newBenchCluster(b *testing.B) *cluster {
	b.Helper()
	cost := func(c enginesim.Config) enginesim.Config {
		c.PrefillPerToken, c.DecodePerToken, c.Confidence = 100*time.Microsecond, 2*time.Millisecond, 0.9
		return c
	}
	return newCluster(b, pdRoutes, nil,
		cost(enginesim.Config{ID: "u", Model: "big"}),
		cost(enginesim.Config{ID: "p", Model: "big", Role: enginesim.RolePrefill}),
		cost(enginesim.Config{ID: "d", Model: "big", Role: enginesim.RoleDecode}))
}
