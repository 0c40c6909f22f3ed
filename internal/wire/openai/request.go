package openai

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// PrefixKeyLen is the length of the affinity key: the leading bytes of the
// rendered prompt, about one 16-token KV block at about 4 bytes per token
// (design 2.3).
const PrefixKeyLen = 64

// Request is what the gateway reads from a client's /v1/completions or
// /v1/chat/completions body. The body itself is never re-encoded: attempts
// send the client's bytes with single fields rewritten (WithModel, WithSeed,
// ForceLogprobs). Pointer fields are nil when the client omitted them or sent
// null.
type Request struct {
	// Model is the model id the client asked for (non-empty).
	Model string
	// Stream is true when the client asked for server-sent events.
	Stream bool
	// Chat is true for /v1/chat/completions bodies.
	Chat bool
	// Endpoint is the kind of request: chat or completions for
	// ParseRequest's, the pooling and tokenizer endpoints for theirs.
	Endpoint Endpoint
	// CacheSalt is vLLM's cache_salt: the engine's prefix cache, and the
	// gateway's prefix index, share entries only between requests with
	// the same salt (empty: none). The parsers read the client's; the edge
	// puts its key's in its place (auth.Key.CacheSalt).
	CacheSalt string
	// Logprobs is true when the client asked for logprobs: chat
	// "logprobs": true; completions "logprobs": a number >= 0 (or true).
	Logprobs bool
	// Seed is the client's sampling seed.
	Seed *uint64
	// PrefixKey is the affinity key: the leading PrefixKeyLen bytes of Prompt.
	PrefixKey []byte
	// Prompt is the rendered prompt: the completions prompt (an array of
	// strings concatenated in order, a token-id prompt as empty text), or the
	// chat messages written as "role\ncontent\n" in order, where content given
	// as parts contributes its text parts concatenated.
	Prompt string
	// PreviousResponseID (Responses API) names the stored response the
	// request continues; Store (Responses API, default true) asks the
	// engine to keep this response for later requests.
	PreviousResponseID string
	Store              bool

	Temperature      *float64
	TopP             *float64
	TopK             *int
	MaxTokens        *int // max_tokens, or max_completion_tokens (chat) which wins when both are sent
	Stop             []string
	PresencePenalty  *float64
	FrequencyPenalty *float64
	TopLogprobs      *int
}

// FieldError reports a request body the gateway refuses. Param names the
// offending field in OpenAI's notation ("messages[2].content"), or is empty
// when the body as a whole is wrong (not JSON, not an object). Msg is a
// complete sentence suitable for the client.
type FieldError struct {
	Param string
	Msg   string
}

// Error implements error.
func (e *FieldError) Error() string { return "openai: " + e.Msg }

// ParamOrNil returns Param for the error body's "param", or nil when empty.
func (e *FieldError) ParamOrNil() *string {
	if e.Param == "" {
		return nil
	}
	p := e.Param
	return &p
}

// dotSegment reports whether a model id has a "/"-separated segment that
// is empty, "." or "..", and which: such an id names another model once a
// path is normalised, so no model has one (routes.CheckModelID).
func dotSegment(model string) (string, bool) {
	for seg := range strings.SplitSeq(model, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return seg, true
		}
	}
	return "", false
}

func fieldErr(param, format string, args ...any) *FieldError {
	return &FieldError{Param: param, Msg: fmt.Sprintf(format, args...)}
}

// Known top-level fields, one bit each, to reject duplicates: a body with two
// "model" keys could be read one way by the gateway and another by an engine.
const (
	fModel uint32 = 1 << iota
	fStream
	fMessages
	fPrompt
	fSeed
	fLogprobs
	fTopLogprobs
	fTemperature
	fTopP
	fTopK
	fMaxTokens
	fMaxCompletionTokens
	fStop
	fPresencePenalty
	fFrequencyPenalty
	fStreamOptions
	fCacheSalt
)

var fieldBits = map[string]uint32{
	"model":                 fModel,
	"stream":                fStream,
	"messages":              fMessages,
	"prompt":                fPrompt,
	"seed":                  fSeed,
	"logprobs":              fLogprobs,
	"top_logprobs":          fTopLogprobs,
	"temperature":           fTemperature,
	"top_p":                 fTopP,
	"top_k":                 fTopK,
	"max_tokens":            fMaxTokens,
	"max_completion_tokens": fMaxCompletionTokens,
	"stop":                  fStop,
	"presence_penalty":      fPresencePenalty,
	"frequency_penalty":     fFrequencyPenalty,
	"stream_options":        fStreamOptions,
	"cache_salt":            fCacheSalt,
}

// ParseRequest validates a completions (chat false) or chat completions (chat
// true) body and extracts what the gateway needs, in one pass over the
// top-level fields. Every refusal is a *FieldError.
func ParseRequest(body []byte, chat bool) (Request, error) {
	if !gjson.ValidBytes(body) {
		return Request{}, &FieldError{Msg: "the request body is not valid JSON"}
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return Request{}, &FieldError{Msg: "the request body must be a JSON object"}
	}
	ep := EndpointCompletions
	if chat {
		ep = EndpointChat
	}
	p := parser{req: Request{Chat: chat, Endpoint: ep}, r: renderer{limit: -1}}
	var maxCompletion *int
	root.ForEach(func(k, v gjson.Result) bool {
		bit, known := fieldBits[k.Str]
		if !known {
			if name := caseVariant(k.Str); name != "" {
				p.err = fieldErr(k.Str, "%q is not a field; keys are case-sensitive (did you mean %q?)", k.Str, name)
				return false
			}
			return true
		}
		if p.seen&bit != 0 {
			p.err = fieldErr(k.Str, "%s is given more than once", k.Str)
			return false
		}
		p.seen |= bit
		switch bit {
		case fMaxCompletionTokens:
			if chat {
				maxCompletion, p.err = nonNegInt(k.Str, v)
			}
		default:
			p.field(bit, k.Str, v)
		}
		return p.err == nil
	})
	if p.err != nil {
		return Request{}, p.err
	}
	switch {
	case p.seen&fModel == 0:
		return Request{}, fieldErr("model", "model is required")
	case chat && p.seen&fMessages == 0:
		return Request{}, fieldErr("messages", "messages is required")
	case !chat && (p.seen&fPrompt == 0 || p.promptNull):
		return Request{}, fieldErr("prompt", "prompt is required")
	}
	if maxCompletion != nil {
		p.req.MaxTokens = maxCompletion
	}
	p.req.Prompt = string(p.r.buf)
	if n := min(len(p.r.buf), PrefixKeyLen); n > 0 {
		p.req.PrefixKey = append([]byte(nil), p.r.buf[:n]...)
	}
	return p.req, nil
}

type parser struct {
	req        Request
	r          renderer
	seen       uint32
	promptNull bool
	err        *FieldError
}

func (p *parser) field(bit uint32, name string, v gjson.Result) {
	var err *FieldError
	switch bit {
	case fModel:
		p.req.Model, err = ReadModel(v)
	case fStream:
		p.req.Stream, err = optBool(name, v)
	case fMessages:
		if p.req.Chat {
			err = renderMessages(&p.r, v, true)
		}
	case fPrompt:
		if !p.req.Chat {
			p.promptNull = v.Type == gjson.Null
			if !p.promptNull {
				err = renderPrompt(&p.r, v, true)
			}
		}
	case fSeed:
		p.req.Seed, err = optSeed(name, v)
	case fLogprobs:
		p.req.Logprobs, err = logprobsFlag(name, v, p.req.Chat)
	case fTopLogprobs:
		p.req.TopLogprobs, err = nonNegInt(name, v)
	case fTemperature:
		p.req.Temperature, err = optFloat(name, v)
	case fTopP:
		p.req.TopP, err = optFloat(name, v)
	case fTopK:
		p.req.TopK, err = optInt(name, v)
	case fMaxTokens:
		p.req.MaxTokens, err = nonNegInt(name, v)
	case fStop:
		p.req.Stop, err = optStop(name, v)
	case fPresencePenalty:
		p.req.PresencePenalty, err = optFloat(name, v)
	case fFrequencyPenalty:
		p.req.FrequencyPenalty, err = optFloat(name, v)
	case fStreamOptions:
		err = streamOptions(name, v)
	case fCacheSalt:
		p.req.CacheSalt, err = ReadCacheSalt(name, v)
	}
	p.err = err
}

func optBool(name string, v gjson.Result) (bool, *FieldError) {
	switch v.Type {
	case gjson.Null, gjson.False:
		return false, nil
	case gjson.True:
		return true, nil
	}
	return false, fieldErr(name, "%s must be a boolean", name)
}

func optFloat(name string, v gjson.Result) (*float64, *FieldError) {
	switch v.Type {
	case gjson.Null:
		return nil, nil
	case gjson.Number:
		f := v.Num
		return &f, nil
	}
	return nil, fieldErr(name, "%s must be a number", name)
}

// integer reads a JSON number that holds an integer ("3" or "3.0").
func integer(v gjson.Result) (int64, bool) {
	if v.Type != gjson.Number {
		return 0, false
	}
	if n, err := strconv.ParseInt(v.Raw, 10, 64); err == nil {
		return n, true
	}
	if v.Num != math.Trunc(v.Num) || math.Abs(v.Num) > 1<<53 {
		return 0, false
	}
	return int64(v.Num), true
}

func optInt(name string, v gjson.Result) (*int, *FieldError) {
	if v.Type == gjson.Null {
		return nil, nil
	}
	n, ok := integer(v)
	if !ok || n < math.MinInt32 || n > math.MaxInt32 {
		return nil, fieldErr(name, "%s must be an integer", name)
	}
	i := int(n)
	return &i, nil
}

func nonNegInt(name string, v gjson.Result) (*int, *FieldError) {
	if v.Type == gjson.Null {
		return nil, nil
	}
	n, ok := integer(v)
	if !ok || n < 0 || n > math.MaxInt32 {
		return nil, fieldErr(name, "%s must be a non-negative integer", name)
	}
	i := int(n)
	return &i, nil
}

func optSeed(name string, v gjson.Result) (*uint64, *FieldError) {
	if v.Type == gjson.Null {
		return nil, nil
	}
	if v.Type == gjson.Number {
		if n, err := strconv.ParseUint(v.Raw, 10, 64); err == nil {
			return &n, nil
		}
		if n, ok := integer(v); ok && n >= 0 {
			u := uint64(n)
			return &u, nil
		}
	}
	return nil, fieldErr(name, "%s must be a non-negative integer", name)
}

// logprobsFlag reads "logprobs": a boolean on chat; on completions the
// number of top tokens (>= 0 means requested), a boolean being tolerated.
func logprobsFlag(name string, v gjson.Result, chat bool) (bool, *FieldError) {
	if chat || v.Type != gjson.Number {
		b, err := optBool(name, v)
		if err != nil && !chat {
			err = fieldErr(name, "%s must be a non-negative integer", name)
		}
		return b, err
	}
	n, ok := integer(v)
	if !ok || n < 0 {
		return false, fieldErr(name, "%s must be a non-negative integer", name)
	}
	return true, nil
}

func optStop(name string, v gjson.Result) ([]string, *FieldError) {
	switch v.Type {
	case gjson.Null:
		return nil, nil
	case gjson.String:
		return []string{v.Str}, nil
	}
	if !v.IsArray() {
		return nil, fieldErr(name, "%s must be a string or an array of strings", name)
	}
	var stop []string
	var err *FieldError
	v.ForEach(func(k, s gjson.Result) bool {
		if s.Type != gjson.String {
			err = fieldErr(fmt.Sprintf("%s[%d]", name, int(k.Num)), "%s[%d] must be a string", name, int(k.Num))
			return false
		}
		stop = append(stop, s.Str)
		return true
	})
	if err != nil {
		return nil, err
	}
	return stop, nil
}
