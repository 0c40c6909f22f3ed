package request

import (
	"context"
	"net/http"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// attempt sends the request to the target's worker from a goroutine.
func (a *requestActor) attempt(ctx actor.Context, extra http.Header) {
	var seed *uint64
	if a.target.Protocol() == fleet.ProtocolTLGate {
		seed = &a.seed // tlgate's contract: the seed P prefilled with
	}
	att := a.upstream(a.target.Worker.HTTPAddress, a.body(seed, a.pdEdits()...), extra)
	a.traceInject(att.Header)
	a.traceDecodeLeg()
	actx, cancel := context.WithCancel(a.ex.Ctx)
	a.cancel = cancel
	started := time.Now()
	a.attemptStart = started
	self, root, ex, p := ctx.Self(), ctx.ActorSystem().Root, a.ex, a.d.Proxy
	ex.wg.Add(1)
	if !ex.Req.Stream {
		var resp *proxy.Response
		var err error
		ex.spawn(func() { resp, err = p.Fetch(actx, att) }, func() {
			defer ex.wg.Done()
			root.Send(self, &fetched{resp: resp, err: err})
		})
		return
	}
	debug, target, step, rt := ex.Debug, a.target, a.target.CascadeStep, a.d.Router
	worker := target.Worker.ID
	sw := a.streamWriter()
	var res proxy.Result
	ex.spawn(func() {
		res = p.Stream(actx, att, sw, func(status int, uh http.Header) {
			ex.committed.Store(true)
			reportAnswer(root.Send, rt, target, status, time.Since(started))
			responseHeaders(ex.W.Header(), ex.RequestID, debug, worker, cascadeStep(target, step))
		})
	}, func() {
		defer ex.wg.Done()
		root.Send(self, &streamed{res: res})
	})
}

// upstream is a request of the exchange to the engine at addr: body, the
// request ids, extra headers (X-TL-KV-Handle) and room for the trace
// context (a header map only when there is something to put in it).
func (a *requestActor) upstream(addr string, body []byte, extra http.Header) proxy.Attempt {
	var h http.Header
	if extra != nil || a.tr != nil {
		h = make(http.Header, len(extra)+2)
		for k, v := range extra {
			h[k] = v
		}
	}
	url := a.scheme() + "://" + addr + a.enginePath()
	if a.ex.Query != "" {
		url += "?" + a.ex.Query
	}
	return proxy.Attempt{URL: url, Body: body, Header: h,
		RequestID: a.ex.RequestID, ClientRequestID: a.ex.ClientRequestID,
		Expect: a.expect(), Method: a.ex.Method, Dialect: a.dialect}
}

func (a *requestActor) onFetched(ctx actor.Context, m *fetched) {
	a.endAttempt(ctx)
	a.traceAnswered(statusOf(m.resp), 0, m.err)
	a.pdDecodeEnded(0)
	if m.err != nil {
		phase := "attempt"
		if a.target.Disaggregated() {
			phase = PhaseDecode
		}
		a.failed(ctx, m.err, phase)
		return
	}
	if a.pdHold(m.resp) { // pd_sglang.go: the prefill's prompt logprobs are to come
		return
	}
	if m.resp.Status/100 == 2 && a.target.Disaggregated() {
		a.handle = "" // the decode worker freed the blocks when it answered
	}
	a.answered(ctx, a.withPromptLogprobs(m.resp))
}

// answered handles an engine's whole answer: judged by a cascade step, or
// relayed.
func (a *requestActor) answered(ctx actor.Context, resp *proxy.Response) {
	if a.d.OnAnswered != nil {
		a.d.OnAnswered(a.ex, resp)
	}
	a.reportFetched(ctx, resp.Status)
	a.blameDoubted(ctx, resp.Status)
	a.countFetched(resp)
	if a.target.CascadeStep < a.target.CascadeSteps-1 && resp.Status == http.StatusOK {
		accepted := a.judge(&resp.Answer)
		if a.d.OnCascade != nil {
			a.d.OnCascade(a.ex, a.target.Route, a.target.CascadeStep, accepted)
		}
		if !accepted {
			a.keep(resp)
			a.releaseHeld(ctx)
			a.pdStepEnded()
			a.log.Escalations++
			a.judged++
			a.traceAttemptEnd(OutcomeEscalated, "", nil)
			a.step = a.target.CascadeStep + 1
			a.route(ctx)
			return
		}
	}
	a.remember(resp)
	body := resp.Body
	if a.target.CascadeStep < a.target.CascadeSteps-1 && resp.Answer.Object() {
		// A success carries the logprobs the step forced on; an engine's
		// error answer (a 4xx) is relayed as it is.
		body = a.unforced(&resp.Answer)
	}
	h := http.Header{}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		h.Set("Content-Type", ct)
	}
	a.log.TTFT = time.Since(a.ex.Received)
	a.finish(ctx, Outcome{Status: resp.Status, Header: h, Body: body})
}

func (a *requestActor) onStreamed(ctx actor.Context, m *streamed) {
	a.endAttempt(ctx)
	r := m.res
	if a.overBudget() {
		// The Writer ended the stream with rate_limit_exceeded; the client
		// did not go away.
		r.ClientGone = false
		a.log.StreamFailure = openai.CodeRateLimitExceeded
	}
	if !r.Committed && r.ClientGone && a.ex.Ctx.Err() == nil && a.pd != nil && a.pd.prefillErr != nil {
		// Canceled here when its pair's prefill leg failed (pd_sglang.go).
		r.ClientGone = false
	}
	a.rememberStreamed(r)
	a.countStreamed(r)
	a.traceAnswered(r.Status, r.FirstByte, r.Err)
	a.pdDecodeEnded(r.FirstByte)
	a.log.FirstByte = r.FirstByte
	if r.Committed {
		a.log.TTFT = a.attemptStart.Sub(a.ex.Received) + r.FirstByte
	}
	a.log.Committed = r.Committed
	a.log.ClientGone = r.ClientGone
	a.log.Done = r.Done
	if r.Committed && r.Err != nil {
		// The engine cut the stream, or the client stopped reading it or
		// went away: either way it was answered 200; the log says which.
		a.log.LastError = r.Err.Error()
		if !r.ClientGone && a.log.StreamFailure == "" {
			a.log.StreamFailure = string(proxy.ReasonOf(r.Err))
		}
	}
	if !r.Committed && !r.ClientGone && r.Err != nil {
		a.failed(ctx, r.Err, "decode")
		return
	}
	if r.Answer != nil { // an engine's error answer, relayed as a whole
		a.answered(ctx, r.Answer)
		return
	}
	if r.Committed {
		a.blameDoubted(ctx, r.Status)
	}
	if r.Done && a.target.Disaggregated() {
		a.handle = "" // the decode worker freed the blocks when the stream ended
	}
	a.finish(ctx, Outcome{Status: r.Status, Streamed: true})
}

func (a *requestActor) endAttempt(_ actor.Context) {
	if a.cancel != nil {
		a.cancel()
		a.cancel = nil
	}
}
