package tracing

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/wire/tracectx"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		c    Config
		want error
	}{
		{"grpc", Config{Endpoint: "http://127.0.0.1:4317", SampleRatio: 1}, nil},
		{"http over tls", Config{Endpoint: "https://collector:4318/v1/traces", Protocol: ProtocolHTTP, SampleRatio: 0.1}, nil},
		{"bad protocol", Config{Endpoint: "http://h:1", Protocol: "zipkin"}, ErrProtocol},
		{"no scheme", Config{Endpoint: "h:4317"}, ErrEndpoint},
		{"ratio", Config{Endpoint: "http://h:1", SampleRatio: 2}, ErrRatio},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Validate() = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := New(context.Background(), Config{Endpoint: "ftp://x"}); !errors.Is(err, ErrEndpoint) {
		t.Fatalf("New with a bad endpoint: %v", err)
	}
}

func TestParseHeaders(t *testing.T) {
	cases := []struct {
		in   string
		want map[string]string
		err  bool
	}{
		{"", map[string]string{}, false},
		{"api-key=abc", map[string]string{"api-key": "abc"}, false},
		{" a = 1 , b=x%20y ,", map[string]string{"a": "1", "b": "x y"}, false},
		{"novalue", nil, true},
		{"=v", nil, true},
	}
	for _, tc := range cases {
		got, err := ParseHeaders(tc.in)
		if (err != nil) != tc.err || !tc.err && !maps.Equal(got, tc.want) {
			t.Errorf("ParseHeaders(%q) = %v, %v; want %v (error %v)", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestOffAndOn(t *testing.T) {
	off := Off()
	if off.Enabled() || off.Tracer() != nil || off.Shutdown(context.Background()) != nil {
		t.Fatal("Off: enabled, or has a tracer, or fails to shut down")
	}
	if p, err := New(context.Background(), Config{}); err != nil || p.Enabled() {
		t.Fatalf("New without endpoint: %v, enabled %v", err, p.Enabled())
	}
	for _, proto := range []string{ProtocolGRPC, ProtocolHTTP} {
		p, err := New(context.Background(), Config{Endpoint: "http://127.0.0.1:1", Protocol: proto, SampleRatio: 1})
		if err != nil || !p.Enabled() || p.Tracer() == nil {
			t.Fatalf("%s: New = %v, enabled %v", proto, err, p.Enabled())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := p.Shutdown(ctx); err != nil { // nothing to flush: no export is tried
			t.Errorf("%s: Shutdown: %v", proto, err)
		}
		cancel()
	}
}

func TestSamplerIsParentBased(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	p := WithExporter(exp, Config{SampleRatio: 0}, sdktrace.WithSyncer(exp))
	defer func() { _ = p.Shutdown(context.Background()) }()
	tr := p.Tracer()
	_, sp := tr.Start(context.Background(), "new trace")
	sp.End()
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("ratio 0 recorded %d new traces", n)
	}
	h := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	_, sp = tr.Start(tracectx.Extract(context.Background(), h, true), "sampled parent")
	sp.End()
	if n := len(exp.GetSpans()); n != 1 {
		t.Fatalf("a sampled parent's child: %d spans recorded, want 1", n)
	}
}

// TestUntrustedParentDrawnNotByTraceID: an untrusted client's parent is
// sampled by the sampler's own draw, whatever its trace id; a trusted
// parent that is not sampled never is.
func TestUntrustedParentDrawnNotByTraceID(t *testing.T) {
	h := http.Header{"Traceparent": {"00-00000000000000010000000000000000-00f067aa0ba902b7-01"}}
	untrusted := tracectx.Extract(context.Background(), h, false)
	h.Set("Traceparent", "00-00000000000000010000000000000000-00f067aa0ba902b7-00")
	trusted := tracectx.Extract(context.Background(), h, true)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		draw float64
		want sdktrace.SamplingDecision
	}{
		{"untrusted, draw above the ratio", untrusted, 0.5, sdktrace.Drop},
		{"untrusted, draw below the ratio", untrusted, 0.005, sdktrace.RecordAndSample},
		{"trusted, not sampled", trusted, 0, sdktrace.Drop},
	} {
		s := untrustedSampler{ratio: 0.01, draw: func() float64 { return tc.draw }}
		p := sdktrace.SamplingParameters{ParentContext: tc.ctx, TraceID: trace.SpanContextFromContext(tc.ctx).TraceID()}
		if got := s.ShouldSample(p).Decision; got != tc.want {
			t.Errorf("%s: decision %v, want %v", tc.name, got, tc.want)
		}
	}
}
