// Package usage reads the token usage of an engine's answer: the OpenAI
// "usage" object of a non-streamed answer (FromBody) or of a stream's usage
// chunk (Writer, which watches the events a stream relays), and estimates it
// when the engine sent none (Estimate, Writer.Usage).
//
// The estimate, used only when an answer carries no usage: prompt tokens are
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

// FromBody returns the usage object of a non-streamed answer (completions,
// chat, embeddings, score: prompt_tokens and completion_tokens; rerank:
// total_tokens, counted as prompt tokens), and false when it has none (or
// it is not an object).
func FromBody(body []byte) (Usage, bool) {
	return fromUsage(gjson.GetBytes(body, "usage"))
}

// fromUsage reads an OpenAI usage object.
func fromUsage(u gjson.Result) (Usage, bool) {
	if !u.IsObject() {
		return Usage{}, false
	}
	p, c := u.Get("prompt_tokens"), u.Get("completion_tokens")
	if !p.Exists() && !c.Exists() {
		// A rerank answer (vLLM's, Jina's) counts its input as total_tokens.
		if t := u.Get("total_tokens"); t.Exists() {
			return Usage{PromptTokens: clamp(t.Int())}, true
		}
		return Usage{}, false
	}
	return Usage{PromptTokens: clamp(p.Int()), CompletionTokens: clamp(c.Int())}, true
}

func clamp(n int64) int {
	return int(min(max(n, 0), maxTokens))
}

// tokensOf estimates the tokens of n bytes of text.
func tokensOf(n int) int { return (n + bytesPerToken - 1) / bytesPerToken }

// EstimatePrompt estimates the prompt tokens of a rendered prompt.
func EstimatePrompt(prompt string) int { return tokensOf(len(prompt)) }

// Estimate returns the usage of a non-streamed answer: its usage object
// when it has one, else an estimate from prompt and the answer's text
// (choices[].text and choices[].message.content).
func Estimate(body []byte, prompt string) Usage {
	if u, ok := FromBody(body); ok {
		return u
	}
	n := 0
	gjson.GetBytes(body, "choices").ForEach(func(_, c gjson.Result) bool {
		n += len(c.Get("text").Str) + len(c.Get("message.content").Str)
		return true
	})
	return Usage{PromptTokens: EstimatePrompt(prompt), CompletionTokens: tokensOf(n), Estimated: true}
}
