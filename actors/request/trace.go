package request

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/wire/proxy"
	"github.com/tlgate/tlgate/internal/wire/tracectx"
)

// Span names. The request span is named by GenAI convention
// "{gen_ai.operation.name} {gen_ai.request.model}".
const (
	SpanRoute       = "tlgate.route"
	SpanAttempt     = "tlgate.attempt"
	SpanCascadeStep = "tlgate.cascade_step"
	SpanTokenize    = "tlgate.tokenize"
	SpanPrefill     = "tlgate.prefill"
	SpanDecode      = "tlgate.decode"
	SpanRelease     = "tlgate.release"
)

// Attribute keys of tlgate's own (the GenAI, HTTP and error ones are
// OpenTelemetry's semantic conventions).
const (
	AttrRequestID     = attribute.Key("tlgate.request_id")
	AttrKeyName       = attribute.Key("tlgate.key_name")
	AttrStream        = attribute.Key("tlgate.stream")
	AttrRoute         = attribute.Key("tlgate.route")
	AttrCommitted     = attribute.Key("tlgate.committed")
	AttrAttempts      = attribute.Key("tlgate.attempts")
	AttrEscalations   = attribute.Key("tlgate.escalations")
	AttrPolicy        = attribute.Key("tlgate.route.policy")
	AttrReason        = attribute.Key("tlgate.route.reason")
	AttrCandidates    = attribute.Key("tlgate.route.candidates")
	AttrMatched       = attribute.Key("tlgate.route.matched_tokens") // cache_aware: the pick's cached prefix
	AttrNeedTokens    = attribute.Key("tlgate.route.needs_tokens")   // the pick asked for the prompt's tokens first
	AttrExcluded      = attribute.Key("tlgate.route.excluded")
	AttrDecisionUS    = attribute.Key("tlgate.route.decision_us")
	AttrWorker        = attribute.Key("tlgate.worker")
	AttrPrefillWorker = attribute.Key("tlgate.prefill_worker")
	AttrAttempt       = attribute.Key("tlgate.attempt")
	AttrOutcome       = attribute.Key("tlgate.outcome")
	AttrFailure       = attribute.Key("tlgate.failure_reason")
	AttrTTFBMS        = attribute.Key("tlgate.ttfb_ms")
	AttrStep          = attribute.Key("tlgate.cascade.step")
	AttrAcceptIf      = attribute.Key("tlgate.cascade.accept_if")
	AttrStatistic     = attribute.Key("tlgate.cascade.statistic")
	AttrStatValue     = attribute.Key("tlgate.cascade.value")
	// AttrSkipped is why a skipped cascade step had no routable worker.
	AttrSkipped      = attribute.Key("tlgate.cascade.skipped")
	AttrKVHandle     = attribute.Key("tlgate.kv.handle")
	AttrKVTarget     = attribute.Key("tlgate.kv.target")
	AttrPromptTokens = semconv.GenAIUsageInputTokensKey
	AttrOutputTokens = semconv.GenAIUsageOutputTokensKey
	// AttrUsageEstimated: the engine reported no usage, the gateway
	// estimated it (internal/wire/usage).
	AttrUsageEstimated = attribute.Key("tlgate.usage.estimated")
)

// Outcomes of an attempt span (AttrOutcome).
const (
	OutcomeOK        = "ok"
	OutcomeFailed    = "failed"    // before the first byte: failed over
	OutcomeEscalated = "escalated" // a cascade step whose answer was refused
	OutcomeError     = "error"     // the request ended with an error answer
	OutcomeBroken    = "broken"    // a committed stream that did not finish
	// Outcomes of a cascade step span besides OutcomeEscalated and
	// OutcomeFailed.
	OutcomeAccepted = "accepted" // accept_if held: the step's answer is the answer
	OutcomeFinal    = "final"    // the last step: answered without a judgement
	OutcomeSkipped  = "skipped"  // no routable worker: the next step was asked
)

// traceState holds the open spans of one request. It is allocated only
// when the Deps have a Tracer; without one every trace hook returns at once
// and allocates nothing.
type traceState struct {
	tracer  trace.Tracer
	ctx     context.Context // the request span's: parent of route, step, attempt
	req     trace.Span
	route   trace.Span
	routeAt time.Time
	step    trace.Span // the cascade step of the current attempt
	attempt trace.Span
	attCtx  context.Context // parent of the phase spans
	phase   trace.Span      // tokenize, prefill or decode of the current attempt
}

// TraceContext is the span context of the request span (invalid when
// tracing is off): the trace id for the access log and exemplars. Read it
// after Done.
func (ex *Exchange) TraceContext() trace.SpanContext {
	if ex.trace == nil {
		return trace.SpanContext{}
	}
	return *ex.trace
}

// traceStart opens the request span, a child of the client's trace when
// the edge extracted one into ex.Ctx.
func (a *requestActor) traceStart() {
	tr := a.d.Tracer
	if tr == nil {
		return
	}
	a.tr = &traceState{tracer: tr}
	op := semconv.GenAIOperationNameTextCompletion
	if a.ex.Req.Chat {
		op = semconv.GenAIOperationNameChat
	}
	a.tr.ctx, a.tr.req = tr.Start(a.ex.Ctx, op.Value.AsString()+" "+a.ex.Req.Model,
		trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(a.ex.Received),
		trace.WithAttributes(op, semconv.GenAIRequestModel(a.ex.Req.Model),
			AttrRequestID.String(a.ex.RequestID), AttrKeyName.String(a.ex.KeyName),
			AttrStream.Bool(a.ex.Req.Stream), attribute.String("url.path", a.ex.Path)))
	sc := a.tr.req.SpanContext()
	a.ex.trace = &sc
}

// traceRoute opens the span of one route decision.
func (a *requestActor) traceRoute() {
	if a.tr == nil {
		return
	}
	a.tr.routeAt = time.Now()
	_, a.tr.route = a.tr.tracer.Start(a.tr.ctx, SpanRoute, trace.WithTimestamp(a.tr.routeAt),
		trace.WithAttributes(AttrStep.Int(a.step), AttrExcluded.Int(len(a.exclude))))
}

// traceRouted closes the route span with the decision and opens the
// attempt span (inside a cascade step span on cascade routes).
func (a *requestActor) traceRouted(m *router.RouteResult) {
	if a.tr == nil || a.tr.route == nil {
		return
	}
	sp := a.tr.route
	a.tr.route = nil
	if errors.Is(m.Err, router.ErrNeedTokens) { // not a failure: it routes again with them
		sp.SetAttributes(AttrNeedTokens.Bool(true))
		sp.End()
		return
	}
	if m.Err != nil {
		sp.RecordError(m.Err)
		sp.SetStatus(codes.Error, m.Err.Error())
		sp.End()
		return
	}
	t := m.Target
	sp.SetAttributes(AttrRoute.String(t.Route), AttrPolicy.String(t.Policy), AttrReason.String(t.Reason),
		AttrCandidates.Int(t.Candidates), AttrWorker.String(t.Worker.ID), semconv.GenAIResponseModel(t.ServedModel),
		AttrDecisionUS.Int64(m.Took.Microseconds()))
	if t.Prefill != nil {
		sp.SetAttributes(AttrPrefillWorker.String(t.Prefill.ID))
	}
	if t.MatchedTokens > 0 {
		sp.SetAttributes(AttrMatched.Int(t.MatchedTokens))
	}
	sp.End()
	parent := a.tr.ctx
	if t.CascadeSteps > 1 {
		parent, a.tr.step = a.tr.tracer.Start(a.tr.ctx, SpanCascadeStep, trace.WithTimestamp(a.tr.routeAt),
			trace.WithAttributes(AttrRoute.String(t.Route), AttrStep.Int(t.CascadeStep), AttrAcceptIf.String(t.AcceptIf)))
		if t.CascadeStep == t.CascadeSteps-1 {
			a.tr.step.SetAttributes(AttrOutcome.String(OutcomeFinal))
		}
	}
	a.tr.attCtx, a.tr.attempt = a.tr.tracer.Start(parent, SpanAttempt, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(AttrAttempt.Int(a.attempts+1), AttrWorker.String(t.Worker.ID),
			semconv.ServerAddress(t.Worker.HTTPAddress), semconv.GenAIResponseModel(t.ServedModel)))
	if t.Prefill != nil {
		a.tr.attempt.SetAttributes(AttrPrefillWorker.String(t.Prefill.ID))
	}
}

// traceSkipped records a cascade step the router passed over: a step span
// with outcome skipped, saying why.
func (a *requestActor) traceSkipped(k router.Skip) {
	if a.tr == nil {
		return
	}
	_, sp := a.tr.tracer.Start(a.tr.ctx, SpanCascadeStep, trace.WithTimestamp(a.tr.routeAt),
		trace.WithAttributes(AttrRoute.String(a.ex.Req.Model), AttrStep.Int(k.Step), AttrOutcome.String(OutcomeSkipped),
			AttrSkipped.String(k.Why), semconv.GenAIResponseModel(k.Model)))
	sp.End()
}

// traceInject puts the trace context of the HTTP call to the engine into
// its headers: the attempt span's, or on a disaggregated route the decode
// span's, opened here.
func (a *requestActor) traceInject(h http.Header) {
	if a.tr == nil || a.tr.attempt == nil {
		return
	}
	ctx := a.tr.attCtx
	if a.target.Disaggregated() {
		ctx, a.tr.phase = a.tr.tracer.Start(a.tr.attCtx, SpanDecode, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(AttrWorker.String(a.target.Worker.ID), AttrKVHandle.String(a.handle)))
	}
	tracectx.Inject(ctx, h)
}

// traceAnswered records the engine's answer (or failure) on the attempt
// and closes the decode span.
func (a *requestActor) traceAnswered(status int, ttfb time.Duration, err error) {
	if a.tr == nil || a.tr.attempt == nil {
		return
	}
	if status > 0 {
		a.tr.attempt.SetAttributes(semconv.HTTPResponseStatusCode(status))
	}
	if ttfb > 0 {
		a.tr.attempt.SetAttributes(AttrTTFBMS.Float64(float64(ttfb.Microseconds()) / 1000))
	}
	a.tracePhaseEnd(err)
}

// traceJudged records a cascade step's verdict.
func (a *requestActor) traceJudged(lps []float64, accepted bool) {
	if a.tr == nil || a.tr.step == nil {
		return
	}
	outcome := OutcomeEscalated
	if accepted {
		outcome = OutcomeAccepted
	}
	a.tr.step.SetAttributes(AttrStatistic.String(string(a.target.Rule.Stat)), AttrOutcome.String(outcome))
	if v, ok := a.target.Rule.Stat.Of(lps); ok {
		a.tr.step.SetAttributes(AttrStatValue.Float64(v))
	}
}

// traceAttemptEnd closes the current attempt (and its open phase and step)
// with outcome; reason and err say why it failed.
func (a *requestActor) traceAttemptEnd(outcome, reason string, err error) {
	if a.tr == nil || a.tr.attempt == nil {
		return
	}
	a.tracePhaseEnd(err)
	sp := a.tr.attempt
	a.tr.attempt, a.tr.attCtx = nil, nil
	sp.SetAttributes(AttrOutcome.String(outcome))
	if reason != "" {
		sp.SetAttributes(AttrFailure.String(reason))
	}
	switch {
	case err != nil:
		sp.RecordError(err)
		sp.SetStatus(codes.Error, reason)
	case outcome == OutcomeBroken:
		sp.SetStatus(codes.Error, "the stream failed after its first byte")
	}
	sp.End()
	if a.tr.step != nil {
		if outcome == OutcomeFailed {
			a.tr.step.SetAttributes(AttrOutcome.String(OutcomeFailed))
		}
		a.tr.step.End()
		a.tr.step = nil
	}
}

// traceTokenize opens the tokenize span; the returned context carries it
// to the engine call (ex.Ctx when tracing is off).
func (a *requestActor) traceTokenize() context.Context {
	if a.tr == nil || a.tr.attCtx == nil {
		return a.ex.Ctx
	}
	_, sp := a.tr.tracer.Start(a.tr.attCtx, SpanTokenize, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(AttrPrefillWorker.String(a.target.Prefill.ID)))
	a.tr.phase = sp
	return trace.ContextWithSpan(a.ex.Ctx, sp)
}

// tracePrefill opens the prefill span; the returned context carries it to
// the gRPC call.
func (a *requestActor) tracePrefill() context.Context {
	if a.tr == nil || a.tr.attCtx == nil {
		return a.ex.Ctx
	}
	_, sp := a.tr.tracer.Start(a.tr.attCtx, SpanPrefill, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(AttrPrefillWorker.String(a.target.Prefill.ID), AttrKVTarget.String(a.target.Worker.KVAddress),
			AttrPromptTokens.Int(len(a.ids))))
	a.tr.phase = sp
	return trace.ContextWithSpan(a.ex.Ctx, sp)
}

// tracePhaseEnd closes the open phase span, with err when it failed and
// attrs besides.
func (a *requestActor) tracePhaseEnd(err error, attrs ...attribute.KeyValue) {
	if a.tr == nil || a.tr.phase == nil {
		return
	}
	sp := a.tr.phase
	a.tr.phase = nil
	sp.SetAttributes(attrs...)
	endSpan(sp, err)
}

// traceRelease opens the Release span of handle; the goroutine that calls
// Release ends it with endSpan.
func (a *requestActor) traceRelease(handle string) (context.Context, trace.Span) {
	if a.tr == nil || a.tr.ctx == nil {
		return context.Background(), nil
	}
	ctx, sp := a.tr.tracer.Start(a.tr.ctx, SpanRelease, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(AttrWorker.String(a.target.Worker.ID), AttrKVHandle.String(handle)))
	return ctx, sp
}

// endSpan ends sp (nil: nothing), marking it failed with err. Safe from
// any goroutine.
func endSpan(sp trace.Span, err error) {
	if sp == nil {
		return
	}
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// traceEnd closes every open span and the request span with the outcome.
func (a *requestActor) traceEnd(o Outcome) {
	if a.tr == nil || a.tr.req == nil {
		return
	}
	if a.tr.route != nil {
		a.tr.route.End()
		a.tr.route = nil
	}
	outcome := OutcomeOK
	switch {
	case o.Code != "":
		outcome = OutcomeError
	case o.Streamed && o.Log.Committed && !o.Log.Done:
		outcome = OutcomeBroken
	}
	a.traceAttemptEnd(outcome, "", nil)
	sp := a.tr.req
	a.tr.req = nil
	lg := o.Log
	committed := lg.Committed || (!o.Streamed && o.Code == "" && o.Status != 499)
	sp.SetAttributes(semconv.HTTPResponseStatusCode(o.Status), AttrCommitted.Bool(committed),
		AttrAttempts.Int(lg.Attempts))
	if lg.Route != "" {
		sp.SetAttributes(AttrRoute.String(lg.Route), semconv.GenAIResponseModel(lg.ServedModel), AttrWorker.String(lg.Worker))
	}
	if lg.Escalations > 0 {
		sp.SetAttributes(AttrEscalations.Int(lg.Escalations), AttrStep.Int(lg.CascadeStep))
	}
	switch {
	case lg.Usage.Total() > 0: // every answered step, streamed or not
		sp.SetAttributes(AttrPromptTokens.Int(lg.Usage.PromptTokens), AttrOutputTokens.Int(lg.Usage.CompletionTokens),
			AttrUsageEstimated.Bool(lg.Usage.Estimated))
	case a.ids != nil:
		sp.SetAttributes(AttrPromptTokens.Int(len(a.ids)))
	}
	if o.Code != "" {
		sp.SetAttributes(semconv.ErrorTypeKey.String(o.Code))
		if o.Status >= 500 {
			sp.SetStatus(codes.Error, o.Message)
		}
	}
	if len(lg.Failures) > 0 {
		sp.SetAttributes(attribute.StringSlice("tlgate.failures", lg.Failures))
	}
	sp.End()
}

// statusOf is the HTTP status of a non-streamed answer (0 without one).
func statusOf(r *proxy.Response) int {
	if r == nil {
		return 0
	}
	return r.Status
}
