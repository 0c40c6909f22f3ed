package request

import (
	"net/http"

	"github.com/tlgate/tlgate/internal/wire/proxy"
	"github.com/tlgate/tlgate/internal/wire/usage"
)

// streamWriter returns the writer a streamed attempt relays to: the
// client's, wrapped to read the usage chunk the attempt's body asks for
// (body sets stream_options.include_usage) and to keep that chunk from a
// client that did not ask for it. With a tokens budget the stream reports
// its running usage (after what earlier answers of the request used) and is
// cut when the budget refuses more.
func (a *requestActor) streamWriter() http.ResponseWriter {
	var w http.ResponseWriter = a.ex.W
	if a.bridge != nil {
		w = a.bridge.Stream(w)
	}
	a.sniff = a.dialect.NewWriter(w, !a.ex.Req.AsksUsage)
	if b := a.ex.Tokens; b != nil && !a.retrieval() {
		prior := a.log.Usage.Total()
		a.sniff.Limit(usage.EstimatePrompt(a.ex.Req.Prompt), func(n int) bool { return b.Use(prior + n) })
	}
	return a.sniff
}

// overBudget reports whether the current stream was cut at its key's
// tokens budget.
func (a *requestActor) overBudget() bool {
	return a.sniff != nil && a.sniff.OverBudget()
}

// countStreamed adds the usage of a streamed attempt that reached the
// client with a 2xx answer: the engine's usage chunk, else the estimate.
func (a *requestActor) countStreamed(r proxy.Result) {
	if a.sniff == nil || !r.Committed || r.Status/100 != 2 || a.retrieval() {
		return
	}
	a.log.Usage.Add(a.sniff.Usage(a.ex.Req.Prompt))
	a.sniff = nil
}

// countFetched adds the usage of a non-streamed 200 answer (every cascade
// step that answered, accepted or not): its usage object, else the
// estimate. Tokenize and detokenize run no model and use no tokens.
func (a *requestActor) countFetched(resp *proxy.Response) {
	if resp.Status != http.StatusOK || a.ex.Req.Endpoint.Tokenizer() || a.retrieval() {
		return
	}
	a.log.Usage.Add(a.dialect.Estimate(&resp.Answer, a.ex.Req.Prompt))
}

// chargeAbandoned adds the estimated engine work of a non-streamed attempt
// that ended without an answer because it timed out generating or its
// client went away: the engine read the prompt and may have generated up
// to max_tokens (none counted when the request set no max_tokens), or, a
// disaggregated pair's prefill leg (prefill), the one token that leg asks
// for. The figures are marked Estimated; the key is charged them like any
// usage.
func (a *requestActor) chargeAbandoned(prefill bool) {
	if a.ex.Req.Stream {
		return
	}
	u := usage.Usage{PromptTokens: usage.EstimatePrompt(a.ex.Req.Prompt), Estimated: true}
	if m := a.ex.Req.MaxTokens; m != nil && *m > 0 {
		u.CompletionTokens = *m
		if prefill {
			u.CompletionTokens = 1
		}
	}
	a.log.Usage.Add(u)
	a.log.AbandonedAttempts++
}
