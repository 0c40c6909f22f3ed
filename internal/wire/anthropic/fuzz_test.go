package anthropic

import (
	"encoding/json"
	"testing"
)

// FuzzParseRequestAgrees checks what ParseRequest reads of a Messages body
// against encoding/json's reading of it (keys case-sensitive, the last
// of a key given twice, as the engines' JSON readers read them): a body
// it accepts is valid JSON, and its model, stream, max_tokens and
// cache_salt are what a JSON decoder reads there.
func FuzzParseRequestAgrees(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":5,"stream":true,"cache_salt":"s","system":"S","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"\u006dodel":"a\/b","max_tokens":2e1,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"Model":"n"}`))
	f.Add([]byte(`{"model":"m","model":"n","messages":[{"role":"user","content":"x"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ParseRequest(body)
		if err != nil {
			return
		}
		var want struct {
			Model     string   `json:"model"`
			Stream    bool     `json:"stream"`
			MaxTokens *float64 `json:"max_tokens"`
			CacheSalt string   `json:"cache_salt"`
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(body, &raw); err != nil {
			t.Fatalf("ParseRequest accepted %q, which encoding/json refuses: %v", body, err)
		}
		for key, dst := range map[string]any{"model": &want.Model, "stream": &want.Stream, "max_tokens": &want.MaxTokens, "cache_salt": &want.CacheSalt} {
			if v, ok := raw[key]; ok {
				if err := json.Unmarshal(v, dst); err != nil {
					t.Fatalf("ParseRequest accepted %q; encoding/json reads its %s %s: %v", body, key, v, err)
				}
			}
		}
		maxTokens := req.MaxTokens != nil && want.MaxTokens != nil && float64(*req.MaxTokens) == *want.MaxTokens ||
			req.MaxTokens == nil && want.MaxTokens == nil
		if req.Model != want.Model || req.Stream != want.Stream || req.CacheSalt != want.CacheSalt || !maxTokens {
			t.Fatalf("ParseRequest(%q): model %q stream %v cache_salt %q max_tokens %v; encoding/json reads %q %v %q %v",
				body, req.Model, req.Stream, req.CacheSalt, req.MaxTokens, want.Model, want.Stream, want.CacheSalt, want.MaxTokens)
		}
	})
}
