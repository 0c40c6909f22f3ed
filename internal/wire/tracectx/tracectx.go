// Package tracectx carries W3C trace context (traceparent, tracestate)
// across the wire: out of a client's HTTP headers (bounded, and with the
// sampled flag honoured only for a trusted client), into the headers and
// gRPC metadata of calls to engines, and into a context detached from a
// request's cancellation. It imports nothing of the project, so that the
// actors, the wire clients and the adapters can all use it.
package tracectx

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// propagator is W3C trace context: traceparent and tracestate.
func propagator() propagation.TraceContext { return propagation.TraceContext{} }

// Tracestate bounds: what Extract keeps of a client's tracestate.
const (
	MaxTraceStateMembers = 8
	MaxTraceStateBytes   = 256
)

// Extract returns ctx with the remote span context of h's traceparent and
// tracestate, or ctx itself when h carries none (or a malformed one). The
// sampled flag is kept only when trusted (a key with the trace scope);
// otherwise it is cleared and the request is sampled by the ratio. The
// tracestate keeps its first members (valid ones: a malformed tracestate is
// dropped whole) within MaxTraceStateMembers and MaxTraceStateBytes.
func Extract(ctx context.Context, h http.Header, trusted bool) context.Context {
	if h.Get("Traceparent") == "" {
		return ctx
	}
	ctx = propagator().Extract(ctx, propagation.HeaderCarrier(h))
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ctx
	}
	if !trusted {
		sc = sc.WithTraceFlags(sc.TraceFlags().WithSampled(false))
		ctx = context.WithValue(ctx, untrustedKey{}, true)
	}
	sc = sc.WithTraceState(boundTraceState(sc.TraceState()))
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// untrustedKey marks a context whose remote parent came from an untrusted
// client.
type untrustedKey struct{}

// Untrusted reports whether ctx's remote parent came from an untrusted
// client (Extract with trusted false): a sampler samples such a parent by
// its ratio instead of honouring its flag.
func Untrusted(ctx context.Context) bool { return ctx != nil && ctx.Value(untrustedKey{}) != nil }

// boundTraceState keeps ts's first members within the bounds.
func boundTraceState(ts trace.TraceState) trace.TraceState {
	var out trace.TraceState
	n, size := 0, 0
	ts.Walk(func(k, v string) bool {
		m := len(k) + 1 + len(v)
		if n > 0 {
			m++ // the comma
		}
		if n == MaxTraceStateMembers || size+m > MaxTraceStateBytes {
			return false
		}
		next, err := out.Insert(k, v)
		if err != nil {
			return false
		}
		// Insert puts a member first: keep the order by rebuilding below.
		out = next
		n, size = n+1, size+m
		return true
	})
	// out holds the kept members in reverse order; put them back in order.
	var ordered trace.TraceState
	out.Walk(func(k, v string) bool {
		ordered, _ = ordered.Insert(k, v)
		return true
	})
	return ordered
}

// Inject sets traceparent (and tracestate) in h from ctx's span context;
// it does nothing when ctx has no valid one.
func Inject(ctx context.Context, h http.Header) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator().Inject(ctx, propagation.HeaderCarrier(h))
}

// OutgoingGRPC returns ctx with traceparent (and tracestate) in its
// outgoing gRPC metadata, or ctx itself when it has no valid span context.
func OutgoingGRPC(ctx context.Context) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	propagator().Inject(ctx, mdCarrier(md))
	return metadata.NewOutgoingContext(ctx, md)
}

// IncomingGRPC returns ctx with the remote span context of its incoming
// gRPC metadata, or ctx itself when the metadata carries none.
func IncomingGRPC(ctx context.Context) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok || len(md.Get("traceparent")) == 0 {
		return ctx
	}
	return propagator().Extract(ctx, mdCarrier(md))
}

// mdCarrier adapts gRPC metadata to a propagation.TextMapCarrier.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Detached returns a context free of ctx's deadline and cancellation that
// carries only ctx's span context: for calls that must outlive the request
// (a KV Release). Without a valid span context it is context.Background().
func Detached(ctx context.Context) context.Context {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return context.Background()
	}
	return trace.ContextWithSpanContext(context.Background(), sc)
}

// SampledTraceID returns the trace id of sc when it is
// sampled (its spans are exported), else "": what an exemplar or a log
// line may point to.
func SampledTraceID(sc trace.SpanContext) string {
	if !sc.IsSampled() {
		return ""
	}
	return sc.TraceID().String()
}
