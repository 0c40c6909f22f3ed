package request

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/wire/disagg"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// Disaggregated requests over the engines' own protocols (pd_vllm.go,
// pd_sglang.go) run as legs over the engines' HTTP surface:
//
//	vLLM:   prefill leg (P, kv_transfer_params asking for a remote decode,
//	        one token, whole) → decode leg (D, the client's request with the
//	        kv_transfer_params P answered; without them when P's one token
//	        ended the request and P holds nothing, so D prefills itself)
//	SGLang: prefill leg (P, whole) and decode leg (D) at once, both with
//	        P's bootstrap address and one random bootstrap room
//
// The decode leg is the request's attempt: it is relayed like a unified
// one, committed at its first byte, and nothing is retried after it. A leg
// that fails before then excludes its worker and the request is routed to
// another pair (a vLLM decode leg that failed without taking the request
// keeps the prefill worker and its KV, once). tlgate's own contract
// (disagg.go) runs tokenize → Prefill → decode instead.

// Legs of a disaggregated request, as logs, traces and metrics name them.
const (
	LegPrefill = PhasePrefill
	LegDecode  = PhaseDecode
)

// legAnswered is a prefill leg's outcome.
type legAnswered struct {
	gen  int
	resp *proxy.Response
	err  error
	took time.Duration
}

// pdState is what a disaggregated request over an engine protocol keeps
// across its pairs.
type pdState struct {
	gen int // the current pair; a prefill leg's answer of another is stale

	// vLLM: the kv_transfer_params of the last prefill leg, which holder
	// keeps the prompt's KV for; reused once a decode leg fails without
	// having taken the request.
	params []byte
	holder string
	reused bool
	// heldBody is the answer params came in (its prompt logprobs go with
	// the decode answer of a pair that reuses them).
	heldBody []byte
	keep     string // the prefill worker the next Route keeps (Request.KeepPrefill)

	// SGLang: the pair's room, and the prefill leg in flight (cancel).
	room   uint64
	cancel context.CancelFunc
	// prefillErr is the prefill leg's failure while the decode leg of its
	// pair was still waiting: that leg is canceled and fails as prefill.
	prefillErr error
	// prefillBody is the prefill leg's answer (for prompt logprobs);
	// prefilled: it has come; pending a decode answer waiting for it.
	prefillBody []byte
	prefilled   bool
	pending     *proxy.Response

	// Timings of the current pair's legs.
	prefillStart, prefillEnd, decodeStart time.Time
	report                                PDReport
}

// PDReport is what a disaggregated request did, for metrics (Deps.OnPD)
// and the access log.
type PDReport struct {
	Protocol fleet.Protocol
	// Pairs is how many pairs were tried (routes of the request).
	Pairs int
	// Prefill and Decode are the last pair's legs: the prefill leg's
	// duration, the decode leg's from its request to its answer's end;
	// TransferWait the time from the prefill leg's end to the decode
	// engine's first byte (streamed requests only: a whole answer's first
	// byte is its last). Zero: not measured.
	Prefill, Decode, TransferWait time.Duration
	// Failures are the legs that failed, in order.
	Failures []LegFailure
}

// LegFailure is one failed leg of a disaggregated request.
type LegFailure struct {
	Leg    string // LegPrefill, LegDecode (or tlgate's phases)
	Worker string
	Reason string
}

// String is the failure as the access log writes it: "prefill p1: timeout".
func (f LegFailure) String() string { return f.Leg + " " + f.Worker + ": " + f.Reason }

// disaggregate starts the attempt of a disaggregated target by its pair's
// protocol; a Responses or Messages request goes over chat completions
// (bridgeToChat).
func (a *requestActor) disaggregate(ctx actor.Context) {
	proto := a.target.Protocol()
	a.log.Protocol = string(proto)
	a.log.PrefillReason, a.log.DecodeReason = a.target.PrefillReason, a.target.DecodeReason
	if !a.dialect.Completions() && !a.bridgeToChat(ctx) {
		return
	}
	if proto == fleet.ProtocolTLGate {
		a.pdReport().Pairs++
		a.tokenize(ctx)
		return
	}
	if proto == fleet.ProtocolVLLM {
		if param, msg := vllmRefusal(&a.ex.Req); msg != "" {
			// The request is at fault: no other pair would serve it.
			a.log.LastError = msg
			a.finish(ctx, Outcome{Status: http.StatusBadRequest, Code: openai.CodeInvalidRequest, Message: msg, Param: param})
			return
		}
	}
	pd := a.pdOf()
	pd.gen++
	a.pdReport().Pairs++
	pd.prefillErr, pd.prefillBody, pd.prefilled, pd.pending = nil, nil, false, nil
	pd.prefillStart, pd.prefillEnd, pd.decodeStart = time.Time{}, time.Time{}, time.Time{}
	pd.report.Prefill, pd.report.Decode, pd.report.TransferWait = 0, 0, 0 // the last pair's
	switch proto {
	case fleet.ProtocolVLLM:
		a.vllmPair(ctx)
	case fleet.ProtocolSGLang:
		a.sglangPair(ctx)
	}
}

// dropParams forgets a vLLM prefill leg's params, the answer they came in
// and the worker that holds the KV they name: the next pair prefills.
func (pd *pdState) dropParams() {
	pd.params, pd.heldBody, pd.holder, pd.reused = nil, nil, "", false
}

// cancelLeg cancels the prefill leg in flight, if any.
func (pd *pdState) cancelLeg() {
	if pd.cancel != nil {
		pd.cancel()
		pd.cancel = nil
	}
}

// pdOf returns the request's engine-protocol state, made on first use.
func (a *requestActor) pdOf() *pdState {
	if a.pd == nil {
		a.pd = &pdState{}
	}
	return a.pd
}

// pdReport returns the report of a disaggregated request (any protocol).
func (a *requestActor) pdReport() *PDReport {
	pd := a.pdOf()
	pd.report.Protocol = a.target.Protocol()
	return &pd.report
}

// pdEdits are what a decode leg's body adds to an attempt's: the prefill
// leg's kv_transfer_params (vLLM) or the pair's bootstrap room (SGLang).
func (a *requestActor) pdEdits() []openai.Edit {
	if a.pd == nil || !a.target.Disaggregated() {
		return nil
	}
	switch a.target.Protocol() {
	case fleet.ProtocolVLLM:
		return []openai.Edit{disagg.KVTransferEdit(a.pd.params)}
	case fleet.ProtocolSGLang:
		host, port := a.target.Prefill.BootstrapAddress()
		return disagg.BootstrapEdits(host, port, a.pd.room)
	}
	return nil
}

// prefillLeg sends a prefill leg's body to the pair's prefill worker, off
// the mailbox; its outcome comes back as legAnswered. ctx bounds it; wait:
// the exchange waits for it (a leg the decode leg does not run beside).
func (a *requestActor) prefillLeg(ctx actor.Context, lctx context.Context, body []byte, wait bool) {
	pd := a.pd
	pd.prefillStart = time.Now()
	att := a.upstream(a.target.Prefill.HTTPAddress, body, nil)
	span := a.tracePrefillLeg(att.Header)
	self, root, p, gen, ex := ctx.Self(), ctx.ActorSystem().Root, a.d.Proxy, pd.gen, a.ex
	if wait {
		ex.wg.Add(1)
	}
	m := &legAnswered{gen: gen}
	spawn := ex.spawn
	if !wait {
		// A leg beside the decode leg may outlive the answer: never on
		// the edge's goroutine, which returns with the answer.
		spawn = spawnAway
	}
	spawn(func() {
		start := time.Now()
		resp, err := p.Fetch(lctx, att)
		if err == nil && resp.Status != http.StatusOK {
			err = fmt.Errorf("prefill answered %d", resp.Status)
		}
		endSpan(span, err)
		m.resp, m.err, m.took = resp, err, time.Since(start)
	}, func() {
		if wait {
			defer ex.wg.Done()
		}
		root.Send(self, m)
	})
}

// scheme is the engines' HTTP scheme.
func (a *requestActor) scheme() string {
	if a.d.Scheme == "" {
		return "http"
	}
	return a.d.Scheme
}

// onLegAnswered handles a prefill leg's outcome by its pair's protocol.
func (a *requestActor) onLegAnswered(ctx actor.Context, m *legAnswered) {
	pd := a.pd
	if pd == nil || m.gen != pd.gen || a.finished {
		return // a pair given up already
	}
	pd.prefillEnd = time.Now()
	pd.report.Prefill = pd.prefillEnd.Sub(pd.prefillStart)
	switch a.target.Protocol() {
	case fleet.ProtocolVLLM:
		a.vllmPrefilled(ctx, m)
	case fleet.ProtocolSGLang:
		a.sglangPrefilled(ctx, m)
	}
}

// prefillFailure is a prefill leg's failure as the request protocol takes
// it: an attempt error that is never a generation timeout (a prefill leg
// asks for one token); a 4xx answer is the engine's answer to the request
// (relayed: answerOf).
func prefillFailure(m *legAnswered) error {
	var ae *proxy.AttemptError
	if errors.As(m.err, &ae) {
		if ae.Generating {
			cp := *ae
			cp.Generating = false
			return &cp
		}
		return ae
	}
	return &proxy.AttemptError{Reason: proxy.FailBadAnswer, Err: m.err}
}

// answerOf is a prefill leg's client-error answer (a 4xx: the prompt too
// long, a bad field), which is the request's answer; nil otherwise.
func answerOf(m *legAnswered) *proxy.Response {
	if m.resp != nil && m.resp.Status >= 400 && m.resp.Status < 500 {
		return m.resp
	}
	return nil
}

// releasePrefillSlot gives back the prefill worker's in-flight slot once
// its leg is over: it computes nothing more for the request.
func (a *requestActor) releasePrefillSlot(ctx actor.Context) {
	p := a.target.Prefill
	if p == nil {
		return
	}
	for i, id := range a.held {
		if id == p.ID {
			a.held = append(a.held[:i], a.held[i+1:]...)
			ctx.Send(a.d.Router, &router.Release{WorkerID: id})
			return
		}
	}
}

// pdStepEnded ends the pairs of a cascade step whose answer was refused:
// an SGLang prefill leg still in flight is canceled, and a vLLM prefill
// worker's params are not reused by the next step (its decode leg took
// them, and the engine freed the blocks once they were read).
func (a *requestActor) pdStepEnded() {
	pd := a.pd
	if pd == nil {
		return
	}
	pd.cancelLeg()
	pd.dropParams()
	pd.keep = ""
}

// pdDecodeStarted marks the start of a decode leg.
func (a *requestActor) pdDecodeStarted() {
	if a.pd != nil && a.target.Disaggregated() {
		a.pd.decodeStart = time.Now()
	}
}

// pdDecodeEnded records the decode leg's end, with its first byte
// (streams; zero otherwise).
func (a *requestActor) pdDecodeEnded(firstByte time.Duration) {
	pd := a.pd
	if pd == nil || !a.target.Disaggregated() || pd.decodeStart.IsZero() {
		return
	}
	pd.report.Decode = time.Since(pd.decodeStart)
	if firstByte > 0 && !pd.prefillEnd.IsZero() {
		pd.report.TransferWait = max(0, pd.decodeStart.Add(firstByte).Sub(pd.prefillEnd))
	}
}

// pdFailure substitutes, for a decode leg that failed because it was
// canceled when its pair's prefill leg failed, that prefill failure.
func (a *requestActor) pdFailure(phase string, err error) (string, error) {
	if a.pd != nil && a.pd.prefillErr != nil && phase == PhaseDecode {
		err, a.pd.prefillErr = a.pd.prefillErr, nil
		return PhasePrefill, err
	}
	return phase, err
}

// pdFailed records a failed leg and decides what the next pair keeps: a
// vLLM decode leg that failed without taking the request (refused, or a
// 503 from an engine that would not take it) keeps the prefill worker,
// whose KV the next decode worker reads with the same params, once; when
// that one fails too, the prefill worker is excluded (its KV is what two
// decode workers could not use). Everything else prefills again. It
// returns a worker to exclude besides the blamed one ("" for none).
func (a *requestActor) pdFailed(phase, reason, blamed string) string {
	if !a.target.Disaggregated() {
		return ""
	}
	rep := a.pdReport()
	rep.Failures = append(rep.Failures, LegFailure{Leg: phase, Worker: blamed, Reason: reason})
	pd := a.pd
	pd.keep = ""
	pd.cancelLeg() // an SGLang pair's prefill leg: its room is given up
	if a.target.Protocol() != fleet.ProtocolVLLM || phase != PhaseDecode || pd.params == nil {
		pd.dropParams()
		return ""
	}
	if pd.reused {
		holder := pd.holder
		pd.dropParams()
		return holder
	}
	if reason == string(proxy.FailRefused) || reason == string(proxy.FailStatus503) {
		pd.keep, pd.reused = pd.holder, true
		return ""
	}
	pd.dropParams()
	return ""
}

// keepPrefill is the prefill worker the next Route keeps.
func (a *requestActor) keepPrefill() string {
	if a.pd == nil {
		return ""
	}
	return a.pd.keep
}

// pdEnd cancels a prefill leg still in flight and puts the report in the
// log and the hook.
func (a *requestActor) pdEnd() {
	pd := a.pd
	if pd == nil {
		return
	}
	pd.cancelLeg()
	r := pd.report
	a.log.Pairs, a.log.PrefillLeg, a.log.DecodeLeg, a.log.TransferWait = r.Pairs, r.Prefill, r.Decode, r.TransferWait
	for _, f := range r.Failures {
		a.log.LegFailures = append(a.log.LegFailures, f.String())
	}
	a.traceDecodeReport(r)
	if a.d.OnPD != nil && r.Pairs > 0 {
		a.d.OnPD(a.ex, r)
	}
}
