package test

import (
	"context"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/enginesim/tokenizer"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// poolingCluster is a gateway with the key alice (key-alice) and the
// routes "embed" (to the served model emb) and "auto" (a cascade whose
// last step is emb), in front of engines; reg and logs, when set, get its
// metrics and access log.
func poolingCluster(t *testing.T, reg *prometheus.Registry, logs *lockedBuffer, engines ...enginesim.Config) *cluster {
	t.Helper()
	return newClusterGateway(t, `
[[gateway.routes]]
model = "embed"
aliases = ["embed-latest"]
backends = [{ model = "emb", weight = 1 }]

[[gateway.routes]]
model = "auto"
cascade = [{ model = "small", accept_if = "mean_logprob > -1.2" }, { model = "emb" }]
`, []clusterOpt{withKeys(config.APIKey{Name: "alice", Key: "key-alice", Scopes: []string{"inference", "debug"}})}, nil,
		func(o *gateway.Options) {
			if reg != nil {
				o.Registry, o.Gatherer = reg, reg
			}
			if logs != nil {
				o.Logger = zerolog.New(logs)
			}
		}, engines...)
}

func norm(v []float64) float64 {
	var n float64
	for _, x := range v {
		n += x * x
	}
	return math.Sqrt(n)
}

// TestEmbeddingsWithOpenAIClient: openai-go's embeddings client through
// the gateway, with one input, a batch and token arrays, by route, alias
// and cascade; usage is the engine's prompt_tokens, counted per key; the
// requests fail over before the answer; nothing is recorded in the
// prefix index.
func TestEmbeddingsWithOpenAIClient(t *testing.T) {
	reg := prometheus.NewRegistry()
	logs := &lockedBuffer{}
	c := poolingCluster(t, reg, logs, enginesim.Config{ID: "e1", Model: "emb"}, enginesim.Config{ID: "e2", Model: "emb"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := openai.NewClient(option.WithBaseURL(c.url+"/v1/"), option.WithAPIKey("key-alice"), option.WithMaxRetries(0))

	text := "The quick brown fox jumps over the lazy dog. " + strings.Repeat("Pack my box with five dozen liquor jugs. ", 20)
	one, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "embed",
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String(text)}})
	if err != nil {
		t.Fatal(err)
	}
	ids := tokenizer.Default().Encode(text)
	if len(one.Data) != 1 || len(one.Data[0].Embedding) != enginesim.DefaultEmbeddingDim || one.Model != "emb" ||
		math.Abs(norm(one.Data[0].Embedding)-1) > 1e-9 || one.Usage.PromptTokens != int64(len(ids)) {
		t.Fatalf("one input: %d embeddings (len %d), model %q, usage %+v; want 1 of %d, emb, %d prompt tokens",
			len(one.Data), len(one.Data[0].Embedding), one.Model, one.Usage, enginesim.DefaultEmbeddingDim, len(ids))
	}

	batch, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "embed-latest",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a red apple", text, "a green pear"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(batch.Data) != 3 || batch.Data[1].Index != 1 || !slices.Equal(batch.Data[1].Embedding, one.Data[0].Embedding) ||
		slices.Equal(batch.Data[0].Embedding, batch.Data[2].Embedding) {
		t.Fatalf("batch: %d embeddings; the text's is not the one input's, or two texts embed alike", len(batch.Data))
	}

	tokens := make([][]int64, 2)
	for _, id := range ids {
		tokens[0] = append(tokens[0], int64(id))
	}
	for _, id := range tokenizer.Default().Encode("a green pear") {
		tokens[1] = append(tokens[1], int64(id))
	}
	byTokens, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "auto",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfTokenArrays: tokens}})
	if err != nil {
		t.Fatal(err)
	}
	if len(byTokens.Data) != 2 || !slices.Equal(byTokens.Data[0].Embedding, one.Data[0].Embedding) ||
		!slices.Equal(byTokens.Data[1].Embedding, batch.Data[2].Embedding) {
		t.Fatal("token arrays do not embed as their texts")
	}

	// Before the answer, a worker that fails is left for the other.
	if err := c.engines["e1"].SetFaults(enginesim.Faults{Unavailable: true}); err != nil {
		t.Fatal(err)
	}
	again, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "embed",
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String(text)}, EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again.Data[0].Embedding, one.Data[0].Embedding) {
		t.Fatal("the failover's answer differs")
	}
	if _, failovers, _ := c.hooks.snapshot(); !slices.Contains(failovers, "e1:status_503") {
		t.Fatalf("failovers %v, want e1:status_503", failovers)
	}

	// Usage: the engines' prompt_tokens, per key and route; no completion.
	wantPrompt := one.Usage.PromptTokens + batch.Usage.PromptTokens + byTokens.Usage.PromptTokens + again.Usage.PromptTokens
	waitKeyRequests(t, reg, "alice", 4)
	var prompt float64
	for _, route := range []string{"embed", "auto"} {
		prompt += counter(t, reg, "tlgate_tokens_total", map[string]string{"key": "alice", "model": route, "kind": "prompt"})
		if n := counter(t, reg, "tlgate_tokens_total", map[string]string{"key": "alice", "model": route, "kind": "completion"}); n != 0 {
			t.Errorf("completion tokens of %s: %v", route, n)
		}
	}
	if prompt != float64(wantPrompt) {
		t.Errorf("prompt tokens counted %v, want %d", prompt, wantPrompt)
	}
	if n := counter(t, reg, "tlgate_endpoint_requests_total", map[string]string{"endpoint": "embeddings", "outcome": "ok"}); n != 4 {
		t.Errorf("tlgate_endpoint_requests_total{embeddings,ok} = %v, want 4", n)
	}
	r := c.post("/v1/embeddings", "key-alice", map[string]any{"model": "embed", "input": "x"}, "X-Request-Id", "emb-log")
	if r.status != http.StatusOK || r.header.Get("X-TL-Route") != "e2" {
		t.Fatalf("embeddings: %d, routed to %q:\n%s", r.status, r.header.Get("X-TL-Route"), r.body)
	}
	var line map[string]any
	eventually(t, 10*time.Second, func() bool { line = logs.line("emb-log"); return line != nil }, "access log")
	if line["path"] != "/v1/embeddings" || line["prompt_tokens"] != float64(1) || line["route"] != "embed" || line["usage_estimated"] == true {
		t.Fatalf("access log %v", line)
	}

	// Embeddings keep no KV cache: nothing of theirs is in the prefix index.
	for _, w := range c.workers() {
		if w.PrefixIndexChunks != 0 {
			t.Errorf("%s holds %d chunks of the prefix index", w.ID, w.PrefixIndexChunks)
		}
	}

	// Bad input is the gateway's 400, naming the field.
	for _, bad := range []map[string]any{
		{"model": "embed"}, {"model": "embed", "input": []any{"a", 1}}, {"model": "embed", "input": ""},
		{"model": "embed", "input": "a", "encoding_format": "int8"},
	} {
		r := c.post("/v1/embeddings", "key-alice", bad)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "input") && !strings.Contains(string(r.body), "encoding_format") {
			t.Errorf("%v: %d %s", bad, r.status, r.body)
		}
	}
	if r := c.post("/v1/embeddings", "key-alice", map[string]any{"model": "nope", "input": "a"}); r.status != http.StatusNotFound ||
		!strings.Contains(string(r.body), "model_not_found") {
		t.Errorf("unknown model: %d %s", r.status, r.body)
	}
	if r := c.get("/v1/embeddings", "key-alice"); r.status != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/embeddings: %d", r.status)
	}
}

// TestRerankAndScore: rerank in vLLM's, Jina's (/v1/rerank) and Cohere's
// v2 (/v2/rerank) shapes and vLLM's score, through a route, least loaded,
// with the engine's usage counted and its ranking relayed as it is.
func TestRerankAndScore(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := poolingCluster(t, reg, nil, enginesim.Config{ID: "e1", Model: "emb"}, enginesim.Config{ID: "e2", Model: "emb"})
	docs := []any{"Paris is the capital of France.", map[string]any{"text": "Horses and cows are both animals."},
		"The capital of France is Paris, on the Seine."}
	query := "What is the capital of France?"
	var results []gjson.Result
	for _, path := range []string{"/v1/rerank", "/v2/rerank"} {
		r := c.post(path, "key-alice", map[string]any{"model": "embed", "query": query, "documents": docs, "top_n": 2})
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
		res := gjson.GetBytes(r.body, "results").Array()
		if len(res) != 2 || res[0].Get("relevance_score").Float() < res[1].Get("relevance_score").Float() ||
			gjson.GetBytes(r.body, "usage.total_tokens").Int() <= 0 {
			t.Fatalf("%s: %s", path, r.body)
		}
		if res[0].Get("index").Int() == 1 || res[1].Get("index").Int() == 1 {
			t.Fatalf("%s: the animals outrank France: %s", path, r.body)
		}
		if results != nil && res[0].Raw != results[0].Raw {
			t.Fatalf("two paths ranked differently: %s and %s", results[0].Raw, res[0].Raw)
		}
		results = res
	}
	total := gjson.GetBytes(c.post("/v1/rerank", "key-alice", map[string]any{"model": "embed", "query": query, "documents": docs}).body, "usage.total_tokens").Int()

	// Score: one text_1 against each text_2; the same pairs score as
	// rerank relevance does.
	r := c.post("/v1/score", "key-alice", map[string]any{"model": "auto", "text_1": query, "text_2": []any{docs[0], "Horses and cows are both animals."}})
	if r.status != http.StatusOK {
		t.Fatalf("score: %d %s", r.status, r.body)
	}
	data := gjson.GetBytes(r.body, "data").Array()
	if len(data) != 2 || data[0].Get("object").Str != "score" || data[0].Get("score").Float() <= data[1].Get("score").Float() {
		t.Fatalf("score: %s", r.body)
	}
	scoreTokens := gjson.GetBytes(r.body, "usage.prompt_tokens").Int()
	if r := c.post("/v1/score", "key-alice", map[string]any{"model": "embed", "text_1": []any{"a", "b"}, "text_2": []any{"a", "b", "c"}}); r.status != http.StatusBadRequest {
		t.Fatalf("a mismatched score: %d %s (the engine's 400, relayed)", r.status, r.body)
	}

	// Bad bodies are the gateway's 400s, naming the field.
	for _, tc := range []struct {
		path  string
		body  map[string]any
		param string
	}{
		{"/v1/rerank", map[string]any{"model": "embed", "documents": docs}, "query"},
		{"/v1/rerank", map[string]any{"model": "embed", "query": query, "documents": []any{}}, "documents"},
		{"/v1/rerank", map[string]any{"model": "embed", "query": query, "documents": []any{1}}, "documents[0]"},
		{"/v1/rerank", map[string]any{"model": "embed", "query": query, "documents": docs, "top_n": -1}, "top_n"},
		{"/v1/score", map[string]any{"model": "embed", "text_1": "a"}, "text_2"},
	} {
		r := c.post(tc.path, "key-alice", tc.body)
		if r.status != http.StatusBadRequest || gjson.GetBytes(r.body, "error.param").Str != tc.param {
			t.Errorf("%s %v: %d %s, want 400 naming %s", tc.path, tc.body, r.status, r.body, tc.param)
		}
	}

	// Usage: rerank's total_tokens and score's prompt_tokens, per route.
	waitKeyRequests(t, reg, "alice", 4)
	rerank := counter(t, reg, "tlgate_tokens_total", map[string]string{"key": "alice", "model": "embed", "kind": "prompt"})
	score := counter(t, reg, "tlgate_tokens_total", map[string]string{"key": "alice", "model": "auto", "kind": "prompt"})
	if rerank != float64(3*total) || score != float64(scoreTokens) {
		t.Errorf("prompt tokens: rerank %v (want %d), score %v (want %d)", rerank, 3*total, score, scoreTokens)
	}
	for ep, n := range map[string]float64{"rerank": 3, "score": 1} {
		if got := counter(t, reg, "tlgate_endpoint_requests_total", map[string]string{"endpoint": ep, "outcome": "ok"}); got != n {
			t.Errorf("tlgate_endpoint_requests_total{%s,ok} = %v, want %v", ep, got, n)
		}
	}
}

// TestTokenizeRoutes: /tokenize and /detokenize in vLLM's shape reach a
// worker of the model whatever its role (a disaggregated route's prefill
// or decode workers included), through routes and aliases, charge no
// tokens, and round-trip.
func TestTokenizeRoutes(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := newClusterGateway(t, `
[[gateway.routes]]
model = "chat"
aliases = ["chat-latest"]
backends = [{ model = "m", weight = 1 }]

[[gateway.routes]]
model = "pd"
backends = [{ model = "big", weight = 1 }]
targets = ["disaggregated"]
`, []clusterOpt{withKeys(config.APIKey{Name: "alice", Key: "key-alice", Scopes: []string{"inference", "debug"}})}, nil,
		func(o *gateway.Options) { o.Registry, o.Gatherer = reg, reg },
		enginesim.Config{ID: "u1", Model: "m"},
		enginesim.Config{ID: "p1", Model: "big", Role: enginesim.RolePrefill},
		enginesim.Config{ID: "d1", Model: "big", Role: enginesim.RoleDecode})

	text := "Tokenize this sentence, please."
	want := tokenizer.Default().Encode(text)
	seen := map[string]bool{}
	for i, model := range []string{"chat", "chat-latest", "m", "pd", "pd", "big"} {
		r := c.post("/tokenize", "key-alice", map[string]any{"model": model, "prompt": text, "return_token_strs": true})
		if r.status != http.StatusOK {
			t.Fatalf("tokenize %s: %d %s", model, r.status, r.body)
		}
		var got []uint32
		for _, id := range gjson.GetBytes(r.body, "tokens").Array() {
			got = append(got, uint32(id.Uint()))
		}
		if !slices.Equal(got, want) || gjson.GetBytes(r.body, "count").Int() != int64(len(want)) ||
			len(gjson.GetBytes(r.body, "token_strs").Array()) != len(want) {
			t.Fatalf("tokenize %s: %s, want tokens %v", model, r.body, want)
		}
		worker := r.header.Get("X-TL-Route")
		seen[worker] = true
		if (model == "pd" || model == "big") != (worker == "p1" || worker == "d1") {
			t.Fatalf("request %d for %s went to %q", i, model, worker)
		}
		ids := make([]any, len(got))
		for i, id := range got {
			ids[i] = id
		}
		d := c.post("/detokenize", "key-alice", map[string]any{"model": model, "tokens": ids})
		if d.status != http.StatusOK || gjson.GetBytes(d.body, "prompt").Str != text {
			t.Fatalf("detokenize %s: %d %s", model, d.status, d.body)
		}
	}
	if !seen["u1"] || !seen["p1"] && !seen["d1"] {
		t.Fatalf("workers used: %v", seen)
	}

	// Chat messages, rendered by the engine.
	r := c.post("/tokenize", "key-alice", map[string]any{"model": "chat", "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	if r.status != http.StatusOK || gjson.GetBytes(r.body, "count").Int() == 0 {
		t.Fatalf("tokenize messages: %d %s", r.status, r.body)
	}
	for _, tc := range []struct {
		path  string
		body  map[string]any
		param string
	}{
		{"/tokenize", map[string]any{"model": "chat"}, "prompt"},
		{"/tokenize", map[string]any{"prompt": "x"}, "model"},
		{"/detokenize", map[string]any{"model": "chat", "tokens": "x"}, "tokens"},
	} {
		r := c.post(tc.path, "key-alice", tc.body)
		if r.status != http.StatusBadRequest || gjson.GetBytes(r.body, "error.param").Str != tc.param {
			t.Errorf("%s %v: %d %s, want 400 naming %s", tc.path, tc.body, r.status, r.body, tc.param)
		}
	}
	if r := c.post("/tokenize", "key-alice", map[string]any{"model": "nope", "prompt": "x"}); r.status != http.StatusNotFound {
		t.Errorf("tokenize an unknown model: %d %s", r.status, r.body)
	}

	// Counted as requests, with no tokens.
	waitKeyRequests(t, reg, "alice", 13)
	for _, route := range []string{"chat", "pd", "big", "m"} {
		if n := counter(t, reg, "tlgate_tokens_total", map[string]string{"key": "alice", "model": route, "kind": "prompt"}); n != 0 {
			t.Errorf("tokenize charged %v prompt tokens to %s", n, route)
		}
	}
	if n := counter(t, reg, "tlgate_endpoint_requests_total", map[string]string{"endpoint": "tokenize", "outcome": "ok"}); n != 7 {
		t.Errorf("tlgate_endpoint_requests_total{tokenize,ok} = %v, want 7", n)
	}
}

// TestUnsupportedPathIsNotAFailure: an engine that does not serve a path
// answers 404 (vLLM's {"detail":"Not Found"}); the client gets that
// answer, in OpenAI's shape with code unsupported_endpoint, at once, and
// the worker is not failed for it: no failover, no suspicion, no
// ejection, however often it is asked, and its other paths keep serving.
func TestUnsupportedPathIsNotAFailure(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := newClusterGateway(t, `
[gateway.ejection]
consecutive_failures = 1
consecutive_refused = 1
`, []clusterOpt{withKeys(config.APIKey{Name: "alice", Key: "key-alice", Scopes: []string{"inference", "debug"}})}, nil,
		func(o *gateway.Options) { o.Registry, o.Gatherer = reg, reg },
		enginesim.Config{ID: "g1", Model: "gen", Unserved: []string{"/v1/embeddings", "/v1/rerank"}},
		enginesim.Config{ID: "g2", Model: "gen", Unserved: []string{"/v1/embeddings", "/v1/rerank"}})
	for i := range 6 {
		path, body := "/v1/embeddings", map[string]any{"model": "gen", "input": "hello"}
		if i%2 == 1 {
			path, body = "/v1/rerank", map[string]any{"model": "gen", "query": "q", "documents": []any{"d"}}
		}
		r := c.post(path, "key-alice", body)
		if r.status != http.StatusNotFound || gjson.GetBytes(r.body, "error.code").Str != "unsupported_endpoint" ||
			!strings.Contains(gjson.GetBytes(r.body, "error.message").Str, "POST "+path) {
			t.Fatalf("%s: %d %s, want the engine's 404 as unsupported_endpoint", path, r.status, r.body)
		}
	}
	routed, failovers, _ := c.hooks.snapshot()
	if len(failovers) != 0 || len(routed) != 6 {
		t.Fatalf("routed %v, failovers %v: want 6 single attempts", routed, failovers)
	}
	for _, w := range c.workers() {
		if !w.Routable || w.Ejections != 0 || w.ConsecutiveFailures != 0 || !w.EjectedUntil.IsZero() {
			t.Fatalf("%s after the 404s: routable %v, %d ejections, %d failures in a row", w.ID, w.Routable, w.Ejections, w.ConsecutiveFailures)
		}
	}
	// The worker still serves what it serves.
	if r := c.post("/v1/completions", "key-alice", map[string]any{"model": "gen", "prompt": "hi", "max_tokens": 2}); r.status != http.StatusOK {
		t.Fatalf("completion: %d %s", r.status, r.body)
	}
	if n := counter(t, reg, "tlgate_failovers_total", map[string]string{"route": "gen", "reason": "bad_answer"}); n != 0 {
		t.Fatalf("failovers for bad answers: %v", n)
	}
	if n := counter(t, reg, "tlgate_endpoint_requests_total", map[string]string{"endpoint": "embeddings", "outcome": "client_error"}); n != 3 {
		t.Errorf("tlgate_endpoint_requests_total{embeddings,client_error} = %v, want 3", n)
	}
}
