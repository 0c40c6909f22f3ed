package cascade

import (
	"errors"
	"fmt"

	"github.com/tidwall/gjson"
)

var (
	// ErrNoLogprobs means the response carries no token logprobs: no
	// choices, or a first choice without a logprobs object in either shape.
	ErrNoLogprobs = errors.New("cascade: response has no logprobs")
	// ErrMalformedResponse wraps a response body that is not JSON or whose
	// logprobs have the wrong types.
	ErrMalformedResponse = errors.New("cascade: malformed response")
)

// LogprobsOf returns the token logprobs of the first choice of a
// non-streamed response body, in either shape on either endpoint:
//
//   - completions: choices[0].logprobs.token_logprobs (this shape wins when
//     both are present);
//   - chat: choices[0].logprobs.content[].logprob, which llama.cpp's server
//     also uses on /v1/completions.
//
// Null entries are skipped: engines put null where a token has no logprob
// (the first prompt token under echo), and such a position says nothing
// about the answer's confidence. A present but empty list gives an empty,
// non-nil slice (an answer with no tokens, which Accept.Holds never
// accepts). A missing or null logprobs object is ErrNoLogprobs; a body that
// is not valid JSON, or whose logprobs have the wrong types, wraps
// ErrMalformedResponse with the path of the bad value.
func LogprobsOf(body []byte) ([]float64, error) {
	if !gjson.ValidBytes(body) {
		return nil, fmt.Errorf("%w: body is not valid JSON", ErrMalformedResponse)
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return nil, fmt.Errorf("%w: body is not a JSON object", ErrMalformedResponse)
	}
	return ChoiceLogprobs(root.Get("choices"))
}

// ChoiceLogprobs is LogprobsOf of an answer already read: choices is its
// top-level "choices" member (absent when it has none).
func ChoiceLogprobs(choices gjson.Result) ([]float64, error) {
	switch {
	case !choices.Exists() || choices.Type == gjson.Null:
		return nil, fmt.Errorf("%w: no choices", ErrNoLogprobs)
	case !choices.IsArray():
		return nil, fmt.Errorf("%w: choices is not a list", ErrMalformedResponse)
	}
	first := choices.Get("0")
	if !first.Exists() {
		return nil, fmt.Errorf("%w: no choices", ErrNoLogprobs)
	}
	if !first.IsObject() {
		return nil, fmt.Errorf("%w: choices[0] is not an object", ErrMalformedResponse)
	}
	lp := first.Get("logprobs")
	switch {
	case !lp.Exists() || lp.Type == gjson.Null:
		return nil, fmt.Errorf("%w: choices[0].logprobs is absent", ErrNoLogprobs)
	case !lp.IsObject():
		return nil, fmt.Errorf("%w: choices[0].logprobs is not an object", ErrMalformedResponse)
	}
	if tl := lp.Get("token_logprobs"); tl.Exists() && tl.Type != gjson.Null {
		return collect(tl, "choices[0].logprobs.token_logprobs", func(el gjson.Result) (gjson.Result, bool) { return el, true })
	}
	if c := lp.Get("content"); c.Exists() && c.Type != gjson.Null {
		return collect(c, "choices[0].logprobs.content", func(el gjson.Result) (gjson.Result, bool) {
			if !el.IsObject() {
				return el, false
			}
			return el.Get("logprob"), true // absent counts as null
		})
	}
	return nil, fmt.Errorf("%w: choices[0].logprobs has neither token_logprobs nor content", ErrNoLogprobs)
}

// collect reads the number that pick finds in each element of the list,
// skipping nulls and absent values; anything else, or an element that pick
// rejects, is malformed.
func collect(list gjson.Result, path string, pick func(el gjson.Result) (gjson.Result, bool)) ([]float64, error) {
	if !list.IsArray() {
		return nil, fmt.Errorf("%w: %s is not a list", ErrMalformedResponse, path)
	}
	out := make([]float64, 0, 64)
	var bad error
	i := 0
	list.ForEach(func(_, el gjson.Result) bool {
		v, ok := pick(el)
		switch {
		case ok && v.Type == gjson.Number:
			out = append(out, v.Num)
		case ok && (v.Type == gjson.Null || !v.Exists()):
			// skipped, see LogprobsOf
		default:
			bad = fmt.Errorf("%w: %s[%d]: want a number or null, got %s", ErrMalformedResponse, path, i, el.Raw)
			return false
		}
		i++
		return true
	})
	if bad != nil {
		return nil, bad
	}
	return out, nil
}
