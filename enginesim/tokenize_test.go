package enginesim

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
)

type tokenizeJSON struct {
	Tokens      []uint32 `json:"tokens"`
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
}

// TestTokenizeMatchesPrefill checks vLLM's POST /tokenize against the
// engine itself: for chat (with the template's switches) and completions,
// the tokens it answers are exactly the prompt a request with the same
// input prefills, and /detokenize gives the rendered text back.
func TestTokenizeMatchesPrefill(t *testing.T) {
	var mu sync.Mutex
	var prefilled [][]uint32
	e := startEngine(t, Config{Model: "m", KVBlocks: 64, hooks: &hooks{prefilled: func(p []uint32) {
		mu.Lock()
		prefilled = append(prefilled, slices.Clone(p))
		mu.Unlock()
	}}})
	c := newClient(t)
	last := func(t *testing.T) []uint32 {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if len(prefilled) == 0 {
			t.Fatal("nothing prefilled")
		}
		return prefilled[len(prefilled)-1]
	}
	messages := []map[string]any{
		{"role": "system", "content": "You are a helpful assistant."},
		{"role": "user", "content": []map[string]any{{"type": "text", "text": "Where is the capital "}, {"type": "text", "text": "of France?"}}},
		{"role": "assistant", "content": "The capital of France is"},
	}
	for _, tc := range []struct {
		name     string
		chat     bool
		switches map[string]any
		rendered string // what /detokenize gives back
	}{
		{"chat", true, nil,
			"system\nYou are a helpful assistant.\nuser\nWhere is the capital of France?\nassistant\nThe capital of France is\nassistant\n"},
		{"chat without generation prompt", true, map[string]any{"add_generation_prompt": false},
			"system\nYou are a helpful assistant.\nuser\nWhere is the capital of France?\nassistant\nThe capital of France is\n"},
		{"chat continuing the final message", true, map[string]any{"continue_final_message": true, "add_generation_prompt": false},
			"system\nYou are a helpful assistant.\nuser\nWhere is the capital of France?\nassistant\nThe capital of France is"},
		{"completions", false, nil, "Once upon a time, in a land far away, there lived a reference engine."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tokReq := map[string]any{"model": "m"}
			body := map[string]any{"model": "m", "max_tokens": 2, "seed": 1}
			if tc.chat {
				tokReq["messages"], body["messages"] = messages, messages
			} else {
				tokReq["prompt"], body["prompt"] = tc.rendered, tc.rendered
			}
			for k, v := range tc.switches {
				tokReq[k], body[k] = v, v
			}
			r := post(t, c, e.URL()+"/tokenize", tokReq)
			if r.status != http.StatusOK {
				t.Fatalf("/tokenize: %d %s", r.status, r.body)
			}
			got := decode[tokenizeJSON](t, r.body)
			if got.Count != len(got.Tokens) || got.Count == 0 || got.MaxModelLen != 64*BlockTokens {
				t.Fatalf("/tokenize: count %d for %d tokens, max_model_len %d", got.Count, len(got.Tokens), got.MaxModelLen)
			}
			complete(t, c, e.URL(), tc.chat, body)
			if p := last(t); !slices.Equal(p, got.Tokens) {
				t.Fatalf("prefilled %d tokens %v,\n/tokenize answered %d %v", len(p), p, len(got.Tokens), got.Tokens)
			}
			r = post(t, c, e.URL()+"/detokenize", map[string]any{"model": "m", "tokens": got.Tokens})
			if r.status != http.StatusOK {
				t.Fatalf("/detokenize: %d %s", r.status, r.body)
			}
			if text := decode[struct{ Prompt string }](t, r.body).Prompt; text != tc.rendered {
				t.Fatalf("/detokenize: %q, want %q", text, tc.rendered)
			}
		})
	}
}

func TestTokenizeRejectsBadInput(t *testing.T) {
	e := startEngine(t, Config{Model: "m"})
	c := newClient(t)
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	for _, tc := range []struct {
		name string
		body any
		want string
	}{
		{"both inputs", map[string]any{"prompt": "x", "messages": msgs}, "exactly one of prompt and messages"},
		{"no input", map[string]any{"model": "m"}, "exactly one of prompt and messages"},
		{"both switches", map[string]any{"messages": msgs, "add_generation_prompt": true, "continue_final_message": true}, "continue_final_message"},
		{"no role", map[string]any{"messages": []map[string]any{{"content": "hi"}}}, "messages[0].role"},
		{"not JSON", "{", "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, c, e.URL()+"/tokenize", tc.body)
			if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), tc.want) {
				t.Fatalf("%d %s, want 400 naming %q", r.status, r.body, tc.want)
			}
		})
	}
	if r := post(t, c, e.URL()+"/tokenize", map[string]any{"model": "other", "prompt": "x"}); r.status != http.StatusNotFound {
		t.Fatalf("another model: %d %s", r.status, r.body)
	}
}
