package anthropic

import (
	"fmt"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/openai"
)

// ParseRequest validates a Messages body (POST /v1/messages) and extracts
// what routing and limits need: model, stream, max_tokens (MaxTokens),
// vLLM's cache_salt (an engine may key its prefix cache with it here too)
// and the rendered prompt, which is the
// system prompt as "system\n<text>\n" followed by each message as
// "role\ncontent\n" (content given as blocks contributes the text of its
// text blocks). Other fields (max_tokens...) are the engine's to judge.
// Every refusal is an *openai.FieldError.
func ParseRequest(body []byte) (openai.Request, error) {
	if !gjson.ValidBytes(body) {
		return openai.Request{}, &openai.FieldError{Msg: "the request body is not valid JSON"}
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return openai.Request{}, &openai.FieldError{Msg: "the request body must be a JSON object"}
	}
	req := openai.Request{Endpoint: openai.EndpointMessages}
	seen := map[string]bool{}
	var system, messages gjson.Result
	var ferr *openai.FieldError
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "model", "stream", "system", "messages", "max_tokens", "cache_salt":
		default:
			return true
		}
		if seen[k.Str] {
			ferr = fieldErr(k.Str, "%s is given more than once", k.Str)
			return false
		}
		seen[k.Str] = true
		switch k.Str {
		case "model":
			req.Model, ferr = openai.ReadModel(v)
		case "stream":
			switch v.Type {
			case gjson.True:
				req.Stream = true
			case gjson.False, gjson.Null:
			default:
				ferr = fieldErr("stream", "stream must be a boolean")
			}
		case "max_tokens":
			n, ok := v.Int(), v.Type == gjson.Number && float64(v.Int()) == v.Num && v.Num >= 0
			if !ok {
				ferr = fieldErr("max_tokens", "max_tokens must be a non-negative integer")
			}
			m := int(n)
			req.MaxTokens = &m
		case "cache_salt":
			req.CacheSalt, ferr = openai.ReadCacheSalt(k.Str, v)
		case "system":
			system = v
		case "messages":
			messages = v
		}
		return ferr == nil
	})
	switch {
	case ferr != nil:
		return openai.Request{}, ferr
	case !seen["model"]:
		return openai.Request{}, fieldErr("model", "model is required")
	case !messages.Exists():
		return openai.Request{}, fieldErr("messages", "messages is required")
	}
	var buf []byte
	if system.Exists() && system.Type != gjson.Null {
		text, err := blocksText(system, "system")
		if err != nil {
			return openai.Request{}, err
		}
		buf = append(append(append(buf, "system\n"...), text...), '\n')
	}
	if !messages.IsArray() {
		return openai.Request{}, fieldErr("messages", "messages must be an array of messages")
	}
	n := 0
	messages.ForEach(func(k, m gjson.Result) bool {
		n++
		i := int(k.Num)
		role := m.Get("role")
		switch {
		case !m.IsObject():
			ferr = fieldErr(fmt.Sprintf("messages.%d", i), "messages.%d must be an object", i)
		case role.Type != gjson.String || role.Str == "":
			ferr = fieldErr(fmt.Sprintf("messages.%d.role", i), "messages.%d.role must be a non-empty string", i)
		default:
			var text string
			text, ferr = blocksText(m.Get("content"), fmt.Sprintf("messages.%d.content", i))
			buf = append(append(append(append(buf, role.Str...), '\n'), text...), '\n')
		}
		return ferr == nil
	})
	switch {
	case ferr != nil:
		return openai.Request{}, ferr
	case n == 0:
		return openai.Request{}, fieldErr("messages", "messages must not be empty")
	}
	req.Prompt = string(buf)
	if l := min(len(buf), openai.PrefixKeyLen); l > 0 {
		req.PrefixKey = append([]byte(nil), buf[:l]...)
	}
	return req, nil
}

// blocksText returns the text of a string or of an array of content
// blocks (the text of its text blocks, concatenated).
func blocksText(v gjson.Result, param string) (string, *openai.FieldError) {
	switch {
	case !v.Exists() || v.Type == gjson.Null:
		return "", nil
	case v.Type == gjson.String:
		return v.Str, nil
	case !v.IsArray():
		return "", fieldErr(param, "%s must be a string or an array of content blocks", param)
	}
	var out []byte
	var ferr *openai.FieldError
	v.ForEach(func(k, b gjson.Result) bool {
		p := fmt.Sprintf("%s.%d", param, int(k.Num))
		if !b.IsObject() {
			ferr = fieldErr(p, "%s must be an object", p)
			return false
		}
		if b.Get("type").Str == "text" {
			t := b.Get("text")
			if t.Type != gjson.String {
				ferr = fieldErr(p+".text", "%s.text must be a string", p)
				return false
			}
			out = append(out, t.Str...)
		}
		return true
	})
	return string(out), ferr
}

func fieldErr(param, format string, args ...any) *openai.FieldError {
	return &openai.FieldError{Param: param, Msg: fmt.Sprintf(format, args...)}
}
