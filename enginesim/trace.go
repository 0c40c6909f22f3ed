package enginesim

import (
	"context"
	"net/http"

	"github.com/tlgate/tlgate/internal/wire/tracectx"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// tracerName is the instrumentation scope of the engine's spans.
const tracerName = "github.com/tlgate/tlgate/enginesim"

// tracer returns the engine's tracer, or nil without Config.Tracer.
func (e *Engine) tracer() trace.Tracer {
	if e.cfg.Tracer == nil {
		return nil
	}
	return e.cfg.Tracer.Tracer(tracerName)
}

// startSpan opens a span under ctx's (a no-op span without a tracer).
func (e *Engine) startSpan(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	tr := e.tracer()
	if tr == nil {
		return ctx, trace.SpanFromContext(context.Background()) // a no-op span
	}
	attrs = append(attrs, attribute.String("tlgate.worker", e.cfg.ID), semconv.GenAIRequestModel(e.cfg.Model))
	return tr.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// traced wraps an HTTP handler in a server span that continues the
// caller's traceparent; without a tracer it is h itself.
func (e *Engine) traced(name string, h http.HandlerFunc) http.HandlerFunc {
	if e.cfg.Tracer == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		var attrs []attribute.KeyValue
		if kv := r.Header.Get("X-Tl-Kv-Handle"); kv != "" {
			attrs = append(attrs, attribute.String("tlgate.kv.handle", kv))
		}
		if id := r.Header.Get("X-Request-Id"); id != "" {
			attrs = append(attrs, attribute.String("tlgate.request_id", id))
		}
		ctx, span := e.startSpan(tracectx.Extract(r.Context(), r.Header, true), name, trace.SpanKindServer, attrs...)
		defer span.End()
		h(w, r.WithContext(ctx))
	}
}

// grpcTracing returns the server options that open a span per call,
// continuing the traceparent of the call's metadata (none without a
// tracer).
func (e *Engine) grpcTracing() []grpc.ServerOption {
	if e.cfg.Tracer == nil {
		return nil
	}
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, span := e.startSpan(tracectx.IncomingGRPC(ctx), "enginesim "+info.FullMethod, trace.SpanKindServer)
		defer span.End()
		resp, err := h(ctx, req)
		endErr(span, err)
		return resp, err
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, span := e.startSpan(tracectx.IncomingGRPC(ss.Context()), "enginesim "+info.FullMethod, trace.SpanKindServer)
		defer span.End()
		err := h(srv, &ctxStream{ServerStream: ss, ctx: ctx})
		endErr(span, err)
		return err
	}
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream)}
}

// endErr marks span failed with err (nil: nothing).
func endErr(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(otelcodes.Error, err.Error())
	}
}

// ctxStream is a server stream whose context carries the call's span.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }
