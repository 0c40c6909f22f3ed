package openai

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/jsontest"
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
		if !jsontest.Plain(resp) {
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
	v := jsontest.Decode(doc)
	if v == nil && !bytes.Equal(bytes.TrimSpace(doc), []byte("null")) {
		t.Fatalf("%q: not JSON", doc)
	}
	return v
}
