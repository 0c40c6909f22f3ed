package openai

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// PrefixKeyLen is the length of the affinity key: the leading bytes of the
// rendered prompt, about one 16-token KV block at about 4 bytes per token
// (design 2.3).
const PrefixKeyLen = 64

// Request is what the gateway reads from a client's body, once, at the
// edge: the parsers of every API (ParseRequest, ParseResponses, the
// pooling and tokenizer endpoints', Anthropic's Messages) fill it, and
// every later stage takes what it needs from it. The body itself is never
// re-encoded: attempts send the client's bytes with the fields they change
// spliced in (Object.With). Pointer fields are nil when the client omitted
// them or sent null. Its strings are views of the body's bytes, which must
// not be modified once parsed.
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
	// AsksUsage: the client asked a stream for its usage chunk
	// ("stream_options": {"include_usage": true}).
	AsksUsage bool
	// LogprobsTop is a completions request's "logprobs" number (the
	// alternatives per token it asked for); nil when it gave none.
	LogprobsTop *int
	// Object is the body as read: its bytes and where each top-level
	// member lies, which attempts rewrite (Object.With) without parsing
	// the body again.
	Object Object
	// parses counts the parses of the body (Parses).
	parses int

	Temperature      *float64
	TopP             *float64
	TopK             *int
	MaxTokens        *int // max_tokens, or max_completion_tokens (chat) which wins when both are sent
	Stop             []string
	PresencePenalty  *float64
	FrequencyPenalty *float64
	TopLogprobs      *int
	// Choices is "n" when it asks for more than one choice (else 0); Echo
	// is "echo": true (completions: the prompt is echoed before the
	// answer, and so are its tokens' logprobs).
	Choices int
	Echo    bool
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

// requestFields are the top-level fields ParseRequest reads.
var requestFields = []string{
	"model", "stream", "messages", "prompt", "seed", "logprobs", "top_logprobs", "temperature", "top_p", "top_k",
	"max_tokens", "max_completion_tokens", "stop", "presence_penalty", "frequency_penalty", "stream_options", "cache_salt",
	"n", "echo",
}

// ParseRequest validates a completions (chat false) or chat completions (chat
// true) body and extracts what the gateway needs, in one pass over the
// top-level fields (ReadObject), which also records where each lies
// (Request.Object). Every refusal is a *FieldError.
func ParseRequest(body []byte, chat bool) (Request, error) {
	ep := EndpointCompletions
	if chat {
		ep = EndpointChat
	}
	p := parser{req: Request{Chat: chat, Endpoint: ep}, r: Renderer{limit: -1}}
	var maxCompletion *int
	var seenModel, seenMessages, seenPrompt bool
	obj, ferr := ReadObject(body, requestFields, func(k string, v gjson.Result) *FieldError {
		switch k {
		case "model":
			seenModel = true
		case "messages":
			seenMessages = true
		case "prompt":
			seenPrompt = true
		case "max_completion_tokens":
			if chat {
				var err *FieldError
				maxCompletion, err = nonNegInt(k, v)
				return err
			}
			return nil
		}
		return p.field(k, v)
	}, func(k string) *FieldError {
		if name := caseVariant(k); name != "" {
			return fieldErr(k, "%q is not a field; keys are case-sensitive (did you mean %q?)", k, name)
		}
		return nil
	})
	switch {
	case ferr != nil:
		return Request{}, ferr
	case !seenModel:
		return Request{}, fieldErr("model", "model is required")
	case chat && !seenMessages:
		return Request{}, fieldErr("messages", "messages is required")
	case !chat && (!seenPrompt || p.promptNull):
		return Request{}, fieldErr("prompt", "prompt is required")
	}
	if maxCompletion != nil {
		p.req.MaxTokens = maxCompletion
	}
	return NewRequest(p.req, obj, &p.r), nil
}

// NewRequest completes a Request an API's own parser filled (the fields
// it read): its body's members, as ReadObject returned them, and the
// prompt r rendered.
func NewRequest(req Request, obj Object, r *Renderer) Request {
	req.Object, req.parses = obj, 1
	req.setPrompt(r.buf)
	return req
}

// ReadBool reads an optional boolean field (null is false).
func ReadBool(name string, v gjson.Result) (bool, *FieldError) { return optBool(name, v) }

// ReadNonNegInt reads an optional non-negative integer field (null is
// nil).
func ReadNonNegInt(name string, v gjson.Result) (*int, *FieldError) { return nonNegInt(name, v) }

// setPrompt sets the rendered prompt and its prefix key.
func (r *Request) setPrompt(rendered []byte) {
	r.Prompt = string(rendered)
	if n := min(len(rendered), PrefixKeyLen); n > 0 {
		r.PrefixKey = append([]byte(nil), rendered[:n]...)
	}
}

type parser struct {
	req        Request
	r          Renderer
	promptNull bool
}

func (p *parser) field(name string, v gjson.Result) *FieldError {
	var err *FieldError
	switch name {
	case "model":
		p.req.Model, err = ReadModel(v)
	case "stream":
		p.req.Stream, err = optBool(name, v)
	case "messages":
		if p.req.Chat {
			err = renderMessages(&p.r, v, true, Brackets)
		}
	case "prompt":
		if !p.req.Chat {
			p.promptNull = v.Type == gjson.Null
			if !p.promptNull {
				err = renderPrompt(&p.r, v, true)
			}
		}
	case "seed":
		p.req.Seed, err = optSeed(name, v)
	case "logprobs":
		p.req.Logprobs, err = logprobsFlag(name, v, p.req.Chat)
		if n := askedLogprobs(v); !p.req.Chat && n >= 0 {
			p.req.LogprobsTop = &n
		}
	case "top_logprobs":
		p.req.TopLogprobs, err = nonNegInt(name, v)
	case "temperature":
		p.req.Temperature, err = optFloat(name, v)
	case "top_p":
		p.req.TopP, err = optFloat(name, v)
	case "top_k":
		p.req.TopK, err = optInt(name, v)
	case "max_tokens":
		p.req.MaxTokens, err = nonNegInt(name, v)
	case "stop":
		p.req.Stop, err = optStop(name, v)
	case "presence_penalty":
		p.req.PresencePenalty, err = optFloat(name, v)
	case "frequency_penalty":
		p.req.FrequencyPenalty, err = optFloat(name, v)
	case "stream_options":
		p.req.AsksUsage, err = streamOptions(name, v)
	case "cache_salt":
		p.req.CacheSalt, err = ReadCacheSalt(name, v)
	case "n":
		// Read, not checked: the engine answers a bad one. vLLM takes a
		// number in a string too.
		if n, perr := strconv.Atoi(strings.TrimSpace(v.String())); perr == nil && n > 1 && (v.Type == gjson.Number || v.Type == gjson.String) {
			p.req.Choices = n
		}
	case "echo":
		p.req.Echo = v.Type == gjson.True
	}
	return err
}

// Judgeable reports whether a cascade step's accept_if can judge the
// request's answer on its tokens' logprobs: the answer has one choice
// (one prompt, n of 1), whose logprobs are its completion's alone (no
// echoed prompt, whose tokens' logprobs an engine lists before them).
func (r *Request) Judgeable() bool { return r.Choices <= 1 && !r.Echo && r.Prompts() <= 1 }

// Prompts is how many prompts a completions request's prompt holds: the
// length of a batch (a list of texts, or of token-id lists), else 1 (0
// for a request without one).
func (r *Request) Prompts() int {
	raw := r.Object.Raw("prompt")
	if len(raw) == 0 || r.Chat {
		return 0
	}
	if raw[0] != '[' {
		return 1
	}
	n, ids := 0, false
	gjson.ParseBytes(raw).ForEach(func(_, e gjson.Result) bool {
		if n == 0 && e.Type == gjson.Number {
			ids = true // token ids: one prompt
			return false
		}
		n++
		return true
	})
	if ids {
		return 1
	}
	return max(n, 1)
}

// HasMedia reports whether a chat request's messages hold a content part
// that is not text (an image, audio, a video, a file). An engine's
// /tokenize gives such a prompt's media as placeholder tokens, alike for
// every image, while its KV blocks are keyed by the media's own hash: the
// tokens do not name the blocks the engine holds.
func (r *Request) HasMedia() bool {
	raw := r.Object.Raw("messages")
	if !r.Chat || !bytes.Contains(raw, []byte(`"type"`)) {
		return false
	}
	media := false
	gjson.ParseBytes(raw).ForEach(func(_, m gjson.Result) bool {
		if c := m.Get("content"); c.IsArray() {
			c.ForEach(func(_, part gjson.Result) bool {
				if t := part.Get("type"); t.Type == gjson.String && !slices.Contains(chatTextParts, t.Str) {
					media = true
				}
				return !media
			})
		}
		return !media
	})
	return media
}

// Parses returns how many times the request's body was parsed: one, by
// the parser that made it; the attempts rewrite the body from Object
// without parsing it again.
func (r *Request) Parses() int { return r.parses }

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
