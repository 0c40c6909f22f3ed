package anthropic

import (
	"fmt"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/openai"
)

// ParseRequest validates a Messages body (POST /v1/messages) and extracts
// what routing and limits need: model, stream, max_tokens (MaxTokens),
// vLLM's cache_salt (an engine may key its prefix cache with it here too)
// and the rendered prompt, which is the system prompt as
// "system\n<text>\n" followed by each message as "role\ncontent\n"
// (content given as blocks contributes the text of its text blocks). It
// walks the body with openai's reader and checks and renders the messages
// with openai's renderer, naming fields in Anthropic's dotted notation
// ("messages.0.content.1.text"). Other fields are the engine's to judge.
// Every refusal is an *openai.FieldError.
func ParseRequest(body []byte) (openai.Request, error) {
	req := openai.Request{Endpoint: openai.EndpointMessages}
	var system, messages gjson.Result
	seenModel := false
	obj, ferr := openai.ReadObject(body, fields, func(k string, v gjson.Result) *openai.FieldError {
		var ferr *openai.FieldError
		switch k {
		case "model":
			seenModel = true
			req.Model, ferr = openai.ReadModel(v)
		case "stream":
			req.Stream, ferr = openai.ReadBool(k, v)
		case "max_tokens":
			req.MaxTokens, ferr = openai.ReadNonNegInt(k, v)
		case "cache_salt":
			req.CacheSalt, ferr = openai.ReadCacheSalt(k, v)
		case "system":
			system = v
		case "messages":
			messages = v
		}
		return ferr
	}, nil)
	switch {
	case ferr != nil:
		return openai.Request{}, ferr
	case !seenModel:
		return openai.Request{}, fieldErr("model", "model is required")
	case !messages.Exists():
		return openai.Request{}, fieldErr("messages", "messages is required")
	}
	r := openai.NewRenderer()
	if system.Exists() && system.Type != gjson.Null {
		r.Write("system\n")
		if ferr := openai.RenderContent(r, system, "system", openai.TextParts, openai.Dots); ferr != nil {
			return openai.Request{}, ferr
		}
		r.Write("\n")
	}
	if ferr := openai.RenderMessages(r, messages, openai.Dots); ferr != nil {
		return openai.Request{}, ferr
	}
	return openai.NewRequest(req, obj, r), nil
}

// fields are the top-level fields ParseRequest reads.
var fields = []string{"model", "stream", "system", "messages", "max_tokens", "cache_salt"}

func fieldErr(param, format string, args ...any) *openai.FieldError {
	return &openai.FieldError{Param: param, Msg: fmt.Sprintf(format, args...)}
}
