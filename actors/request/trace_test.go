package request

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/tracing"
	"github.com/tlgate/tlgate/internal/routing/cascade"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/tracectx"
)

// tracedRequest runs every trace hook of one disaggregated cascade request
// that fails over once, in the order the actor calls them.
func tracedRequest(a *requestActor, h http.Header, rr *router.RouteResult, o Outcome, fail error) {
	a.tr = nil
	a.traceStart()
	for range 2 {
		a.traceRoute()
		a.traceRouted(rr)
		_ = a.traceTokenize()
		a.tracePhaseEnd(nil)
		_ = a.tracePrefill()
		a.tracePhaseEnd(nil)
		a.traceInject(h)
		a.traceAnswered(200, time.Millisecond, nil)
		a.traceJudged(nil, false)
		a.traceAttemptEnd(OutcomeFailed, "refused", fail)
		_, sp := a.traceRelease("kv-1")
		endSpan(sp, nil)
	}
	a.traceEnd(o)
}

func newTraceActor(tr *tracing.Provider) (*requestActor, *router.RouteResult) {
	p := &fleet.Worker{ID: "p", HTTPAddress: "127.0.0.1:1"}
	rr := &router.RouteResult{Target: router.Target{
		Worker: fleet.Worker{ID: "d", HTTPAddress: "127.0.0.1:2"}, Prefill: p, Route: "auto", ServedModel: "big",
		Reason: "least_outstanding", Policy: "least_outstanding", Candidates: 2, CascadeSteps: 2,
		Rule: cascade.Accept{Stat: cascade.MeanLogprob, Op: cascade.Greater, Threshold: -1},
	}}
	ex := NewExchange(context.Background(), nil, openai.Request{Model: "auto", Chat: true}, "/v1/chat/completions", "req-1")
	a := &requestActor{d: &Deps{Tracer: tr.Tracer()}, ex: ex, target: rr.Target}
	return a, rr
}

// BenchmarkTraceHooks measures the trace hooks of one request (two
// attempts, every phase), with tracing off and on.
func BenchmarkTraceHooks(b *testing.B) {
	exp := tracetest.NewInMemoryExporter()
	on := tracing.WithExporter(exp, tracing.Config{SampleRatio: 1}, sdktrace.WithSyncer(exp))
	defer func() { _ = on.Shutdown(context.Background()) }()
	for _, c := range []struct {
		name string
		p    *tracing.Provider
	}{{"off", tracing.Off()}, {"on", on}} {
		b.Run(c.name, func(b *testing.B) {
			a, rr := newTraceActor(c.p)
			h, o, fail := http.Header{}, Outcome{Status: 200}, errors.New("refused")
			b.ReportAllocs()
			for b.Loop() {
				tracedRequest(a, h, rr, o, fail)
				exp.Reset()
			}
		})
	}
}

// TestTracingOffAllocatesNothing: with tracing off every trace hook of the
// request path returns at once: no allocation per request, measured by
// AllocsPerRun and by the benchmark; with tracing on the same hooks do
// allocate (so the measurement measures something). The propagation
// helpers the engine calls use are free without a span too.
func TestTracingOffAllocatesNothing(t *testing.T) {
	a, rr := newTraceActor(tracing.Off())
	h, o, fail := http.Header{}, Outcome{Status: 200}, errors.New("refused")
	if n := testing.AllocsPerRun(200, func() { tracedRequest(a, h, rr, o, fail) }); n != 0 {
		t.Fatalf("tracing off: %v allocations per request in the trace hooks, want 0", n)
	}
	ctx := context.Background()
	if n := testing.AllocsPerRun(200, func() {
		tracectx.Inject(ctx, h)
		_ = tracectx.OutgoingGRPC(ctx)
		_ = tracectx.Detached(ctx)
	}); n != 0 {
		t.Fatalf("propagation without a span: %v allocations, want 0", n)
	}
	if len(h) != 0 {
		t.Fatalf("headers set without a span: %v", h)
	}
	if testing.Short() {
		return
	}
	res := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tracedRequest(a, h, rr, o, fail)
		}
	})
	if res.AllocsPerOp() != 0 {
		t.Fatalf("benchmark, tracing off: %d allocs/op, want 0", res.AllocsPerOp())
	}
	exp := tracetest.NewInMemoryExporter()
	on := tracing.WithExporter(exp, tracing.Config{SampleRatio: 1}, sdktrace.WithSyncer(exp))
	defer func() { _ = on.Shutdown(ctx) }()
	a2, rr2 := newTraceActor(on)
	if n := testing.AllocsPerRun(20, func() { tracedRequest(a2, http.Header{}, rr2, o, fail); exp.Reset() }); n == 0 {
		t.Fatal("tracing on allocates nothing: the hooks record no span")
	}
	t.Logf("tracing off: %v ns/op, 0 allocs/op", res.NsPerOp())
}

// TestTraceHooksSpanTree: the hooks of a disaggregated cascade request
// that fails over once build the documented tree: request → route,
// cascade step → attempt → tokenize, prefill, decode; request → release.
func TestTraceHooksSpanTree(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	p := tracing.WithExporter(exp, tracing.Config{SampleRatio: 1}, sdktrace.WithSyncer(exp))
	defer func() { _ = p.Shutdown(context.Background()) }()
	a, rr := newTraceActor(p)
	h := http.Header{}
	tracedRequest(a, h, rr, Outcome{Status: 503, Code: openai.CodeNoCapacity, Message: "no"}, errors.New("refused"))
	spans := exp.GetSpans()
	byID := map[string]tracetest.SpanStub{}
	count := map[string]int{}
	for _, s := range spans {
		byID[s.SpanContext.SpanID().String()] = s
		count[s.Name]++
	}
	want := map[string]int{"chat auto": 1, SpanRoute: 2, SpanCascadeStep: 2, SpanAttempt: 2, SpanTokenize: 2, SpanPrefill: 2, SpanDecode: 2, SpanRelease: 2}
	for name, n := range want {
		if count[name] != n {
			t.Errorf("%d spans %q, want %d (all: %v)", count[name], name, n, count)
		}
	}
	parentOf := func(s tracetest.SpanStub) string { return byID[s.Parent.SpanID().String()].Name }
	wantParent := map[string]string{SpanRoute: "chat auto", SpanCascadeStep: "chat auto", SpanAttempt: SpanCascadeStep,
		SpanTokenize: SpanAttempt, SpanPrefill: SpanAttempt, SpanDecode: SpanAttempt, SpanRelease: "chat auto"}
	for _, s := range spans {
		if w, ok := wantParent[s.Name]; ok && parentOf(s) != w {
			t.Errorf("span %s has parent %q, want %q", s.Name, parentOf(s), w)
		}
		if s.SpanContext.TraceID() != a.ex.TraceContext().TraceID() {
			t.Errorf("span %s in trace %s, want %s", s.Name, s.SpanContext.TraceID(), a.ex.TraceContext().TraceID())
		}
	}
	if tp := h.Get("Traceparent"); tp == "" {
		t.Fatal("no traceparent injected into the decode call")
	}
}
