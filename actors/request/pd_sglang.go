package request

import (
	"context"
	"net/http"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/disagg"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// sglangPair runs an SGLang pair: a new bootstrap room, and the same
// request with it sent at once to the prefill worker (answered whole) and
// to the decode worker (the attempt, relayed to the client).
func (a *requestActor) sglangPair(ctx actor.Context) {
	pd := a.pd
	pd.room = disagg.NewRoom()
	body := a.body(nil, append(a.pdEdits(), disagg.SGLangPrefillEdits()...)...)
	// The prefill leg ends with the client, or when its pair is given up.
	lctx, cancel := context.WithCancel(a.ex.Ctx)
	pd.cancel = cancel
	a.prefillLeg(ctx, lctx, body, false)
	a.pdDecodeStarted()
	a.attempt(ctx, nil)
}

// sglangPrefilled takes an SGLang prefill leg's answer. An answer keeps
// its body for the prompt logprobs and releases a decode answer that
// waited for it. A failure while the decode leg still waits for its KV
// cancels that leg, which then fails as the prefill's failure (pdFailure);
// after the decode leg's first byte, or its whole answer, it changes
// nothing.
func (a *requestActor) sglangPrefilled(ctx actor.Context, m *legAnswered) {
	pd := a.pd
	pd.cancelLeg() // the leg is over
	if m.err == nil {
		pd.prefillBody, pd.prefilled = m.resp.Body, true
		a.prefillDone(ctx)
		if resp := pd.pending; resp != nil {
			pd.pending = nil
			a.answered(ctx, a.withPromptLogprobs(resp))
		}
		return
	}
	pd.prefilled = true
	if resp := pd.pending; resp != nil {
		pd.pending = nil
		a.answered(ctx, resp)
		return
	}
	if a.ex.Committed() || a.cancel == nil {
		return
	}
	if ans := answerOf(m); ans != nil {
		// The prompt is refused (too long, a bad field): the decode leg
		// would wait for KV that never comes.
		a.endAttempt(ctx)
		a.relayLegAnswer(ctx, ans)
		return
	}
	pd.prefillErr = prefillFailure(m)
	a.endAttempt(ctx) // the decode leg reports back, canceled, as failed
}

// pdHold reports whether a decode leg's whole answer waits for its pair's
// prefill answer, whose prompt logprobs are merged into it: the client
// asked for them and the prefill leg has not answered yet.
func (a *requestActor) pdHold(resp *proxy.Response) bool {
	pd := a.pd
	if pd == nil || a.target.Protocol() != fleet.ProtocolSGLang || pd.prefilled || resp.Status != http.StatusOK ||
		!disagg.WantsPromptLogprobs(a.ex.Req.Object.Bytes()) {
		return false
	}
	pd.pending = resp
	return true
}

// withPromptLogprobs returns a decode leg's whole answer with the prefill
// leg's prompt logprobs merged in, when the client asked for them.
func (a *requestActor) withPromptLogprobs(resp *proxy.Response) *proxy.Response {
	pd := a.pd
	if pd == nil || pd.prefillBody == nil || resp.Status != http.StatusOK || !disagg.WantsPromptLogprobs(a.ex.Req.Object.Bytes()) {
		return resp
	}
	if b, ok := disagg.MergePromptLogprobs(pd.prefillBody, resp.Body); ok {
		cp := *resp
		cp.Body, cp.Answer = b, dialect.Read(b) // a new answer, read once
		return &cp
	}
	return resp
}
