package usage

import "testing"

func TestAdd(t *testing.T) {
	u := Usage{PromptTokens: 1, CompletionTokens: 2}
	u.Add(Usage{PromptTokens: 10, CompletionTokens: 20, Estimated: true})
	if u != (Usage{11, 22, true}) || u.Total() != 33 {
		t.Fatalf("%+v", u)
	}
	u = Usage{PromptTokens: maxTokens}
	u.Add(Usage{PromptTokens: maxTokens})
	if u.PromptTokens != maxTokens {
		t.Fatalf("overflow: %+v", u)
	}
}
