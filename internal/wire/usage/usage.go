// Package usage is the token usage of a request: the figures (Usage), the
// readers of the usage objects engines send (FromOpenAI, FromInputOutput;
// where each API puts them is internal/wire/dialect's), and the estimate
// used when an answer carries none.
//
// The estimate: prompt tokens are
// the rendered prompt's bytes / 4, rounded up (about 4 bytes per token for
// English text under common BPE tokenizers); completion tokens are the
// answer text's bytes / 4, rounded up, for a non-streamed answer, and the
// number of data events relayed (excluding [DONE]) for a stream, since
// engines send about one token per event. An estimated Usage says so
// (Estimated), and the access log shows it.
package usage

import (
	"github.com/tidwall/gjson"
	"github.com/tlgate/tlgate/internal/routing/prefixindex"
)

// maxTokens bounds one usage figure; a larger one (a lying or broken
// engine) is clamped.
const maxTokens = 1<<31 - 1

// bytesPerToken is the estimate's bytes per token.
const bytesPerToken = prefixindex.DefaultBytesPerToken

// Usage is the tokens one answer used.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// Estimated is true when (part of) the figures are an estimate because
	// the engine reported none.
	Estimated bool
}

// Total is prompt + completion tokens.
func (u Usage) Total() int { return u.PromptTokens + u.CompletionTokens }

// Add sums v into u (several answers of one request: cascade steps).
func (u *Usage) Add(v Usage) {
	u.PromptTokens = min(u.PromptTokens+v.PromptTokens, maxTokens)
	u.CompletionTokens = min(u.CompletionTokens+v.CompletionTokens, maxTokens)
	u.Estimated = u.Estimated || v.Estimated
}

// FromOpenAI reads an OpenAI usage object (completions, chat, embeddings,
// score: prompt_tokens and completion_tokens; rerank: total_tokens,
// counted as prompt tokens), and false when there is none (or it is not an
// object).
func FromOpenAI(u gjson.Result) (Usage, bool) {
	if !u.IsObject() {
		return Usage{}, false
	}
	p, c := u.Get("prompt_tokens"), u.Get("completion_tokens")
	if !p.Exists() && !c.Exists() {
		// A rerank answer (vLLM's, Jina's) counts its input as total_tokens.
		if t := u.Get("total_tokens"); t.Exists() {
			return Usage{PromptTokens: Clamp(t.Int())}, true
		}
		return Usage{}, false
	}
	return Usage{PromptTokens: Clamp(p.Int()), CompletionTokens: Clamp(c.Int())}, true
}

// FromInputOutput reads a usage object of input_tokens and output_tokens
// (the Responses API's, Anthropic's), and false when there is none.
func FromInputOutput(u gjson.Result) (Usage, bool) {
	if !u.IsObject() {
		return Usage{}, false
	}
	in, out := u.Get("input_tokens"), u.Get("output_tokens")
	if !in.Exists() && !out.Exists() {
		return Usage{}, false
	}
	return Usage{PromptTokens: Clamp(in.Int()), CompletionTokens: Clamp(out.Int())}, true
}

// Clamp bounds a usage figure an engine reported to [0, 2^31-1].
func Clamp(n int64) int {
	return int(min(max(n, 0), maxTokens))
}

// tokensOf estimates the tokens of n bytes of text.
func tokensOf(n int) int { return (n + bytesPerToken - 1) / bytesPerToken }

// EstimatePrompt estimates the prompt tokens of a rendered prompt.
func EstimatePrompt(prompt string) int { return tokensOf(len(prompt)) }

// EstimateText estimates the tokens of n bytes of generated text.
func EstimateText(n int) int { return tokensOf(n) }
