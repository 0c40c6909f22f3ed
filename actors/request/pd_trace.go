package request

import (
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/wire/disagg"
	"github.com/tlgate/tlgate/internal/wire/tracectx"
)

// Attribute keys of disaggregated requests.
const (
	AttrProtocol      = attribute.Key("tlgate.disagg.protocol")
	AttrPrefillReason = attribute.Key("tlgate.disagg.prefill_reason")
	AttrDecodeReason  = attribute.Key("tlgate.disagg.decode_reason")
	AttrRoom          = attribute.Key("tlgate.disagg.bootstrap_room")
	AttrRemoteEngine  = attribute.Key("tlgate.disagg.remote_engine")
	AttrPairs         = attribute.Key("tlgate.disagg.pairs")
	AttrPrefillMS     = attribute.Key("tlgate.disagg.prefill_ms")
	AttrDecodeMS      = attribute.Key("tlgate.disagg.decode_ms")
	AttrTransferMS    = attribute.Key("tlgate.disagg.transfer_wait_ms")
	AttrLegFailures   = attribute.Key("tlgate.disagg.failures")
)

// tracePrefillLeg opens the span of a prefill leg over HTTP (a child of
// the attempt) and puts its context in the leg's headers; the leg's
// goroutine ends it (endSpan). nil when tracing is off.
func (a *requestActor) tracePrefillLeg(h http.Header) trace.Span {
	if a.tr == nil || a.tr.attCtx == nil {
		return nil
	}
	t := a.target
	attrs := []attribute.KeyValue{AttrPrefillWorker.String(t.Prefill.ID), semconv.ServerAddress(t.Prefill.HTTPAddress),
		AttrProtocol.String(string(t.Protocol())), AttrPrefillReason.String(t.PrefillReason)}
	if t.MatchedTokens > 0 {
		attrs = append(attrs, AttrMatched.Int(t.MatchedTokens))
	}
	if t.Protocol() == fleet.ProtocolSGLang {
		attrs = append(attrs, AttrRoom.String(strconv.FormatUint(a.pd.room, 10)))
	}
	ctx, sp := a.tr.tracer.Start(a.tr.attCtx, SpanPrefill, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	tracectx.Inject(ctx, h)
	return sp
}

// traceDecodeLeg adds what the decode leg of an engine-protocol pair is
// to its span (opened by traceInject).
func (a *requestActor) traceDecodeLeg() {
	if a.tr == nil || a.tr.phase == nil || a.pd == nil {
		return
	}
	t := a.target
	a.tr.phase.SetAttributes(AttrProtocol.String(string(t.Protocol())), AttrDecodeReason.String(t.DecodeReason))
	switch t.Protocol() {
	case fleet.ProtocolVLLM:
		a.tr.phase.SetAttributes(AttrRemoteEngine.String(disagg.RemoteEngine(a.pd.params)))
	case fleet.ProtocolSGLang:
		a.tr.phase.SetAttributes(AttrRoom.String(strconv.FormatUint(a.pd.room, 10)))
	}
}

// traceDecodeReport puts a disaggregated request's report on its span.
func (a *requestActor) traceDecodeReport(r PDReport) {
	if a.tr == nil || a.tr.req == nil || r.Pairs == 0 {
		return
	}
	a.tr.req.SetAttributes(AttrProtocol.String(string(r.Protocol)), AttrPairs.Int(r.Pairs))
	ms := func(k attribute.Key, d interface{ Microseconds() int64 }) {
		if us := d.Microseconds(); us > 0 {
			a.tr.req.SetAttributes(k.Float64(float64(us) / 1000))
		}
	}
	ms(AttrPrefillMS, r.Prefill)
	ms(AttrDecodeMS, r.Decode)
	ms(AttrTransferMS, r.TransferWait)
	if len(r.Failures) > 0 {
		fs := make([]string, len(r.Failures))
		for i, f := range r.Failures {
			fs[i] = f.String()
		}
		a.tr.req.SetAttributes(AttrLegFailures.StringSlice(fs))
	}
}
