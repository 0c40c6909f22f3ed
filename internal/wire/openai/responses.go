package openai

import (
	"fmt"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/routing/routes"
)

// ParseResponses validates a Responses API body (POST /v1/responses) and
// extracts what routing and limits need: model, stream, store,
// previous_response_id, max_output_tokens (as MaxTokens), cache_salt,
// and the rendered prompt, which is the instructions followed by a newline
// and then the input: a string as "user\n<text>\n", an array of items each
// as "role\ncontent\n" (content given as parts contributes the text of its
// input_text, output_text and text parts), an item that is not a message as
// "type\n<output or arguments>\n". Other fields are the engine's to judge.
// Every refusal is a *FieldError.
func ParseResponses(body []byte) (Request, error) {
	root, err := object(body)
	if err != nil {
		return Request{}, err
	}
	req := Request{Store: true, Endpoint: EndpointResponses}
	r := renderer{limit: -1}
	seen := map[string]bool{}
	var instructions, input gjson.Result
	var ferr *FieldError
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "model", "input", "instructions", "stream", "store", "previous_response_id", "max_output_tokens", "cache_salt":
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
			req.Model, ferr = ReadModel(v)
		case "input":
			input = v
		case "instructions":
			if v.Type != gjson.Null && v.Type != gjson.String {
				ferr = fieldErr(k.Str, "instructions must be a string")
			}
			instructions = v
		case "stream":
			req.Stream, ferr = optBool(k.Str, v)
		case "store":
			if v.Type != gjson.Null {
				req.Store, ferr = optBool(k.Str, v)
			}
		case "max_output_tokens":
			req.MaxTokens, ferr = nonNegInt(k.Str, v)
		case "cache_salt":
			req.CacheSalt, ferr = ReadCacheSalt(k.Str, v)
		case "previous_response_id":
			switch v.Type {
			case gjson.Null:
			case gjson.String:
				switch {
				case v.Str == "":
					ferr = fieldErr(k.Str, "previous_response_id must not be empty")
				case len(v.Str) > MaxResponseIDLen:
					ferr = fieldErr(k.Str, "previous_response_id must be at most %d bytes, got %d", MaxResponseIDLen, len(v.Str))
				case !ValidResponseID(v.Str):
					ferr = fieldErr(k.Str, "previous_response_id must be printable ASCII characters without '/'")
				}
				req.PreviousResponseID = v.Str
			default:
				ferr = fieldErr(k.Str, "previous_response_id must be a string")
			}
		}
		return ferr == nil
	})
	switch {
	case ferr != nil:
		return Request{}, ferr
	case !seen["model"]:
		return Request{}, fieldErr("model", "model is required")
	case !input.Exists() || input.Type == gjson.Null:
		return Request{}, fieldErr("input", "input is required")
	}
	if instructions.Str != "" {
		r.write("system\n")
		r.write(instructions.Str)
		r.write("\n")
	}
	if ferr = renderResponsesInput(&r, input); ferr != nil {
		return Request{}, ferr
	}
	req.Prompt = string(r.buf)
	if n := min(len(r.buf), PrefixKeyLen); n > 0 {
		req.PrefixKey = append([]byte(nil), r.buf[:n]...)
	}
	return req, nil
}

// MaxResponseIDLen bounds a stored response's id: the {id} of
// /v1/responses/{id} and a previous_response_id.
const MaxResponseIDLen = routes.MaxIDLen

// ValidResponseID reports whether id is 1 to MaxResponseIDLen printable
// ASCII characters without '/', as a response id in a URL path is.
func ValidResponseID(id string) bool {
	if id == "" || len(id) > MaxResponseIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e || id[i] == '/' {
			return false
		}
	}
	return true
}

// object parses body as a JSON object.
func object(body []byte) (gjson.Result, *FieldError) {
	if !gjson.ValidBytes(body) {
		return gjson.Result{}, &FieldError{Msg: "the request body is not valid JSON"}
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return gjson.Result{}, &FieldError{Msg: "the request body must be a JSON object"}
	}
	return root, nil
}

// ReadModel validates a body's "model" value: a non-empty string of at
// most routes.MaxIDLen bytes (no longer id is served, and errors
// repeat it) without an empty, "." or ".." path segment.
func ReadModel(v gjson.Result) (string, *FieldError) {
	switch {
	case v.Type != gjson.String:
		return "", fieldErr("model", "model must be a string")
	case v.Str == "":
		return "", fieldErr("model", "model must not be empty")
	case len(v.Str) > routes.MaxIDLen:
		return "", fieldErr("model", "model must be at most %d bytes, got %d", routes.MaxIDLen, len(v.Str))
	}
	if seg, bad := dotSegment(v.Str); bad {
		return "", fieldErr("model", "model %q has a path segment %q: a model id has no empty, \".\" or \"..\" segment", v.Str, seg)
	}
	return v.Str, nil
}

// renderResponsesInput writes a Responses input: a string or an array of items.
func renderResponsesInput(r *renderer, in gjson.Result) *FieldError {
	if in.Type == gjson.String {
		r.write("user\n")
		r.write(in.Str)
		r.write("\n")
		return nil
	}
	if !in.IsArray() {
		return fieldErr("input", "input must be a string or an array of input items")
	}
	var err *FieldError
	in.ForEach(func(k, item gjson.Result) bool {
		i := int(k.Num)
		if !item.IsObject() {
			err = fieldErr(fmt.Sprintf("input[%d]", i), "input[%d] must be an object", i)
			return false
		}
		role, typ := item.Get("role"), item.Get("type")
		switch {
		case role.Exists():
			if role.Type != gjson.String || role.Str == "" {
				err = fieldErr(fmt.Sprintf("input[%d].role", i), "input[%d].role must be a non-empty string", i)
				return false
			}
			r.write(role.Str)
			r.write("\n")
			err = renderContent(r, item.Get("content"), "input", i, responsesTextParts)
			r.write("\n")
		case typ.Type == gjson.String && typ.Str != "":
			r.write(typ.Str)
			r.write("\n")
			for _, f := range []string{"output", "arguments"} {
				if v := item.Get(f); v.Type == gjson.String {
					r.write(v.Str)
				}
			}
			r.write("\n")
		default:
			err = fieldErr(fmt.Sprintf("input[%d]", i), "input[%d] must have a role or a type", i)
		}
		return err == nil
	})
	return err
}

// WithMaxOutputTokens returns a Responses body with max_output_tokens set
// to n.
func WithMaxOutputTokens(body []byte, n int) ([]byte, error) {
	if err := checkObject(body); err != nil {
		return nil, err
	}
	return set(body, "max_output_tokens", strconv.AppendInt(nil, int64(n), 10))
}
