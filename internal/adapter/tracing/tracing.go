// Package tracing sets up OpenTelemetry tracing for tlgate and its reference
// engine: a TracerProvider that exports spans over OTLP (gRPC or HTTP) with
// a parent-based ratio sampler, or a no-op one when tracing is off (the W3C
// trace context itself travels through internal/wire/tracectx). Nothing
// here touches OpenTelemetry's globals: callers pass the Provider, or a
// Tracer from it, to whatever records spans.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"

	"github.com/tlgate/tlgate/internal/wire/tracectx"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Protocols of the OTLP exporter (Config.Protocol).
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http"
)

// ScopeName is the instrumentation scope of tlgate's spans.
const ScopeName = "github.com/tlgate/tlgate"

// Errors of New.
var (
	ErrProtocol = errors.New("tracing: protocol must be \"grpc\" or \"http\"")
	ErrEndpoint = errors.New("tracing: endpoint must be an http:// or https:// URL with a host")
	ErrRatio    = errors.New("tracing: sample_ratio must be within [0, 1]")
	ErrHeaders  = errors.New("tracing: headers must be comma-separated key=value pairs")
)

// Config says where spans go. An empty Endpoint turns tracing off.
type Config struct {
	// Endpoint is the OTLP receiver's URL: http://host:4317 for gRPC,
	// http://host:4318 for HTTP (the path /v1/traces is added when the URL
	// has none). https:// uses TLS, http:// plaintext.
	Endpoint string
	// Protocol is ProtocolGRPC (default) or ProtocolHTTP.
	Protocol string
	// SampleRatio is the share of new traces recorded, in [0, 1]; a request
	// that arrives with a trusted trace context follows its sampled flag,
	// one with an untrusted one (tracectx.Extract) is drawn at this ratio.
	SampleRatio float64
	// ServiceName is the resource's service.name.
	ServiceName string
	// Headers are sent with every export (an API key of the receiver, say).
	Headers map[string]string
}

// Provider hands out tracers; it is the no-op provider when tracing is off.
type Provider struct {
	tp  trace.TracerProvider
	sdk *sdktrace.TracerProvider // nil when off
}

// Off returns a provider that records nothing.
func Off() *Provider { return &Provider{tp: noop.NewTracerProvider()} }

// New returns the provider for c: Off when c.Endpoint is empty, else one
// that batches spans to an OTLP exporter. The exporter connects lazily, so
// an unreachable receiver does not fail New (spans are then dropped).
func New(ctx context.Context, c Config) (*Provider, error) {
	if c.Endpoint == "" {
		return Off(), nil
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch c.Protocol {
	case ProtocolHTTP:
		u := c.Endpoint
		if pu, _ := url.Parse(u); pu != nil && (pu.Path == "" || pu.Path == "/") {
			u = strings.TrimSuffix(u, "/") + "/v1/traces"
		}
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(u)}
		if len(c.Headers) > 0 {
			opts = append(opts, otlptracehttp.WithHeaders(c.Headers))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	default:
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(c.Endpoint)}
		if len(c.Headers) > 0 {
			opts = append(opts, otlptracegrpc.WithHeaders(c.Headers))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: exporter: %w", err)
	}
	return WithExporter(exp, c, sdktrace.WithBatcher(exp)), nil
}

// WithExporter returns a recording provider that sends spans to exp
// through the span processor opts name (sdktrace.WithSyncer(exp) in tests,
// so spans are there the moment they end); with no opts, a batcher.
func WithExporter(exp sdktrace.SpanExporter, c Config, opts ...sdktrace.TracerProviderOption) *Provider {
	if len(opts) == 0 {
		opts = []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp)}
	}
	name := c.ServiceName
	if name == "" {
		name = "tlgate"
	}
	ratio := c.SampleRatio
	if ratio < 0 || ratio > 1 {
		ratio = 1
	}
	opts = append(opts,
		// A new trace is sampled by ratio on its trace id (the gateway's
		// own, random). An untrusted client's remote parent (Extract
		// clears its sampled flag) is sampled by ratio on a draw of the
		// gateway's: its trace id is the client's choice. A trusted one's
		// flag is honoured.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio),
			sdktrace.WithRemoteParentNotSampled(untrustedSampler{ratio: ratio, draw: rand.Float64}))),
		sdktrace.WithResource(resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(name))),
	)
	sdk := sdktrace.NewTracerProvider(opts...)
	return &Provider{tp: sdk, sdk: sdk}
}

// Validate checks a config with an endpoint; each error names the problem.
func (c Config) Validate() error {
	var errs []error
	switch c.Protocol {
	case "", ProtocolGRPC, ProtocolHTTP:
	default:
		errs = append(errs, fmt.Errorf("%w, got %q", ErrProtocol, c.Protocol))
	}
	if u, err := url.Parse(c.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("%w, got %q", ErrEndpoint, c.Endpoint))
	}
	if !(c.SampleRatio >= 0 && c.SampleRatio <= 1) {
		errs = append(errs, fmt.Errorf("%w, got %v", ErrRatio, c.SampleRatio))
	}
	return errors.Join(errs...)
}

// ParseHeaders reads "key=value,key2=value2" (the format of
// OTEL_EXPORTER_OTLP_HEADERS; values may be percent-encoded).
func ParseHeaders(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if strings.TrimSpace(kv) == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%w: an entry has no key=", ErrHeaders)
		}
		if dv, err := url.PathUnescape(strings.TrimSpace(v)); err == nil {
			v = dv
		}
		out[k] = v
	}
	return out, nil
}

// Enabled reports whether spans are recorded and exported.
func (p *Provider) Enabled() bool { return p != nil && p.sdk != nil }

// TracerProvider is the provider itself (no-op when off).
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil {
		return noop.NewTracerProvider()
	}
	return p.tp
}

// Tracer returns tlgate's tracer, or nil when tracing is off: callers skip
// all span work on a nil tracer, so tracing off costs nothing.
func (p *Provider) Tracer() trace.Tracer {
	if !p.Enabled() {
		return nil
	}
	return p.tp.Tracer(ScopeName)
}

// Shutdown flushes spans not yet exported and stops the exporter.
func (p *Provider) Shutdown(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	if err := p.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// untrustedSampler samples a remote parent that is not sampled: when an
// untrusted client sent it, with probability ratio on a draw of its own per
// span (the parent's trace id is the client's choice: a ratio sampler on
// it would let the client pick ids that are always sampled); never
// otherwise. Only a request's span has a remote parent, so each request
// is drawn once; its other spans follow it.
type untrustedSampler struct {
	ratio float64
	draw  func() float64 // in [0, 1)
}

func (s untrustedSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	res := sdktrace.SamplingResult{Decision: sdktrace.Drop, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
	if tracectx.Untrusted(p.ParentContext) && s.draw() < s.ratio {
		res.Decision = sdktrace.RecordAndSample
	}
	return res
}

func (s untrustedSampler) Description() string {
	return fmt.Sprintf("UntrustedRemoteParent{RandomRatio{%g}}", s.ratio)
}
