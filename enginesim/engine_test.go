package enginesim

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

func completionBody(model, prompt string, extra map[string]any) map[string]any {
	b := map[string]any{"model": model, "prompt": prompt}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func chatBody(model, user string, extra map[string]any) map[string]any {
	b := map[string]any{"model": model, "messages": []map[string]any{
		{"role": "system", "content": "You are a helpful assistant."},
		{"role": "user", "content": user},
	}}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func TestEngineDeterministicAcrossInstances(t *testing.T) {
	a := startEngine(t, Config{Model: "m"})
	b := startEngine(t, Config{Model: "m"})
	c := newClient(t)
	for _, chat := range []bool{false, true} {
		for _, temp := range []float64{0, 0.7, 1.3} {
			t.Run(fmt.Sprintf("chat=%v/temperature=%v", chat, temp), func(t *testing.T) {
				extra := map[string]any{"seed": 1234, "temperature": temp, "max_tokens": 40, "logprobs": 3, "top_p": 0.95}
				body := completionBody("m", "Tell me about the river", extra)
				if chat {
					extra["logprobs"], extra["top_logprobs"] = true, 3
					body = chatBody("m", "Tell me about the river", extra)
				}
				ga := complete(t, c, a.URL(), chat, body)
				gb := complete(t, c, b.URL(), chat, body)
				if !reflect.DeepEqual(ga, gb) {
					t.Fatalf("two engines differ:\n%+v\n%+v", ga, gb)
				}
				if ga.Usage.CompletionTokens != 40 || len(ga.Tokens) != 40 {
					t.Fatalf("got %d tokens (usage %d), want 40", len(ga.Tokens), ga.Usage.CompletionTokens)
				}
			})
		}
	}
	other := startEngine(t, Config{Model: "other"})
	body := completionBody("other", "Tell me about the river", map[string]any{"seed": 1234, "max_tokens": 40})
	if g, h := complete(t, c, a.URL(), false, completionBody("m", "Tell me about the river", map[string]any{"seed": 1234, "max_tokens": 40})),
		complete(t, c, other.URL(), false, body); g.Text == h.Text {
		t.Fatalf("models m and other wrote the same text %q", g.Text)
	}
}

func TestTemperatureZeroGreedyAndSeedReproducible(t *testing.T) {
	e := startEngine(t, Config{Model: "m"})
	c := newClient(t)
	greedy := func(seed int) generation {
		return complete(t, c, e.URL(), false, completionBody("m", "The weather today is", map[string]any{
			"seed": seed, "temperature": 0, "max_tokens": 30, "logprobs": 5}))
	}
	g1 := greedy(1)
	for _, seed := range []int{2, 99, -7} {
		if g := greedy(seed); !reflect.DeepEqual(g, g1) {
			t.Fatalf("temperature 0 with seed %d differs from seed 1:\n%q\n%q", seed, g.Text, g1.Text)
		}
	}
	for i, tok := range g1.Tokens {
		for other, lp := range g1.Top[i] {
			if lp > g1.Logprobs[i] {
				t.Fatalf("token %d: greedy picked %q (%v) but %q has %v", i, tok, g1.Logprobs[i], other, lp)
			}
		}
	}

	sampled := func(seed int) generation {
		return complete(t, c, e.URL(), false, completionBody("m", "The weather today is", map[string]any{
			"seed": seed, "temperature": 1, "max_tokens": 30}))
	}
	s1, s1again, s2 := sampled(1), sampled(1), sampled(2)
	if s1.Text != s1again.Text {
		t.Fatalf("seed 1 twice: %q vs %q", s1.Text, s1again.Text)
	}
	if s1.Text == s2.Text {
		t.Fatalf("seeds 1 and 2 gave the same text %q", s1.Text)
	}
	// Without a seed the engine draws one: two requests differ.
	u1 := complete(t, c, e.URL(), false, completionBody("m", "The weather today is", map[string]any{"max_tokens": 30}))
	u2 := complete(t, c, e.URL(), false, completionBody("m", "The weather today is", map[string]any{"max_tokens": 30}))
	if u1.Text == u2.Text {
		t.Fatalf("two unseeded requests gave the same text %q", u1.Text)
	}
}

func TestStreamEqualsNonStream(t *testing.T) {
	e := startEngine(t, Config{Model: "m"})
	c := newClient(t)
	tests := []struct {
		name  string
		chat  bool
		extra map[string]any
	}{
		{"completions plain", false, map[string]any{"seed": 5, "max_tokens": 25}},
		{"completions logprobs", false, map[string]any{"seed": 6, "max_tokens": 25, "logprobs": 4, "temperature": 0.8, "top_k": 5}},
		{"completions stop", false, map[string]any{"seed": 7, "max_tokens": 60, "stop": []string{" the", "."}, "logprobs": 1}},
		{"completions greedy penalties", false, map[string]any{"seed": 8, "max_tokens": 40, "temperature": 0, "frequency_penalty": 1.5}},
		{"chat plain", true, map[string]any{"seed": 5, "max_tokens": 25}},
		{"chat logprobs", true, map[string]any{"seed": 9, "max_tokens": 25, "logprobs": true, "top_logprobs": 2, "top_p": 0.5}},
		{"chat stop", true, map[string]any{"seed": 10, "max_completion_tokens": 60, "stop": ", ", "logprobs": true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := completionBody("m", "Once upon a time, in a small town", tt.extra)
			if tt.chat {
				body = chatBody("m", "Write a story.", tt.extra)
			}
			whole := complete(t, c, e.URL(), tt.chat, body)
			body["stream"] = true
			body["stream_options"] = map[string]any{"include_usage": true}
			streamed := complete(t, c, e.URL(), tt.chat, body)
			if !reflect.DeepEqual(whole, streamed) {
				t.Fatalf("streamed differs from whole:\nwhole    %+v\nstreamed %+v", whole, streamed)
			}
			if whole.Usage.TotalTokens != whole.Usage.PromptTokens+whole.Usage.CompletionTokens || whole.Usage.CompletionTokens == 0 {
				t.Fatalf("usage %+v", whole.Usage)
			}
		})
	}
}

func TestStopStringsTruncate(t *testing.T) {
	e := startEngine(t, Config{Model: "m"})
	c := newClient(t)
	extra := map[string]any{"seed": 3, "max_tokens": 50, "logprobs": 0}
	free := complete(t, c, e.URL(), false, completionBody("m", "A long story", extra))
	if free.Finish != finishLength {
		t.Fatalf("finish %q without stop", free.Finish)
	}
	// Stop at the 10th token's text: the answer is everything before its
	// first occurrence.
	stop := free.Tokens[10]
	want := free.Text[:strings.Index(free.Text, stop)]
	for _, stream := range []bool{false, true} {
		extra["stop"], extra["stream"] = []string{stop, "never-appears"}, stream
		extra["stream_options"] = map[string]any{"include_usage": true}
		got := complete(t, c, e.URL(), false, completionBody("m", "A long story", extra))
		if got.Text != want || got.Finish != finishStop {
			t.Fatalf("stream=%v stop %q: text %q finish %q, want %q and stop", stream, stop, got.Text, got.Finish, want)
		}
		if n := len(got.Tokens); n > 11 || got.Usage.CompletionTokens != n {
			t.Fatalf("stream=%v: %d tokens, usage %d", stream, n, got.Usage.CompletionTokens)
		}
	}
}

func TestLogprobsMatchSampledTokens(t *testing.T) {
	e := startEngine(t, Config{Model: "m"})
	c := newClient(t)
	tok := tokenizer.Default()
	for _, chat := range []bool{false, true} {
		t.Run(fmt.Sprintf("chat=%v", chat), func(t *testing.T) {
			extra := map[string]any{"seed": 11, "max_tokens": 30, "temperature": 1.2, "logprobs": 3}
			body := completionBody("m", "Explain the sky", extra)
			if chat {
				extra["logprobs"], extra["top_logprobs"] = true, 3
				body = chatBody("m", "Explain the sky", extra)
			}
			g := complete(t, c, e.URL(), chat, body)
			if len(g.Tokens) != 30 || len(g.Logprobs) != 30 || len(g.Top) != 30 {
				t.Fatalf("%d tokens, %d logprobs, %d tops", len(g.Tokens), len(g.Logprobs), len(g.Top))
			}
			if strings.Join(g.Tokens, "") != g.Text {
				t.Fatalf("tokens %q do not spell the text %q", g.Tokens, g.Text)
			}
			for i, lp := range g.Logprobs {
				if lp > 0 || math.IsNaN(lp) || math.IsInf(lp, 0) {
					t.Fatalf("token %d logprob %v", i, lp)
				}
				if _, ok := tok.ID(g.Tokens[i]); !ok {
					t.Fatalf("token %q is not one vocabulary piece", g.Tokens[i])
				}
				top := g.Top[i]
				// Chat returns the top 3; completions the top 3 plus the
				// sampled token when it is not among them.
				if len(top) != 3 && (chat || len(top) != 4) {
					t.Fatalf("token %d: %d top logprobs", i, len(top))
				}
				if v, ok := top[g.Tokens[i]]; ok && v != lp {
					t.Fatalf("token %d %q: logprob %v, top_logprobs says %v", i, g.Tokens[i], lp, v)
				} else if !ok && !chat {
					t.Fatalf("token %d: sampled token missing from completions top_logprobs", i)
				}
				var probs []float64
				for _, v := range top {
					probs = append(probs, math.Exp(v))
				}
				sort.Float64s(probs)
				if sum := probs[len(probs)-1] + probs[0]; sum > 1+1e-9 {
					t.Fatalf("token %d: top probabilities %v exceed 1", i, probs)
				}
			}
		})
	}
}

func TestChatLogprobsShape(t *testing.T) {
	e := startEngine(t, Config{Model: "m"})
	c := newClient(t)
	r := post(t, c, e.URL()+"/v1/chat/completions", chatBody("m", "Hi", map[string]any{
		"seed": 1, "max_tokens": 5, "logprobs": true, "top_logprobs": 2}))
	v := decode[chatJSON](t, r.body)
	for _, lp := range v.Choices[0].Logprobs.Content {
		if string(bytesOf(lp.Bytes)) != lp.Token || len(lp.TopLogprobs) != 2 {
			t.Fatalf("logprob entry %+v", lp)
		}
		if lp.TopLogprobs[0].Logprob < lp.TopLogprobs[1].Logprob {
			t.Fatalf("top_logprobs not sorted: %+v", lp.TopLogprobs)
		}
	}
	if v.Object != "chat.completion" || !strings.HasPrefix(v.ID, "chatcmpl-") || v.Model != "m" {
		t.Fatalf("envelope %+v", v)
	}
	// Without logprobs asked for, none come back.
	r = post(t, c, e.URL()+"/v1/chat/completions", chatBody("m", "Hi", map[string]any{"max_tokens": 5}))
	if v := decode[chatJSON](t, r.body); v.Choices[0].Logprobs != nil {
		t.Fatalf("logprobs without asking: %+v", v.Choices[0].Logprobs)
	}
}

func bytesOf(ints []int) []byte {
	b := make([]byte, len(ints))
	for i, v := range ints {
		b[i] = byte(v)
	}
	return b
}

func TestPrefixCacheHits(t *testing.T) {
	e := startEngine(t, Config{Model: "m", KVBlocks: 64})
	c := newClient(t)
	tok := tokenizer.Default()
	// 40 tokens: two full blocks and a tail.
	ids := make([]uint32, 40)
	for i := range ids {
		ids[i] = tok.SpaceWords()[i]
	}
	body := map[string]any{"model": "m", "prompt": ids, "max_tokens": 1}
	steps := []struct {
		name          string
		prompt        []uint32
		queries, hits uint64
	}{
		{"cold", ids, 40, 0},
		{"same prompt hits both full blocks", ids, 80, 32},
		{"shared first block only", append(slices.Clone(ids[:20]), ids[30:]...), 110, 48},
		{"exactly two blocks: last token recomputed", ids[:32], 142, 64},
	}
	for _, s := range steps {
		body["prompt"] = s.prompt
		complete(t, c, e.URL(), false, body)
		st := e.Stats()
		if st.PrefixQueries != s.queries || st.PrefixHits != s.hits {
			t.Fatalf("%s: queries %d hits %d, want %d and %d", s.name, st.PrefixQueries, st.PrefixHits, s.queries, s.hits)
		}
		if st.FreeBlocks != st.TotalBlocks || st.Running != 0 {
			t.Fatalf("%s: %d of %d blocks free, %d running after the request", s.name, st.FreeBlocks, st.TotalBlocks, st.Running)
		}
	}
}

func TestPrefixCacheEvictsLRU(t *testing.T) {
	// 4 blocks: a 33-token prompt with max_tokens 1 needs 3 (2 cached).
	e := startEngine(t, Config{Model: "m", KVBlocks: 4})
	c := newClient(t)
	tok := tokenizer.Default()
	prompt := func(offset int) []uint32 {
		ids := make([]uint32, 33)
		for i := range ids {
			ids[i] = tok.SpaceWords()[offset+i]
		}
		return ids
	}
	run := func(ids []uint32) uint64 {
		before := e.Stats().PrefixHits
		complete(t, c, e.URL(), false, map[string]any{"model": "m", "prompt": ids, "max_tokens": 1})
		return e.Stats().PrefixHits - before
	}
	a, b := prompt(0), prompt(100)
	if h := run(a); h != 0 {
		t.Fatalf("cold a: %d hits", h)
	}
	if h := run(a); h != 32 {
		t.Fatalf("warm a: %d hits, want 32", h)
	}
	if h := run(b); h != 0 { // evicts one of a's blocks: only 4 blocks
		t.Fatalf("cold b: %d hits", h)
	}
	// Like vLLM, a chain's tail is evicted before its head: a's first
	// block survived.
	if h := run(a); h != 16 {
		t.Fatalf("a after b: %d hits, want 16 (its tail evicted)", h)
	}
}

func TestRequestLargerThanKVIsRejected(t *testing.T) {
	e := startEngine(t, Config{Model: "m", KVBlocks: 2})
	c := newClient(t)
	r := post(t, c, e.URL()+"/v1/completions", completionBody("m", "hello", map[string]any{"max_tokens": 40}))
	if r.status != http.StatusBadRequest || decode[errorJSON](t, r.body).Error.Code != "context_length_exceeded" {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if s := e.Stats(); s.FreeBlocks != 2 || s.Running != 0 {
		t.Fatalf("stats after rejection %+v", s)
	}
}

func TestQueueBeyondMaxRunning(t *testing.T) {
	h := &hooks{queued: make(chan struct{}, 1)}
	e := startEngine(t, Config{Model: "m", MaxRunning: 1, DecodePerToken: time.Hour, hooks: h})
	c := newClient(t)

	// The first request streams one token, then decodes for an hour.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := openStream(t, ctx, c, e.URL()+"/v1/completions", completionBody("m", "first", map[string]any{"max_tokens": 2, "stream": true}))
	first.next(t) // the first token's chunk: the sequence is running

	done := make(chan response, 1)
	go func() {
		r, _ := tryPost(c, e.URL()+"/v1/completions", completionBody("m", "second", map[string]any{"max_tokens": 1}))
		done <- r
	}()
	<-h.queued
	if s := e.Status(); s.QueueDepth != 1 || s.Running != 1 {
		t.Fatalf("queue depth %d running %d, want 1 and 1", s.QueueDepth, s.Running)
	}
	cancel() // the client of the first goes away: its slot frees
	first.close()
	if r := <-done; r.status != http.StatusOK {
		t.Fatalf("second request: %d %s", r.status, r.body)
	}
	s := e.Stats()
	if s.Waiting != 0 || s.Running != 0 || s.Completed != 1 || s.Aborted != 1 || s.FreeBlocks != s.TotalBlocks {
		t.Fatalf("stats %+v", s)
	}
}

func TestModelNotFoundAndBadRequests(t *testing.T) {
	e := startEngine(t, Config{Model: "m", MaxBodyBytes: 4096})
	c := newClient(t)
	tests := []struct {
		name   string
		path   string
		body   any
		status int
		code   string
	}{
		{"unknown model completions", "/v1/completions", completionBody("nope", "hi", nil), 404, "model_not_found"},
		{"unknown model chat", "/v1/chat/completions", chatBody("nope", "hi", nil), 404, "model_not_found"},
		{"unknown model tokenize", "/v1/tokenize", map[string]any{"model": "nope", "prompt": "hi"}, 404, "model_not_found"},
		{"malformed json", "/v1/completions", `{"model": "m", "prompt": `, 400, "invalid_request"},
		{"empty body", "/v1/chat/completions", ``, 400, "invalid_request"},
		{"wrong type", "/v1/completions", `{"model":"m","prompt":"x","max_tokens":"ten"}`, 400, "invalid_request"},
		{"missing model", "/v1/completions", `{"prompt":"x"}`, 400, "invalid_request"},
		{"missing prompt", "/v1/completions", `{"model":"m"}`, 400, "invalid_request"},
		{"empty messages", "/v1/chat/completions", `{"model":"m","messages":[]}`, 400, "invalid_request"},
		{"image part", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, "invalid_request"},
		{"max_tokens 0", "/v1/completions", completionBody("m", "x", map[string]any{"max_tokens": 0}), 400, "invalid_request"},
		{"temperature 3", "/v1/completions", completionBody("m", "x", map[string]any{"temperature": 3}), 400, "invalid_request"},
		{"top_p 0", "/v1/completions", completionBody("m", "x", map[string]any{"top_p": 0}), 400, "invalid_request"},
		{"n 2", "/v1/completions", completionBody("m", "x", map[string]any{"n": 2}), 400, "invalid_request"},
		{"top_logprobs 21", "/v1/chat/completions", chatBody("m", "x", map[string]any{"logprobs": true, "top_logprobs": 21}), 400, "invalid_request"},
		{"token id outside vocabulary", "/v1/completions", `{"model":"m","prompt":[1,2,99999999]}`, 400, "invalid_request"},
		{"seed not an integer", "/v1/completions", `{"model":"m","prompt":"x","seed":1.5}`, 400, "invalid_request"},
		{"body too large", "/v1/completions", completionBody("m", strings.Repeat("x", 5000), nil), 413, "request_too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, c, e.URL()+tt.path, tt.body)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
			var shape map[string]map[string]any
			if err := decodeInto(r.body, &shape); err != nil {
				t.Fatalf("body %s: %v", r.body, err)
			}
			got := shape["error"]
			if got["code"] != tt.code || got["param"] != nil || got["message"] == "" || got["type"] == "" {
				t.Fatalf("error %v, want code %q and OpenAI's shape", got, tt.code)
			}
			if _, ok := got["param"]; !ok {
				t.Fatalf("error %v has no param field", got)
			}
		})
	}
	if r := get(t, c, e.URL()+"/v1/models/nope"); r.status != 404 || decode[errorJSON](t, r.body).Error.Code != "model_not_found" {
		t.Fatalf("GET /v1/models/nope: %d %s", r.status, r.body)
	}
	if s := e.Stats(); s.Completed != 0 || s.FreeBlocks != s.TotalBlocks {
		t.Fatalf("stats after bad requests %+v", s)
	}
}

func TestTokenizeModelsHealth(t *testing.T) {
	e := startEngine(t, Config{Model: "m", KVBlocks: 100})
	c := newClient(t)
	tok := tokenizer.Default()

	r := post(t, c, e.URL()+"/v1/tokenize", map[string]any{"prompt": "Hello world, naïve café"})
	tr := decode[struct {
		Tokens      []uint32 `json:"tokens"`
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
	}](t, r.body)
	if !slices.Equal(tr.Tokens, tok.Encode("Hello world, naïve café")) || tr.Count != len(tr.Tokens) || tr.MaxModelLen != 1600 {
		t.Fatalf("tokenize: %s", r.body)
	}
	r = post(t, c, e.URL()+"/v1/detokenize", map[string]any{"tokens": tr.Tokens})
	if got := decode[map[string]string](t, r.body)["prompt"]; got != "Hello world, naïve café" {
		t.Fatalf("detokenize: %s", r.body)
	}

	// Chat messages tokenize to exactly the prompt a chat completion counts.
	msgs := chatBody("m", "What is up?", nil)["messages"]
	r = post(t, c, e.URL()+"/v1/tokenize", map[string]any{"model": "m", "messages": msgs})
	chatTokens := decode[struct {
		Tokens []uint32 `json:"tokens"`
	}](t, r.body).Tokens
	g := complete(t, c, e.URL(), true, chatBody("m", "What is up?", map[string]any{"max_tokens": 1}))
	if len(chatTokens) != g.Usage.PromptTokens {
		t.Fatalf("tokenize gave %d tokens, chat counted %d prompt tokens", len(chatTokens), g.Usage.PromptTokens)
	}
	want := "system\nYou are a helpful assistant.\nuser\nWhat is up?\nassistant\n"
	if text, _ := tok.Decode(chatTokens); text != want {
		t.Fatalf("chat template %q, want %q", text, want)
	}
	for _, bad := range []string{`{}`, `{"prompt":"a","messages":[{"role":"user","content":"b"}]}`} {
		if r := post(t, c, e.URL()+"/v1/tokenize", bad); r.status != 400 {
			t.Fatalf("tokenize %s: %d", bad, r.status)
		}
	}

	r = get(t, c, e.URL()+"/v1/models")
	models := decode[struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}](t, r.body)
	if models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "m" || models.Data[0].Object != "model" {
		t.Fatalf("models: %s", r.body)
	}
	if r := get(t, c, e.URL()+"/v1/models/m"); r.status != 200 {
		t.Fatalf("GET /v1/models/m: %d", r.status)
	}
	if r := get(t, c, e.URL()+"/health"); r.status != 200 {
		t.Fatalf("health: %d", r.status)
	}
}

func TestStatusAndConfig(t *testing.T) {
	e := startEngine(t, Config{Model: "m", Role: RoleDecode, KVBlocks: 10, KVFormat: 3, ID: "d-1"})
	s := e.Status()
	if s.WorkerId != "d-1" || s.Model != "m" || s.Role.String() != "ROLE_DECODE" || s.KvFormat != 3 ||
		s.KvTotalBlocks != 10 || s.KvFreeBlocks != 10 || s.KvBlockTokens != 16 ||
		s.HttpAddress != e.HTTPAddr() || s.KvAddress != e.KVAddr() || s.GrpcAddress != "" || s.StartedAtUnixMs == 0 {
		t.Fatalf("status %v", s)
	}
	for _, bad := range []Config{
		{Role: "both"}, {ID: "has space"}, {Confidence: 1.5}, {KVBlocks: -1},
		{Gateways: []string{"no-port"}}, {Faults: Faults{StallMS: -1}},
	} {
		if _, err := Start(context.Background(), bad); err == nil {
			t.Fatalf("Start(%+v) succeeded", bad)
		}
	}
	d := startEngine(t, Config{HTTPAddr: "0.0.0.0:0"})
	if st := d.Status(); !strings.HasPrefix(st.HttpAddress, "127.0.0.1:") || st.Model != DefaultModel || st.Role.String() != "ROLE_UNIFIED" {
		t.Fatalf("default status %v", st)
	}
}
