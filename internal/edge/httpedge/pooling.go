package httpedge

import (
	"net/http"

	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// poolingPaths are the inference paths beside completions: each path the
// gateway serves, the path asked of the engine, and its body's parser.
// /v2/rerank is the path Cohere's v2 client calls (vLLM serves it too);
// each path is relayed to the engine's path of the same name.
var poolingPaths = []struct {
	path  string
	parse parseFunc
}{
	{openai.PathEmbeddings, openai.ParseEmbeddings},
	{openai.PathRerank, openai.ParseRerank},
	{"/v2/rerank", openai.ParseRerank},
	{openai.PathScore, openai.ParseScore},
	{openai.PathTokenize, openai.ParseTokenize},
	{openai.PathDetokenize, openai.ParseDetokenize},
}

// registerPooling mounts the pooling and tokenizer paths: POST, with the
// inference scope, and an OpenAI-shaped 405 for any other method.
func (d *Deps) registerPooling(mux *http.ServeMux) {
	for _, p := range poolingPaths {
		mux.Handle("POST "+p.path, d.Keyring.Require(auth.ScopeInference, d.inferWith(p.parse)))
		mux.Handle(p.path, d.Keyring.Require(auth.ScopeInference, openai.MethodNotAllowed("POST")))
	}
}
