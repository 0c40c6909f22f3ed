// Package dialect is what the gateway knows of each API it relays, in one
// place: OpenAI's completions and chat completions (with the pooling and
// tokenizer endpoints beside them), OpenAI's Responses API and Anthropic's
// Messages API. A Dialect says which whole answers are successes, how an
// engine's client error is re-encoded for the client, which server-sent
// event ends a stream and which one ends a stream that failed after
// commit, where an answer's usage is (whole, and in a stream's events) and
// what text an estimate counts, and whether the engine may store its
// answers. The proxy judges answers and frames streams by it, the request
// actor reads usage, stored responses and cascades' logprobs through it.
//
// A whole answer is read once (Read): one pass over its top-level members,
// which everything later takes from (Answer).
package dialect

import (
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/anthropic"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/sse"
	"github.com/tlgate/tlgate/internal/wire/usage"
)

// Dialect is one API. The package's values (OpenAI, Responses, Messages)
// are shared by every exchange and never modified; a test may build its
// own with New.
type Dialect struct {
	// Name names the API in logs and tests.
	Name string
	// ends are the events that end a stream.
	ends sse.Ends
	// success reports whether a 2xx answer's members are this API's
	// answer; nil: OpenAI's endpoints (openai.Endpoint.AnswerHas).
	success func(a *Answer) bool
	// errorBody encodes an engine's client error for the client; nil:
	// OpenAI's shape.
	errorBody func(status int, code, msg string, param *string) []byte
	// errorEvent is the event written after a committed stream failed,
	// for reason; nil: OpenAI's error data event. seq is the sequence
	// number that follows the relayed events' (with sequenced).
	errorEvent func(reason string, seq int64) []byte
	// budgetEvent is the event written in place of the one that crossed
	// the key's tokens budget, ending the stream; nil: OpenAI's error
	// data event. seq is as errorEvent's.
	budgetEvent func(seq int64) []byte
	// sequenced: every event carries a "sequence_number" (the Responses
	// API).
	sequenced bool
	// stores: a 200 answer to a POST may be stored by the engine for
	// later requests, by its id (the Responses API).
	stores bool
	// inputOutput: usage as input_tokens and output_tokens (else
	// OpenAI's prompt_tokens and completion_tokens).
	inputOutput bool
	// text counts the bytes of an answer's generated text, for the
	// estimate.
	text func(a *Answer) int
	// streamEvent reads what a stream's data event says of the usage and
	// the response into w.
	streamEvent func(w *Writer, js string, data []byte)
}

// Spec is what New builds a Dialect of, for a test's own API.
type Spec struct {
	Name       string
	EndEvents  []string // events that end a stream; none: "data: [DONE]"
	DoneAlso   bool     // "data: [DONE]" ends a stream too
	ErrorEvent func(reason string, seq int64) []byte
	Sequenced  bool
}

// New returns a dialect of OpenAI's answers and usage with spec's stream
// ends and error event.
func New(spec Spec) *Dialect {
	d := *OpenAI
	d.Name = spec.Name
	d.ends = sse.Ends{Done: len(spec.EndEvents) == 0 || spec.DoneAlso, Names: spec.EndEvents}
	d.errorEvent, d.sequenced = spec.ErrorEvent, spec.Sequenced
	return &d
}

// Paths of the APIs besides completions and chat.
const (
	PathResponses = "/v1/responses"
	PathMessages  = anthropic.Path
)

// The dialects.
var (
	// OpenAI is completions and chat completions, and the pooling and
	// tokenizer endpoints: an answer has the shape of its endpoint, a
	// stream ends with "data: [DONE]", usage is prompt_tokens and
	// completion_tokens.
	OpenAI = &Dialect{
		Name:        "openai",
		ends:        sse.Ends{Done: true},
		text:        choicesText,
		streamEvent: openAIEvent,
	}
	// Responses is OpenAI's Responses API: an answer is an object
	// "response"; a stream ends with response.completed, response.failed,
	// response.incomplete or an error event; events are numbered; the
	// engine may store an answer.
	Responses = &Dialect{
		Name:    "responses",
		ends:    sse.Ends{Done: true, Names: []string{"response.completed", "response.failed", "response.incomplete", "error"}},
		success: func(a *Answer) bool { return a.Get("object").Str == "response" },
		errorEvent: func(reason string, seq int64) []byte {
			return openai.ResponsesErrorEvent(openai.CodeUpstreamFailed, failedMsg(reason), seq)
		},
		budgetEvent: func(seq int64) []byte {
			return openai.ResponsesErrorEvent(openai.CodeRateLimitExceeded, overBudgetMsg, seq)
		},
		sequenced:   true,
		stores:      true,
		inputOutput: true,
		text:        responsesText,
		streamEvent: responsesEvent,
	}
	// Messages is Anthropic's Messages API: an answer is an object of type
	// "message", errors are Anthropic-shaped, a stream ends with
	// message_stop or an error event.
	Messages = &Dialect{
		Name:    "messages",
		ends:    sse.Ends{Done: true, Names: []string{"message_stop", "error"}},
		success: func(a *Answer) bool { return a.Get("type").Str == "message" },
		errorBody: func(status int, _, msg string, _ *string) []byte {
			return anthropic.MarshalError(status, msg)
		},
		errorEvent: func(reason string, _ int64) []byte {
			return anthropic.SSEError(failedMsg(reason))
		},
		budgetEvent: func(int64) []byte {
			return anthropic.SSEErrorOf(anthropic.TypeRateLimit, overBudgetMsg)
		},
		inputOutput: true,
		text:        messagesText,
		streamEvent: messagesEvent,
	}
)

// Of returns the dialect of a request path: the Responses API's
// (/v1/responses and /v1/responses/{id}), the Messages API's, else
// OpenAI's.
func Of(path string) *Dialect {
	switch {
	case path == PathResponses || strings.HasPrefix(path, PathResponses+"/"):
		return Responses
	case path == PathMessages:
		return Messages
	}
	return OpenAI
}

// failedMsg is the message of the event that ends a stream failed after
// commit.
func failedMsg(reason string) string {
	return "The engine failed after the response started (" + reason + "); the response is incomplete."
}

// Ends are the events that end the dialect's streams.
func (d *Dialect) Ends() sse.Ends { return d.ends }

// Sequenced reports whether the dialect's events carry sequence numbers.
func (d *Dialect) Sequenced() bool { return d.sequenced }

// Stores reports whether the engine may store the dialect's answers.
func (d *Dialect) Stores() bool { return d.stores }

// Completions reports whether d is OpenAI's completions dialect, whose
// answers carry logprobs a cascade can judge.
func (d *Dialect) Completions() bool { return d == OpenAI }

// Success reports whether a whole 2xx answer a is a success of the
// dialect: for OpenAI's, of the shape endpoint expect's answers have.
func (d *Dialect) Success(a *Answer, expect openai.Endpoint) bool {
	if !a.Object() {
		return false
	}
	if d.success == nil {
		return expect.AnswerHas(a.Get)
	}
	return d.success(a)
}

// EncodeError encodes an engine's client error for the client.
func (d *Dialect) EncodeError(status int, code, msg string, param *string) []byte {
	if d.errorBody == nil {
		return openai.MarshalError(status, code, msg, param)
	}
	return d.errorBody(status, code, msg, param)
}

// ErrorEvent is the event that ends a stream failed after commit, for
// reason; seq is the sequence number that follows the relayed events'.
func (d *Dialect) ErrorEvent(reason string, seq int64) []byte {
	if d.errorEvent == nil {
		return openai.SSEError(openai.CodeUpstreamFailed, failedMsg(reason))
	}
	return d.errorEvent(reason, seq)
}

// Usage returns the usage object of a whole answer, and false when it has
// none.
func (d *Dialect) Usage(a *Answer) (usage.Usage, bool) {
	if d.inputOutput {
		return usage.FromInputOutput(a.Get("usage"))
	}
	return usage.FromOpenAI(a.Get("usage"))
}

// Estimate returns the usage of a whole answer: its usage object when it
// has one, else an estimate from prompt (the rendered prompt) and the
// answer's text.
func (d *Dialect) Estimate(a *Answer, prompt string) usage.Usage {
	if u, ok := d.Usage(a); ok {
		return u
	}
	return usage.Usage{PromptTokens: usage.EstimatePrompt(prompt), CompletionTokens: usage.EstimateText(d.text(a)), Estimated: true}
}

// choicesText counts completions' choices[].text and chat's
// choices[].message.content.
func choicesText(a *Answer) int {
	n := 0
	a.Get("choices").ForEach(func(_, c gjson.Result) bool {
		n += len(c.Get("text").Str) + len(c.Get("message.content").Str)
		return true
	})
	return n
}

// responsesText counts output[].content[].text.
func responsesText(a *Answer) int {
	n := 0
	a.Get("output").Get("#.content.#.text").ForEach(func(_, texts gjson.Result) bool {
		texts.ForEach(func(_, t gjson.Result) bool { n += len(t.Str); return true })
		return true
	})
	return n
}

// messagesText counts content[].text.
func messagesText(a *Answer) int {
	n := 0
	a.Get("content").Get("#.text").ForEach(func(_, t gjson.Result) bool { n += len(t.Str); return true })
	return n
}
