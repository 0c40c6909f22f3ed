package openai

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"
)

// FuzzStripAndTrimLogprobs checks the rewrites of an engine's answer
// against encoding/json: for any valid JSON answer in UTF-8 whose objects
// give no key twice, StripLogprobs's bytes are valid JSON that decode to
// the answer with every choice's non-null logprobs set to null, and
// TrimTopLogprobs's to the answer with every choice's
// logprobs.content[j].top_logprobs cut to n alternatives; every other
// value is unchanged.
func FuzzStripAndTrimLogprobs(f *testing.F) {
	f.Add([]byte(`{"id":"x","choices":[{"index":0,"text":"a","logprobs":{"tokens":["a"],"token_logprobs":[-0.1]}},{"logprobs":null}]}`), uint8(1))
	f.Add([]byte(`{"choices":[{"logprobs":{"content":[{"token":"a","logprob":-1,"top_logprobs":[{"token":"a"},{"token":"b"},{"token":"c"}]}]}}],"usage":{"prompt_tokens":3}}`), uint8(2))
	f.Add([]byte(`{"choices":{"x":{"logprobs":{"content":[{"top_logprobs":[1,2,3]}]}}}}`), uint8(1))
	f.Add([]byte(`[{"choices":[{"logprobs":1}]}]`), uint8(0))
	f.Fuzz(func(t *testing.T, resp []byte, n uint8) {
		if !json.Valid(resp) || !utf8.Valid(resp) || hasDuplicateKey(resp) {
			return
		}
		keep := int(n % 5)
		stripped, err := StripLogprobs(resp)
		if err != nil {
			t.Fatalf("StripLogprobs(%q): %v", resp, err)
		}
		checkRewrite(t, "StripLogprobs", resp, stripped, func(answer any) {
			for _, c := range choicesOf(answer) {
				if c, ok := c.(map[string]any); ok && c["logprobs"] != nil {
					c["logprobs"] = nil
				}
			}
		})
		trimmed, err := TrimTopLogprobs(resp, keep)
		if err != nil {
			t.Fatalf("TrimTopLogprobs(%q): %v", resp, err)
		}
		checkRewrite(t, "TrimTopLogprobs", resp, trimmed, func(answer any) {
			for _, c := range choicesOf(answer) {
				c, _ := c.(map[string]any)
				lp, _ := c["logprobs"].(map[string]any)
				content, _ := lp["content"].([]any)
				for _, tok := range content {
					tok, _ := tok.(map[string]any)
					if top, ok := tok["top_logprobs"].([]any); ok && len(top) > keep {
						tok["top_logprobs"] = top[:keep]
					}
				}
			}
		})
	})
}

// checkRewrite fails t unless out is valid JSON decoding to in's decoding
// with edit applied.
func checkRewrite(t *testing.T, name string, in, out []byte, edit func(any)) {
	t.Helper()
	want := decodeAny(t, in)
	edit(want)
	if !json.Valid(out) {
		t.Fatalf("%s(%q) = %q: not valid JSON", name, in, out)
	}
	if got := decodeAny(t, out); !reflect.DeepEqual(got, want) {
		t.Fatalf("%s(%q) = %q, want what decodes to %v", name, in, out, want)
	}
}

// choicesOf is the answer's "choices" array, or nil.
func choicesOf(answer any) []any {
	m, _ := answer.(map[string]any)
	cs, _ := m["choices"].([]any)
	return cs
}

func decodeAny(t *testing.T, doc []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%q: %v", doc, err)
	}
	return v
}

// hasDuplicateKey reports whether an object of the valid JSON doc gives a
// key twice (the rewrites take the first, a JSON decoder the last).
func hasDuplicateKey(doc []byte) bool {
	d := json.NewDecoder(bytes.NewReader(doc))
	type frame struct {
		keys   map[string]bool
		object bool
		key    bool // the next string is a key
	}
	var stack []*frame
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		isKey := top != nil && top.object && top.key
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{', '[':
				if top != nil && top.object {
					top.key = true
				}
				stack = append(stack, &frame{keys: map[string]bool{}, object: tok == '{', key: tok == '{'})
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		case string:
			if isKey {
				if top.keys[tok] {
					return true
				}
				top.keys[tok] = true
				top.key = false
				continue
			}
		}
		if top != nil && top.object {
			top.key = true
		}
	}
}
