package test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/tracing"
)

// BenchmarkTracing measures whole requests through the gateway (client,
// gateway and engine in one process, non-streamed, 4 tokens) with tracing
// off and on (every request sampled, spans batched to an exporter that
// drops them): the difference is what tracing costs a request. allocs/op
// counts the whole process.
//
//	go test -run '^$' -bench Tracing -benchtime 2000x ./test
func BenchmarkTracing(b *testing.B) {
	for _, variant := range []string{"off", "on"} {
		b.Run(variant, func(b *testing.B) {
			deps := func(*request.Deps) {}
			if variant == "on" {
				exp := tracetest.NewNoopExporter()
				p := tracing.WithExporter(exp, tracing.Config{SampleRatio: 1}, sdktrace.WithBatcher(exp))
				b.Cleanup(func() { _ = p.Shutdown(context.Background()) })
				deps = withTracer(p)
			}
			c := newClusterDeps(b, "", nil, deps, enginesim.Config{ID: "u", Model: "m"})
			const body = `{"model":"m","prompt":"hello there","max_tokens":4}`
			post := func() {
				resp, err := http.Post(c.url+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			for range 50 { // warm connections and caches
				post()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				post()
			}
		})
	}
}
