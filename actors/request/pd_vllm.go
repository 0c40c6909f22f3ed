package request

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/wire/disagg"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// vllmRefusal is the field of a request a vLLM pair cannot serve, and
// what the client is told (param "" and msg "" when it can). vLLM's
// prefill engine answers the kv_transfer_params of one request: a batch of
// prompts gets its first prompt's (serving_completion: final_res_batch[0])
// and n > 1 sampled choices, n child requests each holding its blocks, get
// one of them; the decode engine's prompts and choices would all read
// those blocks while the others stay held on the prefill engine until
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT. tlgate's own contract refuses a batch
// the same way (engineclient.PromptError).
func vllmRefusal(req *openai.Request) (param, msg string) {
	if n := req.Prompts(); n > 1 {
		return "prompt", fmt.Sprintf("prompt: this model is served disaggregated, which takes one prompt per request; send the %d prompts one by one.", n)
	}
	if req.Choices > 1 {
		return "n", fmt.Sprintf("n: this model is served disaggregated over vLLM's kv_transfer_params, which takes one choice per request; send n = 1 (%d requests for %d choices).", req.Choices, req.Choices)
	}
	return "", ""
}

// vllmPair runs a vLLM pair: its prefill leg, or straight its decode leg
// when the pair kept the prefill worker that holds the request's KV under
// the params a failed decode leg did not use.
func (a *requestActor) vllmPair(ctx actor.Context) {
	pd := a.pd
	if pd.params != nil && pd.reused && a.target.Prefill.ID == pd.holder {
		pd.prefillBody, pd.prefilled = pd.heldBody, true
		a.releasePrefillSlot(ctx)
		a.pdDecodeStarted()
		a.attempt(ctx, nil)
		return
	}
	pd.dropParams()
	a.prefillLeg(ctx, a.ex.Ctx, a.body(nil, disagg.VLLMPrefillEdits()...), true)
}

// vllmPrefilled takes a vLLM prefill leg's answer: its kv_transfer_params
// go to the decode leg; a failure excludes the prefill worker. An answer
// whose one token ended the request (disagg.ErrPrefillStopped: the engine
// holds no KV and answers null params) is a prefill leg that succeeded:
// the decode leg goes without kv_transfer_params and the decode engine
// prefills the prompt itself, as vLLM's toy proxy does.
func (a *requestActor) vllmPrefilled(ctx actor.Context, m *legAnswered) {
	if ans := answerOf(m); ans != nil {
		a.relayLegAnswer(ctx, ans)
		return
	}
	if m.err != nil {
		a.failed(ctx, prefillFailure(m), PhasePrefill)
		return
	}
	params, err := disagg.KVTransferParams(m.resp.Body)
	if err != nil && !errors.Is(err, disagg.ErrPrefillStopped) {
		a.failed(ctx, &proxy.AttemptError{Reason: proxy.FailBadAnswer, Err: err}, PhasePrefill)
		return
	}
	pd := a.pd
	if params == nil {
		pd.dropParams() // nothing held to reuse: a failed decode leg prefills again
		pd.prefillBody, pd.prefilled = m.resp.Body, true
	} else {
		pd.params, pd.heldBody, pd.holder, pd.prefillBody, pd.prefilled = params, m.resp.Body, a.target.Prefill.ID, m.resp.Body, true
	}
	a.prefillDone(ctx)
	a.pdDecodeStarted()
	a.attempt(ctx, nil)
}

// prefillDone ends a prefill leg that answered: the prefill worker's slot
// goes back, and its answer counts for its passive health.
func (a *requestActor) prefillDone(ctx actor.Context) {
	ctx.Send(a.d.Router, &router.AttemptSucceeded{WorkerID: a.target.Prefill.ID})
	a.releasePrefillSlot(ctx)
}

// relayLegAnswer answers the client with a prefill engine's client error
// (a 4xx): the request itself is at fault, as a unified engine would have
// said.
func (a *requestActor) relayLegAnswer(ctx actor.Context, ans *proxy.Response) {
	h := http.Header{}
	if ct := ans.Header.Get("Content-Type"); ct != "" {
		h.Set("Content-Type", ct)
	}
	a.finish(ctx, Outcome{Status: ans.Status, Header: h, Body: ans.Body})
}
