package request

import (
	"context"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/tokenize"
)

// noTokenizer is a Tokenizer the tests never call.
type noTokenizer struct{}

func (noTokenizer) Lookup(tokenize.Request) ([]uint32, string, bool) { return nil, "", false }
func (noTokenizer) Tokenize(context.Context, tokenize.Request) ([]uint32, error) {
	return nil, nil
}
func (noTokenizer) Refresh(tokenize.Request, time.Duration) bool { return false }

// TestMediaIsNotTokenized: a chat with an image is never asked for its
// tokens (an engine's /tokenize gives every image the same placeholder
// tokens, which name none of the blocks the engine keys by the image), so
// it is routed on the prefix index; a text chat may be asked.
func TestMediaIsNotTokenized(t *testing.T) {
	for _, tc := range []struct {
		body  string
		noAsk bool
	}{
		{`{"model":"m","messages":[{"role":"user","content":"describe a cat"}]}`, false},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`, true},
	} {
		req, err := openai.ParseRequest([]byte(tc.body), true)
		if err != nil {
			t.Fatal(err)
		}
		a := &requestActor{d: &Deps{Tokenizer: noTokenizer{}}, ex: &Exchange{Req: req}, dialect: dialect.OpenAI}
		if got := a.noAsk(); got != tc.noAsk {
			t.Errorf("%s: noAsk %v, want %v", tc.body, got, tc.noAsk)
		}
	}
}
