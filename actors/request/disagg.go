package request

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/internal/wire/engineclient"
	"github.com/tlgate/tlgate/internal/wire/openai"
	enginev1 "github.com/tlgate/tlgate/protos/tl/engine/v1"
	kvv1 "github.com/tlgate/tlgate/protos/tl/kv/v1"
)

// Engines are the engine calls of disaggregated serving
// (engineclient.Client implements them). Tokenize's errors that the
// request is at fault for are *engineclient.PromptError.
type Engines interface {
	Tokenize(ctx context.Context, httpAddr, model string, body []byte, chat bool) ([]uint32, error)
	Prefill(ctx context.Context, grpcAddr string, req *enginev1.PrefillRequest) (*enginev1.PrefillResponse, error)
	Release(ctx context.Context, kvAddr, handle string) (*kvv1.ReleaseResponse, error)
}

// The phases of a disaggregated request, in order. Each runs off the
// mailbox and reports back with a message:
//
//	tokenize (P's POST /v1/tokenize) → tokenized
//	prefill  (P's EngineControl/Prefill, KV pushed to D) → prefilled
//	decode   (D's HTTP surface with X-TL-KV-Handle) → fetched / streamed
//	release  (D's KvTransferService/Release) when decode did not finish
const (
	PhaseTokenize = "tokenize"
	PhasePrefill  = "prefill"
	PhaseDecode   = "decode"
	PhaseRelease  = "release"
)

// tokenize starts phase 1 on the prefill worker.
func (a *requestActor) tokenize(ctx actor.Context) {
	if a.ex.Req.Seed != nil {
		a.seed = *a.ex.Req.Seed
	} else if a.seed == 0 {
		// One seed for P and D, so a sampled stream equals a unified one.
		a.seed = rand.Uint64() >> 1 // keep it within int64 for JSON clients
	}
	if a.ids != nil && a.idsModel == a.target.ServedModel {
		// A retry with a new pair of the same model: the prompt ids are
		// the same. Another model (a cascade's next step, another
		// backend of the route) may tokenize the prompt otherwise.
		a.prefill(ctx)
		return
	}
	self, root, ex, eng := ctx.Self(), ctx.ActorSystem().Root, a.ex, a.d.Engines
	addr, model := a.target.Prefill.HTTPAddress, a.target.ServedModel
	tctx := a.traceTokenize()
	ex.wg.Add(1)
	var ids []uint32
	var err error
	ex.spawn(func() { ids, err = eng.Tokenize(tctx, addr, model, ex.Req.Object.Bytes(), ex.Req.Chat) }, func() {
		defer ex.wg.Done()
		root.Send(self, &tokenized{ids: ids, model: model, err: err})
	})
}

func (a *requestActor) onTokenized(ctx actor.Context, m *tokenized) {
	a.tracePhaseEnd(m.err, AttrPromptTokens.Int(len(m.ids)))
	var pe *engineclient.PromptError
	if errors.As(m.err, &pe) {
		// The request is at fault: no other pair would serve it.
		a.log.Phase, a.log.LastError = PhaseTokenize, m.err.Error()
		param := "prompt"
		if a.ex.Req.Chat {
			param = "messages"
		}
		a.finish(ctx, Outcome{Status: pe.Status, Code: openai.CodeInvalidRequest, Message: pe.Message, Param: param})
		return
	}
	if m.err != nil {
		a.failed(ctx, m.err, PhaseTokenize)
		return
	}
	a.ids, a.idsModel = m.ids, m.model
	a.prefill(ctx)
}

// prefill starts phase 2: Prefill on P, pushing the KV to D's KV address.
func (a *requestActor) prefill(ctx actor.Context) {
	req := &enginev1.PrefillRequest{
		RequestId:    a.ex.RequestID,
		Model:        a.target.ServedModel,
		PromptIds:    a.ids,
		Sampling:     Sampling(a.ex.Req, a.seed),
		DecodeTarget: a.target.Worker.KVAddress,
		KvFormat:     a.target.Worker.KVFormat,
	}
	self, root, ex, eng := ctx.Self(), ctx.ActorSystem().Root, a.ex, a.d.Engines
	addr := a.target.Prefill.GRPCAddress
	pctx := a.tracePrefill()
	ex.wg.Add(1)
	m := &prefilled{}
	ex.spawn(func() {
		start := time.Now()
		resp, err := eng.Prefill(pctx, addr, req)
		m.took, m.err = time.Since(start), err
		if resp != nil {
			m.handle = resp.GetHandleId()
		}
	}, func() {
		defer ex.wg.Done()
		root.Send(self, m)
	})
}

func (a *requestActor) onPrefilled(ctx actor.Context, m *prefilled) {
	a.tracePhaseEnd(m.err, AttrKVHandle.String(m.handle))
	if m.err != nil {
		a.failed(ctx, m.err, PhasePrefill)
		return
	}
	if a.d.OnKV != nil {
		a.d.OnKV(PhasePrefill, m.took)
	}
	a.pdReport().Prefill, a.pd.prefillEnd = m.took, time.Now()
	a.pdDecodeStarted()
	a.handle = m.handle
	// Phase 3: decode from D, resuming from the pushed KV.
	a.attempt(ctx, http.Header{"X-Tl-Kv-Handle": {m.handle}})
}

// releaseHandle runs phase 4 when a handle is still held: the decode did not
// finish (client gone, D failed, timeout, or the request moved on), so the
// pushed blocks go back to D's pool now rather than at its hold timeout.
// Release is idempotent on the engine side.
func (a *requestActor) releaseHandle() {
	if a.handle == "" || a.target.Prefill == nil {
		return
	}
	handle, addr, eng, onKV := a.handle, a.target.Worker.KVAddress, a.d.Engines, a.d.OnKV
	a.handle = ""
	rctx, span := a.traceRelease(handle)
	// The client's answer does not wait for it: D answers a Release at
	// once, but one that stopped answering holds it up to the engine
	// client's timeout.
	wg := a.d.Detached
	if wg == nil {
		wg = &a.ex.wg
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		_, err := eng.Release(rctx, addr, handle)
		endSpan(span, err)
		if onKV != nil {
			if err != nil {
				onKV("failure:"+PhaseRelease, time.Since(start))
			} else {
				onKV(PhaseRelease, time.Since(start))
			}
		}
	}()
}

// Sampling fills every field of the contract's SamplingParams: the client's
// value where it sent one, the documented default otherwise (proto3 has no
// "unset").
func Sampling(r openai.Request, seed uint64) *enginev1.SamplingParams {
	s := &enginev1.SamplingParams{Temperature: 1.0, TopP: 1.0, MaxTokens: 16, Seed: seed, Logprobs: r.Logprobs, Stop: r.Stop}
	if r.Chat {
		s.MaxTokens = 256
	}
	if r.Temperature != nil {
		s.Temperature = float32(*r.Temperature)
	}
	if r.TopP != nil {
		s.TopP = float32(*r.TopP)
	}
	if r.TopK != nil && *r.TopK > 0 {
		s.TopK = uint32(*r.TopK)
	}
	if r.MaxTokens != nil && *r.MaxTokens >= 0 {
		s.MaxTokens = uint32(*r.MaxTokens)
	}
	if r.PresencePenalty != nil {
		s.PresencePenalty = float32(*r.PresencePenalty)
	}
	if r.FrequencyPenalty != nil {
		s.FrequencyPenalty = float32(*r.FrequencyPenalty)
	}
	if r.TopLogprobs != nil && *r.TopLogprobs > 0 {
		s.TopLogprobs = uint32(*r.TopLogprobs)
	}
	return s
}
