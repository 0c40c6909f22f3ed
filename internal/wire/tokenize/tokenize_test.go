package tokenize_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/enginesim/tokenizer"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/wire/tokenize"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

type msg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// server is a tokenizer serving vLLM's POST /tokenize with the reference
// engine's tokenizer; render is its chat template.
func server(t *testing.T, render func([]msg, bool) string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	calls := &atomic.Int32{}
	tok := tokenizer.Default()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path != "/tokenize" {
			http.NotFound(w, r)
			return
		}
		var body struct {
			Model    string `json:"model"`
			Messages []msg  `json:"messages"`
			Prompt   string `json:"prompt"`
			AddGen   *bool  `json:"add_generation_prompt"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		text := body.Prompt
		if body.Messages != nil {
			text = render(body.Messages, body.AddGen == nil || *body.AddGen)
		}
		ids := tok.Encode(text)
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": ids, "count": len(ids), "max_model_len": 1 << 15})
	}))
	t.Cleanup(srv.Close)
	return srv, calls
}

// chatML renders messages as the reference engine does (role, content,
// each line-ended), the generation prompt last.
func chatML(ms []msg, gen bool) string {
	var b strings.Builder
	for _, m := range ms {
		b.WriteString(m.Role + "\n" + m.Content + "\n")
	}
	if gen {
		b.WriteString("assistant\n")
	}
	return b.String()
}

// headed renders like chatML but prompts the answer with another header
// than the one an answer is rendered with afterwards ("assistant:" then
// "assistant"), as some templates do: no turn's tokens are a prefix of the
// next one's.
func headed(ms []msg, gen bool) string {
	s := chatML(ms, false)
	if gen {
		s += "assistant:\n"
	}
	return s
}

func body(t *testing.T, ms []msg, extra string) []byte {
	t.Helper()
	b, err := json.Marshal(ms)
	if err != nil {
		t.Fatal(err)
	}
	return []byte(`{"model":"m","messages":` + string(b) + extra + `}`)
}

var words = strings.Fields("the a cache of tokens routes every request to where its prefix lives and answers faster than before when caches are warm")

func sentence(r *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()
}

// TestTokenizationReuseIsExact: over random conversations, every reuse of
// an earlier turn's tokens is a prefix of the turn's own tokens as the
// reference engine's POST /tokenize makes them (its chat template keeps
// earlier turns as a prefix), whole requests seen before come back equal,
// and a template that does not keep earlier turns as a prefix (another
// tokenizer's) is never reused.
func TestTokenizationReuseIsExact(t *testing.T) {
	e, err := enginesim.Start(context.Background(), enginesim.Config{ID: "e", Model: "m", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Kill()
	other, _ := server(t, headed)
	for _, tt := range []struct {
		name   string
		url    string
		render func([]msg, bool) string
		reuse  bool
	}{{"the reference engine", e.URL(), chatML, true}, {"another answer header", other.URL, headed, false}} {
		t.Run(tt.name, func(t *testing.T) {
			c := tokenize.New(tokenize.Options{CacheTokens: 1 << 20})
			defer c.Close()
			r := rand.New(rand.NewPCG(1, 2))
			reused := 0
			for conv := range 20 {
				ms := []msg{{"system", fmt.Sprintf("conversation %d: %s", conv, sentence(r, 30))}}
				for turn := range 6 {
					ms = append(ms, msg{"user", sentence(r, 5+r.IntN(40))})
					req := tokenize.Request{URL: tt.url, Model: "m", Chat: true, Body: body(t, ms, "")}
					truth := tokenizer.Default().Encode(tt.render(ms, true))
					got, kind, _ := c.Lookup(req)
					switch kind {
					case tokenize.Prefix:
						reused++
						if !tt.reuse {
							t.Fatalf("conversation %d turn %d: a template that keeps no prefix was reused", conv, turn)
						}
						if len(got) > len(truth) || !slices.Equal(got, truth[:len(got)]) {
							t.Fatalf("conversation %d turn %d: reused tokens are not a prefix of the turn's", conv, turn)
						}
					case tokenize.Hit:
						t.Fatalf("conversation %d turn %d: a new turn hit the cache whole", conv, turn)
					}
					// Every turn is tokenized whole here, to compare.
					toks, err := c.Tokenize(context.Background(), req)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(toks, truth) {
						t.Fatalf("conversation %d turn %d: tokens differ from the tokenizer's", conv, turn)
					}
					if again, kind, _ := c.Lookup(req); kind != tokenize.Hit || !slices.Equal(again, truth) {
						t.Fatalf("conversation %d turn %d: the same request again: %s", conv, turn, kind)
					}
					ms = append(ms, msg{"assistant", sentence(r, 10+r.IntN(60))})
				}
			}
			if tt.reuse && reused < 80 {
				t.Errorf("%d turns reused their earlier turns' tokens, want most of 100", reused)
			}
			if tt.reuse != c.Reusable("m") {
				t.Errorf("Reusable = %v", c.Reusable("m"))
			}
		})
	}
}

// TestTokenizationReuseSavesCalls runs conversations as the request
// actor does (a reuse is tokenized whole off the path only when Lookup
// says so): their turns past the first few cost far fewer tokenizer calls
// than turns.
func TestTokenizationReuseSavesCalls(t *testing.T) {
	srv, calls := server(t, chatML)
	c := tokenize.New(tokenize.Options{CacheTokens: 1 << 22})
	defer c.Close()
	r := rand.New(rand.NewPCG(3, 4))
	turns := 0
	for conv := range 10 {
		ms := []msg{{"system", fmt.Sprintf("conversation %d: %s", conv, sentence(r, 300))}}
		for range 12 {
			turns++
			ms = append(ms, msg{"user", sentence(r, 20)})
			req := tokenize.Request{URL: srv.URL, Model: "m", Chat: true, Body: body(t, ms, "")}
			if _, kind, refresh := c.Lookup(req); kind == tokenize.Miss || refresh {
				if _, err := c.Tokenize(context.Background(), req); err != nil {
					t.Fatal(err)
				}
			}
			ms = append(ms, msg{"assistant", sentence(r, 40)})
		}
	}
	if n := int(calls.Load()); n*2 > turns {
		t.Errorf("%d tokenizer calls for %d turns", n, turns)
	} else {
		t.Logf("%d tokenizer calls for %d turns", n, turns)
	}
}

// TestReadReadsTheBodyOnce: a request given to Read is looked up and
// tokenized from what Read read, not from its body again (the body is
// overwritten after Read, which a second read would find no JSON).
func TestReadReadsTheBodyOnce(t *testing.T) {
	srv, _ := server(t, chatML)
	ctx := context.Background()
	orig := body(t, []msg{{"system", "be brief"}, {"user", "where does the prefix live"}}, "")
	fresh := tokenize.New(tokenize.Options{})
	defer fresh.Close()
	want, err := fresh.Tokenize(ctx, tokenize.Request{URL: srv.URL, Model: "m", Chat: true, Body: orig})
	if err != nil {
		t.Fatal(err)
	}
	c := tokenize.New(tokenize.Options{CacheTokens: 1 << 20})
	defer c.Close()
	req := tokenize.Read(tokenize.Request{URL: srv.URL, Model: "m", Chat: true, Body: slices.Clone(orig)})
	copy(req.Body, bytes.Repeat([]byte{'x'}, len(req.Body)))
	if _, kind, _ := c.Lookup(req); kind != tokenize.Miss {
		t.Fatalf("Lookup before tokenizing: %s, want %s", kind, tokenize.Miss)
	}
	got, err := c.Tokenize(ctx, req)
	if err != nil {
		t.Fatalf("Tokenize of a request Read read: %v", err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("Tokenize: %v, want %v", got, want)
	}
	if toks, kind, _ := c.Lookup(req); kind != tokenize.Hit || !slices.Equal(toks, want) {
		t.Errorf("Lookup after tokenizing: %s %v, want %s %v", kind, toks, tokenize.Hit, want)
	}
	bad := tokenize.Read(tokenize.Request{URL: srv.URL, Model: "m", Chat: true, Body: []byte(`{"messages":`)})
	if _, err := c.Tokenize(ctx, bad); !errors.Is(err, tokenize.ErrUnsupported) {
		t.Errorf("Tokenize of a body that is not JSON: %v, want %v", err, tokenize.ErrUnsupported)
	}
}

func TestTokenizeShapes(t *testing.T) {
	srv, calls := server(t, chatML)
	c := tokenize.New(tokenize.Options{CacheTokens: 1 << 20})
	defer c.Close()
	ctx := context.Background()
	// A completions prompt as text, as one string in an array, as tokens.
	for _, b := range []string{`{"model":"m","prompt":"hello world"}`, `{"model":"m","prompt":["hello world"]}`} {
		toks, err := c.Tokenize(ctx, tokenize.Request{URL: srv.URL, Model: "m", Body: []byte(b)})
		if err != nil || !slices.Equal(toks, tokenizer.Default().Encode("hello world")) {
			t.Fatalf("%s: %v %v", b, toks, err)
		}
	}
	n := calls.Load()
	if toks, kind, _ := c.Lookup(tokenize.Request{URL: srv.URL, Model: "m", Body: []byte(`{"model":"m","prompt":[1,2,3]}`)}); kind != tokenize.Hit || !slices.Equal(toks, []uint32{1, 2, 3}) {
		t.Fatalf("token prompt: %v %s", toks, kind)
	}
	if calls.Load() != n {
		t.Fatal("a prompt of token ids was sent to the tokenizer")
	}
	for _, b := range []string{`{"prompt":["a","b"]}`, `{"prompt":[[1],[2]]}`, `{"prompt":7}`, `not json`} {
		if _, err := c.Tokenize(ctx, tokenize.Request{URL: srv.URL, Model: "m", Body: []byte(b)}); !errors.Is(err, tokenize.ErrUnsupported) {
			t.Errorf("%s: %v", b, err)
		}
	}
	if _, err := c.Tokenize(ctx, tokenize.Request{URL: srv.URL, Model: "m", Chat: true, Body: []byte(`{"messages":[]}`)}); !errors.Is(err, tokenize.ErrUnsupported) {
		t.Errorf("no messages: %v", err)
	}
	// Another tool list is another prompt: no hit.
	ms := []msg{{"user", "hi"}}
	if _, err := c.Tokenize(ctx, tokenize.Request{URL: srv.URL, Model: "m", Chat: true, Body: body(t, ms, "")}); err != nil {
		t.Fatal(err)
	}
	if _, kind, _ := c.Lookup(tokenize.Request{URL: srv.URL, Model: "m", Chat: true, Body: body(t, ms, `,"tools":[{"type":"function"}]`)}); kind != tokenize.Miss {
		t.Fatalf("other tools: %s", kind)
	}
}

func TestTokenizeFailures(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Unix(1000, 0).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()
	c := tokenize.New(tokenize.Options{CacheTokens: 1 << 10, Backoff: time.Minute, Now: clock})
	defer c.Close()
	req := tokenize.Request{URL: notFound.URL, Model: "m", Body: []byte(`{"prompt":"x"}`)}
	if _, err := c.Tokenize(context.Background(), req); !errors.Is(err, tokenize.ErrTokenizer) {
		t.Fatalf("404: %v", err)
	}
	if _, err := c.Tokenize(context.Background(), req); !errors.Is(err, tokenize.ErrUnavailable) {
		t.Fatalf("within the backoff: %v", err)
	}
	now.Add(int64(time.Minute))
	if _, err := c.Tokenize(context.Background(), req); !errors.Is(err, tokenize.ErrTokenizer) {
		t.Fatalf("after the backoff: %v", err)
	}
	// A slow tokenizer: the deadline ends the call and is no failure of it.
	block := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(block)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	sreq := tokenize.Request{URL: slow.URL, Model: "m", Body: []byte(`{"prompt":"x"}`)}
	if _, err := c.Tokenize(ctx, sreq); err == nil {
		t.Fatal("a slow tokenizer answered")
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if _, err := c.Tokenize(ctx2, sreq); errors.Is(err, tokenize.ErrUnavailable) {
		t.Fatal("a deadline made the tokenizer unavailable")
	}
}

// TestTokenizeAnswerOverLimit: an answer longer than MaxResponse is
// refused with an error that names the limit, not read as truncated JSON.
func TestTokenizeAnswerOverLimit(t *testing.T) {
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"tokens":[1]`)
		pad := bytes.Repeat([]byte(" "), 1<<20)
		for n := 0; n <= tokenize.MaxResponse; n += len(pad) {
			if _, err := w.Write(pad); err != nil {
				return
			}
		}
		_, _ = io.WriteString(w, `}`)
	}))
	defer huge.Close()
	c := tokenize.New(tokenize.Options{CacheTokens: 1 << 10})
	defer c.Close()
	_, err := c.Tokenize(context.Background(), tokenize.Request{URL: huge.URL, Model: "m", Body: []byte(`{"prompt":"x"}`)})
	if want := fmt.Sprintf("the answer is over the %d-byte limit", tokenize.MaxResponse); !errors.Is(err, tokenize.ErrTokenizer) || !strings.Contains(err.Error(), want) {
		t.Fatalf("an answer over the limit: %v, want %q", err, want)
	}
}

func TestTokenizeCacheBounded(t *testing.T) {
	srv, _ := server(t, chatML)
	c := tokenize.New(tokenize.Options{CacheTokens: 100})
	defer c.Close()
	for i := range 50 {
		b := []byte(fmt.Sprintf(`{"prompt":"prompt number %d of many"}`, i))
		if _, err := c.Tokenize(context.Background(), tokenize.Request{URL: srv.URL, Model: "m", Body: b}); err != nil {
			t.Fatal(err)
		}
	}
	if _, kind, _ := c.Lookup(tokenize.Request{URL: srv.URL, Model: "m", Body: []byte(`{"prompt":"prompt number 0 of many"}`)}); kind != tokenize.Miss {
		t.Fatal("the oldest prompt outlived the bound")
	}
	if _, kind, _ := c.Lookup(tokenize.Request{URL: srv.URL, Model: "m", Body: []byte(`{"prompt":"prompt number 49 of many"}`)}); kind != tokenize.Hit {
		t.Fatal("the newest prompt is gone")
	}
}

// vllmLike is a tokenizer that answers as vLLM's /tokenize does for base
// model "m" only: another model id (an adapter it does not serve) is 404
// with an OpenAI-shaped error, a chat whose roles do not alternate is 400
// (its chat template raised), and a path other than /tokenize is FastAPI's
// 404 {"detail":"Not Found"}. A prompt "fail" is answered 500.
func vllmLike(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tokenize" {
			http.Error(w, `{"detail":"Not Found"}`, http.StatusNotFound)
			return
		}
		var b struct {
			Model    string `json:"model"`
			Messages []msg  `json:"messages"`
			Prompt   string `json:"prompt"`
		}
		_ = json.NewDecoder(r.Body).Decode(&b)
		switch {
		case b.Model != "m":
			http.Error(w, `{"error":{"message":"The model `+"`"+b.Model+"`"+` does not exist.","type":"NotFoundError","param":null,"code":404}}`, http.StatusNotFound)
		case len(b.Messages) > 1 && b.Messages[0].Role == b.Messages[1].Role:
			http.Error(w, `{"error":{"message":"Conversation roles must alternate user/assistant","type":"BadRequestError","param":null,"code":400}}`, http.StatusBadRequest)
		case b.Prompt == "fail":
			http.Error(w, `{"error":{"message":"EngineCore died","type":"InternalServerError","param":null,"code":500}}`, http.StatusInternalServerError)
		default:
			_, _ = w.Write([]byte(`{"tokens":[1,2,3],"count":3,"max_model_len":8192}`))
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestTokenizeBacksOffOnlyFailingEndpoints: a request the tokenizer
// refuses for itself (a chat template that raises: 400; a model id it does
// not serve: vLLM's 404 with an OpenAI-shaped error) fails alone and does
// not take the endpoint away from every other request for the backoff; an
// endpoint that fails (500) or serves no /tokenize (FastAPI's 404) is
// backed off.
func TestTokenizeBacksOffOnlyFailingEndpoints(t *testing.T) {
	srv := vllmLike(t)
	good := tokenize.Request{URL: srv.URL, Model: "m", Chat: true, Body: []byte(`{"messages":[{"role":"user","content":"hi"}]}`)}
	for _, tc := range []struct {
		name    string
		bad     tokenize.Request
		backoff bool
	}{
		{"adapter", tokenize.Request{URL: srv.URL, Model: "m-sql", Chat: true, Body: []byte(`{"messages":[{"role":"user","content":"a"}]}`)}, false},
		{"template", tokenize.Request{URL: srv.URL, Model: "m", Chat: true, Body: []byte(`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`)}, false},
		{"500", tokenize.Request{URL: srv.URL, Model: "m", Body: []byte(`{"prompt":"fail"}`)}, true},
		{"no /tokenize", tokenize.Request{URL: srv.URL + "/v2", Model: "m", Body: []byte(`{"prompt":"x"}`)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tokenize.New(tokenize.Options{CacheTokens: 1 << 10})
			defer c.Close()
			if _, err := c.Tokenize(context.Background(), tc.bad); !errors.Is(err, tokenize.ErrTokenizer) {
				t.Fatalf("refused request: %v, want ErrTokenizer", err)
			}
			again := good
			again.URL = tc.bad.URL
			_, err := c.Tokenize(context.Background(), again)
			if got := errors.Is(err, tokenize.ErrUnavailable); got != tc.backoff {
				t.Fatalf("the next request: %v; backed off %v, want %v", err, got, tc.backoff)
			}
		})
	}
}

// TestTokenizeConfiguredAsBase: a tokenizer configured for a base model
// (Options.Bases) is asked as that model for a request that names an
// adapter of it, which it does not serve; an engine's own /tokenize (not
// in Bases) is asked as the model the request names.
func TestTokenizeConfiguredAsBase(t *testing.T) {
	srv := vllmLike(t)
	c := tokenize.New(tokenize.Options{CacheTokens: 1 << 10, Bases: map[string]string{srv.URL: "m"}})
	defer c.Close()
	req := tokenize.Request{URL: srv.URL, Model: "m-sql", Chat: true, Body: []byte(`{"messages":[{"role":"user","content":"a"}]}`)}
	if toks, err := c.Tokenize(context.Background(), req); err != nil || len(toks) != 3 {
		t.Fatalf("an adapter at its base's tokenizer: %v %v", toks, err)
	}
	req.URL = srv.URL + "/"
	if _, err := c.Tokenize(context.Background(), req); !errors.Is(err, tokenize.ErrTokenizer) {
		t.Fatalf("an adapter at an engine that does not serve it: %v, want ErrTokenizer", err)
	}
}

// TestTokenizeBoundsCallsPerEndpoint: an endpoint with MaxConcurrent calls
// in flight is not asked for another prompt (ErrBusy, at once), and is not
// backed off for it: once its calls end it is asked again.
func TestTokenizeBoundsCallsPerEndpoint(t *testing.T) {
	const bound = 3
	arrived, release := make(chan struct{}, bound+1), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		_, _ = w.Write([]byte(`{"tokens":[1,2],"count":2,"max_model_len":8192}`))
	}))
	defer srv.Close()
	c := tokenize.New(tokenize.Options{CacheTokens: 1 << 10, MaxConcurrent: bound})
	defer c.Close()
	prompt := func(i int) tokenize.Request {
		return tokenize.Request{URL: srv.URL, Model: "m", Body: fmt.Appendf(nil, `{"prompt":"prompt %d"}`, i)}
	}
	errs := make(chan error, bound)
	for i := range bound {
		go func() {
			_, err := c.Tokenize(context.Background(), prompt(i))
			errs <- err
		}()
		<-arrived
	}
	over := make(chan error, 1)
	go func() {
		_, err := c.Tokenize(context.Background(), prompt(bound))
		over <- err
	}()
	select {
	case err := <-over:
		if !errors.Is(err, tokenize.ErrBusy) {
			t.Errorf("past the bound: %v, want ErrBusy", err)
		}
	case <-arrived:
		t.Error("past the bound, the endpoint was asked")
		defer func() { <-over }()
	}
	close(release)
	for range bound {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Tokenize(context.Background(), prompt(bound)); err != nil {
		t.Fatalf("once the calls ended: %v", err)
	}
}

// TestTokenizeForwardsMediaIOKwargs: a chat's media_io_kwargs (how vLLM
// loads its images, videos, audio), which its TokenizeChatRequest takes,
// are sent to /tokenize and part of the request's key.
func TestTokenizeForwardsMediaIOKwargs(t *testing.T) {
	got := make(chan []byte, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
		_, _ = w.Write([]byte(`{"tokens":[1,2,3],"count":3,"max_model_len":8192}`))
	}))
	defer srv.Close()
	c := tokenize.New(tokenize.Options{CacheTokens: 1 << 10})
	defer c.Close()
	const kw = `{"video":{"num_frames":8}}`
	req := tokenize.Request{URL: srv.URL, Model: "m", Chat: true, Body: []byte(`{"messages":[{"role":"user","content":"a"}],"media_io_kwargs":` + kw + `}`)}
	if _, err := c.Tokenize(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	var sent struct {
		MediaIOKwargs json.RawMessage `json:"media_io_kwargs"`
	}
	if err := json.Unmarshal(<-got, &sent); err != nil || string(sent.MediaIOKwargs) != kw {
		t.Fatalf("media_io_kwargs sent %s (%v), want %s", sent.MediaIOKwargs, err, kw)
	}
	req.Body = []byte(`{"messages":[{"role":"user","content":"a"}],"media_io_kwargs":{"video":{"num_frames":16}}}`)
	if _, kind, _ := c.Lookup(req); kind != tokenize.Miss {
		t.Fatalf("other media_io_kwargs: %s, want a miss", kind)
	}
}
