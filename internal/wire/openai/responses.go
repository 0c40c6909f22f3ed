package openai

import (
	"fmt"

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
	req := Request{Store: true, Endpoint: EndpointResponses}
	r := Renderer{limit: -1}
	var instructions, input gjson.Result
	seenModel := false
	obj, ferr := ReadObject(body, responsesFields, func(k string, v gjson.Result) *FieldError {
		var ferr *FieldError
		switch k {
		case "model":
			seenModel = true
			req.Model, ferr = ReadModel(v)
		case "input":
			input = v
		case "instructions":
			if v.Type != gjson.Null && v.Type != gjson.String {
				ferr = fieldErr(k, "instructions must be a string")
			}
			instructions = v
		case "stream":
			req.Stream, ferr = optBool(k, v)
		case "store":
			if v.Type != gjson.Null {
				req.Store, ferr = optBool(k, v)
			}
		case "max_output_tokens":
			req.MaxTokens, ferr = nonNegInt(k, v)
		case "cache_salt":
			req.CacheSalt, ferr = ReadCacheSalt(k, v)
		case "previous_response_id":
			req.PreviousResponseID, ferr = readPreviousResponseID(k, v)
		}
		return ferr
	}, nil)
	switch {
	case ferr != nil:
		return Request{}, ferr
	case !seenModel:
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
	return NewRequest(req, obj, &r), nil
}

// responsesFields are the top-level fields ParseResponses reads.
var responsesFields = []string{"model", "input", "instructions", "stream", "store", "previous_response_id", "max_output_tokens", "cache_salt"}

// readPreviousResponseID reads a previous_response_id: null, or a valid
// response id (ValidResponseID).
func readPreviousResponseID(k string, v gjson.Result) (string, *FieldError) {
	switch v.Type {
	case gjson.Null:
		return "", nil
	case gjson.String:
		switch {
		case v.Str == "":
			return "", fieldErr(k, "previous_response_id must not be empty")
		case len(v.Str) > MaxResponseIDLen:
			return "", fieldErr(k, "previous_response_id must be at most %d bytes, got %d", MaxResponseIDLen, len(v.Str))
		case !ValidResponseID(v.Str):
			return "", fieldErr(k, "previous_response_id must be printable ASCII characters without '/'")
		}
		return v.Str, nil
	}
	return "", fieldErr(k, "previous_response_id must be a string")
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
func renderResponsesInput(r *Renderer, in gjson.Result) *FieldError {
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
			err = renderContent(r, item.Get("content"), Brackets.Elem("input", i)+".content", responsesTextParts, Brackets)
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
	return with(body, SetInt("max_output_tokens", n))
}
