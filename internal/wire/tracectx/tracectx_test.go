package tracectx

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestPropagation(t *testing.T) {
	h := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "Tracestate": {"v=1"}}
	ctx := Extract(context.Background(), h, true)
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsRemote() || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.TraceState().String() != "v=1" {
		t.Fatalf("Extract: %+v", sc)
	}
	if got := Extract(context.Background(), http.Header{"Traceparent": {"garbage"}}, true); trace.SpanContextFromContext(got).IsValid() {
		t.Fatal("a malformed traceparent was accepted")
	}
	out := http.Header{}
	Inject(ctx, out)
	if out.Get("Traceparent") != h.Get("Traceparent") || out.Get("Tracestate") != "v=1" {
		t.Fatalf("Inject: %v", out)
	}
	// gRPC: outgoing metadata on the client becomes incoming on the server.
	octx := OutgoingGRPC(metadata.AppendToOutgoingContext(ctx, "x-other", "kept"))
	md, _ := metadata.FromOutgoingContext(octx)
	if md.Get("traceparent")[0] != h.Get("Traceparent") || md.Get("x-other")[0] != "kept" {
		t.Fatalf("OutgoingGRPC metadata: %v", md)
	}
	ictx := IncomingGRPC(metadata.NewIncomingContext(context.Background(), md))
	if got := trace.SpanContextFromContext(ictx); got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() {
		t.Fatalf("IncomingGRPC: %+v", got)
	}
	if d := Detached(ctx); trace.SpanContextFromContext(d).TraceID() != sc.TraceID() || d.Done() != nil {
		t.Fatal("Detached lost the span context or kept a cancel")
	}
	if SampledTraceID(sc) != "4bf92f3577b34da6a3ce929d0e0e4736" || SampledTraceID(trace.SpanContext{}) != "" {
		t.Fatal("SampledTraceID")
	}
}
