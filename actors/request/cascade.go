package request

import (
	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// unforced strips from a cascade step's answer the logprobs the client
// did not ask for: all of them, or the alternatives per token beyond the
// number it asked for when the engine was asked for more (LeastLogprobs).
// The answer is the one the proxy read (proxy.Response.Answer): nothing
// parses it again.
func (a *requestActor) unforced(ans *dialect.Answer) []byte {
	if !a.ex.Req.Logprobs {
		return ans.StripLogprobs()
	}
	if asked := a.ex.Req.LogprobsTop; !a.ex.Req.Chat && asked != nil && *asked < openai.LeastLogprobs(a.target.Worker.Kind) {
		return ans.TrimTopLogprobs(*asked)
	}
	return ans.Body
}

// judge applies the step's accept_if to the answer's logprobs; an answer
// without readable logprobs or tokens is never accepted.
func (a *requestActor) judge(ans *dialect.Answer) bool {
	lps, err := ans.Logprobs()
	ok := err == nil && a.target.Rule.Holds(lps)
	a.traceJudged(lps, ok)
	return ok
}
