package usage

import (
	"bytes"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/openai"
)

// Dialect is the API whose answers carry the usage: where the figures are
// and what they are called.
type Dialect int

// The dialects.
const (
	// OpenAI completions, chat completions and embeddings: "usage" with
	// prompt_tokens and completion_tokens.
	OpenAI Dialect = iota
	// Responses is OpenAI's Responses API: "usage" with input_tokens and
	// output_tokens, in a stream inside the response.completed event's
	// "response".
	Responses
	// Anthropic is Anthropic's Messages API: "usage" with input_tokens and
	// output_tokens; a stream has the input in message_start's
	// "message.usage" and the output so far in each message_delta's "usage".
	Anthropic
)

// FromBodyOf returns the usage of a non-streamed answer of dialect d, and
// false when it has none.
func FromBodyOf(d Dialect, body []byte) (Usage, bool) {
	if d == OpenAI {
		return FromBody(body)
	}
	return fromInputOutput(gjson.GetBytes(body, "usage"))
}

// fromInputOutput reads a usage object of input_tokens and output_tokens.
func fromInputOutput(u gjson.Result) (Usage, bool) {
	if !u.IsObject() {
		return Usage{}, false
	}
	in, out := u.Get("input_tokens"), u.Get("output_tokens")
	if !in.Exists() && !out.Exists() {
		return Usage{}, false
	}
	return Usage{PromptTokens: clamp(in.Int()), CompletionTokens: clamp(out.Int())}, true
}

// EstimateOf is Estimate for an answer of dialect d: the answer's usage,
// else an estimate from prompt and the answer's text (Responses:
// output[].content[].text; Anthropic: content[].text).
func EstimateOf(d Dialect, body []byte, prompt string) Usage {
	if d == OpenAI {
		return Estimate(body, prompt)
	}
	if u, ok := FromBodyOf(d, body); ok {
		return u
	}
	n := 0
	switch d {
	case Responses:
		gjson.GetBytes(body, "output.#.content.#.text").ForEach(func(_, texts gjson.Result) bool {
			texts.ForEach(func(_, t gjson.Result) bool { n += len(t.Str); return true })
			return true
		})
	case Anthropic:
		gjson.GetBytes(body, "content.#.text").ForEach(func(_, t gjson.Result) bool { n += len(t.Str); return true })
	}
	return Usage{PromptTokens: EstimatePrompt(prompt), CompletionTokens: tokensOf(n), Estimated: true}
}

var responseCreated = []byte(`"response.created"`)

// streamUsage reads the usage of one data event of a Responses or
// Anthropic stream into s; it never drops the event.
func (s *Writer) streamUsage(js string, data []byte) {
	s.events++
	switch s.d {
	case Responses:
		s.seq = openai.NextSequenceNumber(data, s.seq)
		if s.respID == "" && bytes.Contains(data, responseCreated) {
			if id := gjson.Get(js, "response.id"); id.Type == gjson.String {
				s.respID = strings.Clone(id.Str)
			}
		}
		if !bytes.Contains(data, usageKey) {
			return
		}
		if u, ok := fromInputOutput(gjson.Get(js, "response.usage")); ok {
			s.usage, s.found = u, true
		}
	case Anthropic:
		if !bytes.Contains(data, usageKey) {
			return
		}
		switch gjson.Get(js, "type").Str {
		case "message_start":
			if u, ok := fromInputOutput(gjson.Get(js, "message.usage")); ok {
				s.usage, s.found = u, true
			}
		case "message_delta":
			u := gjson.Get(js, "usage")
			if !u.IsObject() {
				return
			}
			if out := u.Get("output_tokens"); out.Exists() {
				s.usage.CompletionTokens, s.found = clamp(out.Int()), true
			}
			if in := u.Get("input_tokens"); in.Exists() && in.Int() > 0 {
				s.usage.PromptTokens, s.found = clamp(in.Int()), true
			}
		}
	}
}

// ResponseID returns the id of the response a Responses stream announced
// in its response.created event ("" if none was seen).
func (s *Writer) ResponseID() string { return s.respID }
