package disagg

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/jsontest"
)

// FuzzMergePromptLogprobs checks MergePromptLogprobs against the same
// merge done on the answers as encoding/json decodes them (objects in
// UTF-8 that give no key twice): meta_info.input_token_logprobs
// concatenated where the decode answer's meta_info is an object holding
// an array there or none; the prefill answer's top-level and per-choice
// (choices arrays only) prompt_logprobs arrays where the decode answer's
// are missing, null or empty; everything else unchanged, and the result
// valid JSON.
func FuzzMergePromptLogprobs(f *testing.F) {
	f.Add([]byte(`{"meta_info":{"input_token_logprobs":[[-1,1]]},"prompt_logprobs":[null],"choices":[{"prompt_logprobs":[1]}]}`),
		[]byte(`{"meta_info":{},"prompt_logprobs":[],"choices":[{"text":"a"},{"text":"b"}]}`))
	f.Add([]byte(`{"choices":{"prompt_logprobs":[1]}}`), []byte(`{"choices":{"text":"a"}}`))
	f.Add([]byte(`{"choices":[{"prompt_logprobs":[1]}]}`), []byte(`{"choices":"x","meta_info":[1]}`))
	f.Fuzz(func(t *testing.T, prefill, decode []byte) {
		if !plainObject(prefill) || !plainObject(decode) {
			return
		}
		got, _ := MergePromptLogprobs(prefill, decode)
		if !json.Valid(got) {
			t.Fatalf("merged %q into %q: %q is not JSON", prefill, decode, got)
		}
		p, d := decodeJSON(t, prefill).(map[string]any), decodeJSON(t, decode).(map[string]any)
		absent := func(v any, ok bool) bool {
			a, isArray := v.([]any)
			return !ok || v == nil || isArray && len(a) == 0
		}
		if pm, ok := p["meta_info"].(map[string]any); ok {
			if pi, ok := pm["input_token_logprobs"].([]any); ok {
				if dm, ok := d["meta_info"].(map[string]any); ok {
					di, had := dm["input_token_logprobs"]
					if da, isArray := di.([]any); isArray || !had {
						dm["input_token_logprobs"] = append(append([]any{}, pi...), da...)
					}
				}
			}
		}
		if pp, ok := p["prompt_logprobs"].([]any); ok {
			if v, had := d["prompt_logprobs"]; absent(v, had) {
				d["prompt_logprobs"] = pp
			}
		}
		pcs, _ := p["choices"].([]any)
		dcs, _ := d["choices"].([]any)
		for i, dc := range dcs {
			if i >= len(pcs) {
				break
			}
			pc, _ := pcs[i].(map[string]any)
			dco, isObject := dc.(map[string]any)
			if pp, ok := pc["prompt_logprobs"].([]any); ok && isObject {
				if v, had := dco["prompt_logprobs"]; absent(v, had) {
					dco["prompt_logprobs"] = pp
				}
			}
		}
		if g := decodeJSON(t, got); !reflect.DeepEqual(g, any(d)) {
			t.Fatalf("merged %q into %q: %q, want what decodes to %v", prefill, decode, got, d)
		}
	})
}

// plainObject reports whether b is a JSON object in UTF-8 none of whose
// objects gives a key twice.
func plainObject(b []byte) bool {
	_, ok := jsontest.Decode(b).(map[string]any)
	return ok && jsontest.Plain(b)
}

func decodeJSON(t *testing.T, b []byte) any {
	t.Helper()
	v := jsontest.Decode(b)
	if v == nil {
		t.Fatalf("%q: not JSON", b)
	}
	return v
}
