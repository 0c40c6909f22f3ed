package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/tracing"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
	"github.com/tlgate/tlgate/internal/wire/tracectx"
)

// TestClientTraceparentSampledByRatio: with sample_ratio 0, a client's
// sampled traceparent records nothing unless its key has the trace scope;
// the trace context still reaches the engine (not sampled). A tracestate
// is bounded before it travels on.
func TestClientTraceparentSampledByRatio(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	p := tracing.WithExporter(exp, tracing.Config{SampleRatio: 0, ServiceName: "tlgate"}, sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	c := newClusterGateway(t, "", []clusterOpt{withKeys(
		config.APIKey{Name: "plain", Key: "key-plain", Scopes: []string{"inference"}},
		config.APIKey{Name: "tracer", Key: "key-trace", Scopes: []string{"inference", "trace"}},
	)}, nil, func(o *gateway.Options) { o.Tracing = p })
	type seen struct{ traceparent, tracestate string }
	got := make(chan seen, 4)
	c.addFake("f", "m", func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Header.Get("Traceparent"), r.Header.Get("Tracestate")}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"index":0,"text":"hi","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	})
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	tp := "00-" + trace + "-00f067aa0ba902b7-01"
	var members []string
	for i := range 20 {
		members = append(members, fmt.Sprintf("v%d=%s", i, strings.Repeat("x", 20)))
	}
	body := map[string]any{"model": "m", "prompt": "hello", "max_tokens": 2}

	r := c.post("/v1/completions", "key-plain", body, "Traceparent", tp, "Tracestate", strings.Join(members, ","))
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	e := <-got
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("a key without the trace scope forced sampling: %d spans", n)
	}
	if !strings.HasPrefix(e.traceparent, "00-"+trace+"-") || !strings.HasSuffix(e.traceparent, "-00") {
		t.Fatalf("engine traceparent %q: want the client's trace, not sampled", e.traceparent)
	}
	if len(e.tracestate) > tracectx.MaxTraceStateBytes || strings.Count(e.tracestate, ",") >= tracectx.MaxTraceStateMembers ||
		!strings.HasPrefix(e.tracestate, "v0=") {
		t.Fatalf("tracestate not bounded to its first members: %d bytes %q", len(e.tracestate), e.tracestate)
	}

	r = c.post("/v1/completions", "key-trace", body, "Traceparent", tp)
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	e = <-got
	if n := len(exp.GetSpans()); n == 0 || !strings.HasSuffix(e.traceparent, "-01") {
		t.Fatalf("a key with the trace scope: %d spans, engine traceparent %q", n, e.traceparent)
	}
}

// TestUntrustedTraceIDCannotForceSampling: at sample_ratio 0.01, a key
// without the trace scope that picks its trace ids (the low 8 bytes zero,
// which a ratio sampler on the trace id always takes) does not get its
// requests recorded: the gateway draws their sampling itself. Twenty
// requests all but never see more than one sampled; the test allows ten
// (a chance below 1e-16 at ratio 0.01).
func TestUntrustedTraceIDCannotForceSampling(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	p := tracing.WithExporter(exp, tracing.Config{SampleRatio: 0.01, ServiceName: "tlgate"}, sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	c := newClusterGateway(t, "", []clusterOpt{withKeys(
		config.APIKey{Name: "plain", Key: "key-plain", Scopes: []string{"inference"}},
	)}, nil, func(o *gateway.Options) { o.Tracing = p })
	c.addFake("f", "m", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"index":0,"text":"hi","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	})
	body := map[string]any{"model": "m", "prompt": "hello", "max_tokens": 2}
	const n = 20
	for i := range n {
		tp := fmt.Sprintf("00-%016x0000000000000000-00f067aa0ba902b7-00", i+1)
		if r := c.post("/v1/completions", "key-plain", body, "Traceparent", tp); r.status != http.StatusOK {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	traces := map[string]bool{}
	for _, s := range exp.GetSpans() {
		traces[s.SpanContext.TraceID().String()] = true
	}
	if len(traces) > n/2 {
		t.Fatalf("a key without the trace scope chose its sampling: %d of %d requests traced at sample_ratio 0.01", len(traces), n)
	}
}
