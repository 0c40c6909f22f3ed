package request

import (
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// TestSaltedBody: an attempt's body carries the key's cache_salt in place
// of the client's whatever the engine; one the client did not send is
// added for every engine kind but openai (whose servers may refuse an
// unknown field) and never to a tokenizer's body; the client's body as
// sent otherwise.
func TestSaltedBody(t *testing.T) {
	const bound = "tl1-bound"
	for _, tc := range []struct {
		name     string
		path     string
		endpoint openai.Endpoint
		body     string
		salt     Salt
		kind     string
		want     string // the cache_salt sent; "-" none
	}{
		{"replaced, heartbeat worker", "/v1/chat/completions", openai.EndpointChat, `{"model":"m","cache_salt":"mine"}`, SaltReplace, "", bound},
		{"replaced, openai kind", "/v1/chat/completions", openai.EndpointChat, `{"model":"m","cache_salt":"mine"}`, SaltReplace, "openai", bound},
		{"added, vllm", "/v1/completions", openai.EndpointCompletions, `{"model":"m"}`, SaltAdd, "vllm", bound},
		{"added, sglang responses", "/v1/responses", openai.EndpointResponses, `{"model":"m"}`, SaltAdd, "sglang", bound},
		{"added, embeddings", "/v1/embeddings", openai.EndpointEmbeddings, `{"model":"m"}`, SaltAdd, "vllm", bound},
		{"not added, openai kind", "/v1/chat/completions", openai.EndpointChat, `{"model":"m"}`, SaltAdd, "openai", "-"},
		{"not added, tokenize", "/tokenize", openai.EndpointTokenize, `{"model":"m"}`, SaltAdd, "vllm", "-"},
		{"as sent", "/v1/chat/completions", openai.EndpointChat, `{"model":"m","cache_salt":"open"}`, SaltAsSent, "vllm", "open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := openai.Request{Model: "m", Endpoint: tc.endpoint, CacheSalt: bound}
			if tc.salt == SaltAsSent {
				req.CacheSalt = "open"
			}
			obj, err := openai.ObjectOf([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Object = obj
			ex := NewExchange(t.Context(), nil, req, tc.path, "req-1")
			ex.Salt = tc.salt
			a := &requestActor{ex: ex, dialect: dialect.Of(tc.path),
				target: router.Target{ServedModel: "m", Worker: fleet.Worker{ID: "w", Kind: tc.kind}, CascadeSteps: 1}}
			b := a.body(nil)
			got := gjson.GetBytes(b, "cache_salt")
			if tc.want == "-" && got.Exists() || tc.want != "-" && got.Str != tc.want {
				t.Fatalf("body %s: cache_salt %s, want %s", b, got.Raw, tc.want)
			}
		})
	}
}
