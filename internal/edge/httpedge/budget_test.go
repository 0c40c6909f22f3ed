package httpedge

import (
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/guard/ratelimit"
	"github.com/tlgate/tlgate/internal/wire/anthropic"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// TestBudgetEveryGeneratingEndpoint: an admission under a tokens limit
// that granted 100 completion tokens (the default budget, or a clamp)
// rewrites the budget field of every generating endpoint whose client
// asked for more or set none: max_tokens (or max_completion_tokens) of
// chat and completions, max_tokens of Anthropic's Messages, and
// max_output_tokens of Responses. A budget within the grant, a key without
// a tokens limit and a pooling request go as sent.
func TestBudgetEveryGeneratingEndpoint(t *testing.T) {
	chat := func(b []byte) (openai.Request, error) { return openai.ParseRequest(b, true) }
	completions := func(b []byte) (openai.Request, error) { return openai.ParseRequest(b, false) }
	for _, tc := range []struct {
		name    string
		parse   parseFunc
		body    string
		limited bool
		field   string // the budget's field; "" when the body goes as sent
	}{
		{"completions, none set", completions, `{"model":"m","prompt":"hi"}`, true, "max_tokens"},
		{"chat, max_completion_tokens over", chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":4000}`, true, "max_completion_tokens"},
		{"messages, max_tokens over", anthropic.ParseRequest, `{"model":"m","max_tokens":4000,"messages":[{"role":"user","content":"hi"}]}`, true, "max_tokens"},
		{"responses, max_output_tokens over", openai.ParseResponses, `{"model":"m","input":"hi","max_output_tokens":4000}`, true, "max_output_tokens"},
		{"responses, none set", openai.ParseResponses, `{"model":"m","input":"hi"}`, true, "max_output_tokens"},
		{"responses, within the grant", openai.ParseResponses, `{"model":"m","input":"hi","max_output_tokens":50}`, true, ""},
		{"messages, no tokens limit", anthropic.ParseRequest, `{"model":"m","max_tokens":4000,"messages":[{"role":"user","content":"hi"}]}`, false, ""},
		{"embeddings", openai.ParseEmbeddings, `{"model":"m","input":"hi"}`, true, ""},
	} {
		req, err := tc.parse([]byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		adm := ratelimit.Decision{OK: true, MaxTokens: 100}
		if tc.limited {
			adm.Tokens.Limit = 1000
		}
		out := (&Deps{}).budget(req, adm)
		sent := out.Object.Bytes()
		if tc.field == "" {
			if string(sent) != tc.body {
				t.Errorf("%s: sent %s, want the body as it came", tc.name, sent)
			}
			continue
		}
		if got := gjson.GetBytes(sent, tc.field); got.Raw != "100" || out.MaxTokens == nil || *out.MaxTokens != 100 {
			t.Errorf("%s: sent %s (MaxTokens %v), want %s 100", tc.name, sent, out.MaxTokens, tc.field)
		}
	}
}
