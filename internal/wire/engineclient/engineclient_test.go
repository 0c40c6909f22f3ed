package engineclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/wire/engineclient"
	enginev1 "github.com/tlgate/tlgate/protos/tl/engine/v1"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func start(t *testing.T, cfg enginesim.Config) *enginesim.Engine {
	t.Helper()
	cfg.Logger = zerolog.Nop()
	e, err := enginesim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// TestTokenizePrefillRelease drives a prefill and a decode reference engine
// through the client: tokenize on P, Prefill pushing to D, Release on D
// (twice: idempotent), and the errors of a bad tokenize.
func TestTokenizePrefillRelease(t *testing.T) {
	p := start(t, enginesim.Config{ID: "p", Model: "big", Role: enginesim.RolePrefill})
	d := start(t, enginesim.Config{ID: "d", Model: "big", Role: enginesim.RoleDecode})
	c := engineclient.New(engineclient.Options{})
	defer c.Close()
	ctx := context.Background()

	ids, err := c.Tokenize(ctx, p.HTTPAddr(), "big", []byte(`{"model":"public-name","prompt":"Once upon a time"}`), false)
	if err != nil || len(ids) == 0 {
		t.Fatalf("tokenize: %v %v", ids, err)
	}
	chatIDs, err := c.Tokenize(ctx, p.HTTPAddr(), "big", []byte(`{"model":"x","messages":[{"role":"user","content":"hi"}]}`), true)
	if err != nil || len(chatIDs) == 0 {
		t.Fatalf("tokenize chat: %v %v", chatIDs, err)
	}
	if _, err := c.Tokenize(ctx, p.HTTPAddr(), "other-model", []byte(`{"prompt":"x"}`), false); !errors.Is(err, engineclient.ErrTokenize) {
		t.Fatalf("tokenize for a model the engine does not serve: %v", err)
	}
	if _, err := c.Tokenize(ctx, p.HTTPAddr(), "big", []byte(`not json`), false); !errors.Is(err, engineclient.ErrTokenize) {
		t.Fatalf("tokenize of a bad body: %v", err)
	}

	resp, err := c.Prefill(ctx, p.GRPCAddr(), &enginev1.PrefillRequest{
		RequestId: "r1", Model: "big", PromptIds: ids, DecodeTarget: d.KVAddr(), KvFormat: 1,
		Sampling: &enginev1.SamplingParams{Temperature: 1, TopP: 1, MaxTokens: 16, Seed: 3},
	})
	if err != nil || resp.GetHandleId() == "" {
		t.Fatalf("prefill: %v %v", resp, err)
	}
	if d.Stats().HeldHandles != 1 {
		t.Fatalf("D holds %d handles after the push", d.Stats().HeldHandles)
	}
	rel, err := c.Release(ctx, d.KVAddr(), resp.GetHandleId())
	if err != nil || !rel.GetReleased() {
		t.Fatalf("release: %v %v", rel, err)
	}
	rel, err = c.Release(ctx, d.KVAddr(), resp.GetHandleId())
	if err != nil || rel.GetReleased() {
		t.Fatalf("second release: %v %v (want released=false, no error)", rel, err)
	}
	if s := d.Stats(); s.HeldHandles != 0 || s.HeldBlocks != 0 {
		t.Fatalf("D still holds %d handles, %d blocks", s.HeldHandles, s.HeldBlocks)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, d.KVAddr(), "h"); !errors.Is(err, engineclient.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestTokenizeChatTemplateSwitches: a chat body's prompt is tokenized as
// the decode engine will render it: the fields that change what the chat
// template renders (continue_final_message and add_generation_prompt, as
// the Messages bridge sets them for an assistant prefill; the template,
// its kwargs, the tools) go to /v1/tokenize with the messages, as vLLM's
// TokenizeChatRequest takes them, and the sampling fields do not. Against
// the reference engine, the tokens are those of the prompt its chat
// completions render for the same body.
func TestTokenizeChatTemplateSwitches(t *testing.T) {
	var got atomic.Value
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in map[string]any
		_ = json.NewDecoder(r.Body).Decode(&in)
		got.Store(in)
		fmt.Fprint(w, `{"tokens":[1,2],"count":2}`)
	}))
	defer eng.Close()
	c := engineclient.New(engineclient.Options{})
	defer c.Close()
	body := `{"model":"x","messages":[{"role":"user","content":"Answer in JSON."},{"role":"assistant","content":"{"}],` +
		`"add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":true,"chat_template":"{{ messages }}",` +
		`"chat_template_kwargs":{"enable_thinking":false},"tools":[{"type":"function","function":{"name":"f"}}],` +
		`"max_tokens":8,"temperature":0.5,"stream":true}`
	if _, err := c.Tokenize(context.Background(), strings.TrimPrefix(eng.URL, "http://"), "big", []byte(body), true); err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	_ = json.Unmarshal([]byte(body), &want)
	want["model"] = "big"
	delete(want, "max_tokens")
	delete(want, "temperature")
	delete(want, "stream")
	if in := got.Load(); fmt.Sprint(in) != fmt.Sprint(want) {
		t.Fatalf("/v1/tokenize got\n %v\nwant\n %v", in, want)
	}

	p := start(t, enginesim.Config{ID: "p", Model: "big", Role: enginesim.RolePrefill})
	msgs := `"messages":[{"role":"user","content":"Answer in JSON."},{"role":"assistant","content":"{\"answer\":"}]`
	open, err := c.Tokenize(context.Background(), p.HTTPAddr(), "big", []byte(`{`+msgs+`}`), true)
	if err != nil {
		t.Fatal(err)
	}
	cont, err := c.Tokenize(context.Background(), p.HTTPAddr(), "big", []byte(`{`+msgs+`,"continue_final_message":true,"add_generation_prompt":false}`), true)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+p.HTTPAddr()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"big",`+msgs+`,"continue_final_message":true,"add_generation_prompt":false,"max_tokens":1}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ans struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completions: %d %v", resp.StatusCode, err)
	}
	if len(cont) != ans.Usage.PromptTokens || len(cont) == len(open) {
		t.Fatalf("continuing the final message tokenized to %d tokens (%d with a generation prompt); the engine renders %d",
			len(cont), len(open), ans.Usage.PromptTokens)
	}
}

// TestDialControlGuardsGRPC: the gRPC calls dial through DialControl, so an
// address it refuses is never connected to (the engine here is real and
// would answer).
func TestDialControlGuardsGRPC(t *testing.T) {
	d := start(t, enginesim.Config{ID: "d", Model: "big", Role: enginesim.RoleDecode})
	refused := errors.New("refused by the test")
	var asked atomic.Int64
	c := engineclient.New(engineclient.Options{Timeout: 5 * time.Second, DialControl: func(network, address string, _ syscall.RawConn) error {
		asked.Add(1)
		return refused
	}})
	defer c.Close()
	_, err := c.Release(context.Background(), d.KVAddr(), "h")
	if err == nil || asked.Load() == 0 {
		t.Fatalf("release through a refusing DialControl: %v (asked %d times)", err, asked.Load())
	}
	if !strings.Contains(err.Error(), "refused by the test") {
		t.Errorf("error %q does not carry the refusal", err)
	}
}

// TestTokenizePromptShapes: a completions prompt of token ids is its own
// answer (the engine is not asked); text, alone or in a one-element array,
// is the engine's to tokenize; what the request is at fault for (a batch
// of prompts, token ids out of range, no tokens, a prompt the engine
// refuses) is a *PromptError with the status to answer, and what the
// engine is at fault for is ErrTokenize.
func TestTokenizePromptShapes(t *testing.T) {
	var asked atomic.Int32
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		var in struct {
			Model  string `json:"model"`
			Prompt any    `json:"prompt"`
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		w.Header().Set("Content-Type", "application/json")
		switch in.Prompt {
		case "":
			fmt.Fprint(w, `{"tokens":[],"count":0}`)
		case "refused":
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"object":"error","message":"This model's maximum context length is 8 tokens.","type":"BadRequestError","code":400}`)
		case "unprocessable":
			w.WriteHeader(http.StatusUnprocessableEntity)
			fmt.Fprint(w, `{"detail":"prompt: Input should be a valid string"}`)
		case "broken":
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":{"message":"boom"}}`)
		default:
			fmt.Fprintf(w, `{"tokens":[%d,%d],"count":2}`, len(in.Model), len(fmt.Sprint(in.Prompt)))
		}
	}))
	defer eng.Close()
	c := engineclient.New(engineclient.Options{})
	defer c.Close()
	addr := strings.TrimPrefix(eng.URL, "http://")
	cases := []struct {
		name, prompt string
		ids          []uint32
		asked        bool
		status       int    // a *PromptError's
		msg          string // in its message
		engineFault  bool   // ErrTokenize
	}{
		{name: "text", prompt: `"hello"`, ids: []uint32{3, 5}, asked: true},
		{name: "one text in an array", prompt: `["hello"]`, ids: []uint32{3, 5}, asked: true},
		{name: "token ids", prompt: `[5, 6, 7, 4294967295]`, ids: []uint32{5, 6, 7, 4294967295}},
		{name: "one array of token ids", prompt: `[[9, 8]]`, ids: []uint32{9, 8}},
		{name: "a batch of texts", prompt: `["a", "b"]`, status: 400, msg: "send the 2 prompts one by one"},
		{name: "a batch of token arrays", prompt: `[[1], [2], [3]]`, status: 400, msg: "send the 3 prompts one by one"},
		{name: "a token id past uint32", prompt: `[1, 4294967296]`, status: 400, msg: "token ids must be from 0 to 4294967295"},
		{name: "an empty token array", prompt: `[[]]`, status: 400, msg: "no tokens"},
		{name: "text of no tokens", prompt: `""`, asked: true, status: 400, msg: "no tokens"},
		{name: "refused by the engine", prompt: `"refused"`, asked: true, status: 400, msg: "refused the prompt: This model's maximum context length is 8 tokens."},
		{name: "unprocessable", prompt: `"unprocessable"`, asked: true, status: 422, msg: "Input should be a valid string"},
		{name: "the engine failing", prompt: `"broken"`, asked: true, engineFault: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := asked.Load()
			ids, err := c.Tokenize(context.Background(), addr, "big", []byte(`{"model":"x","prompt":`+tc.prompt+`}`), false)
			if got := asked.Load() > before; got != tc.asked {
				t.Fatalf("engine asked %v, want %v", got, tc.asked)
			}
			var pe *engineclient.PromptError
			switch {
			case tc.engineFault:
				if !errors.Is(err, engineclient.ErrTokenize) || errors.As(err, &pe) {
					t.Fatalf("%v %v, want ErrTokenize", ids, err)
				}
			case tc.status != 0:
				if !errors.As(err, &pe) || pe.Status != tc.status || !strings.Contains(pe.Message, tc.msg) {
					t.Fatalf("%v %v, want a PromptError %d with %q", ids, err, tc.status, tc.msg)
				}
			case err != nil || fmt.Sprint(ids) != fmt.Sprint(tc.ids):
				t.Fatalf("%v %v, want %v", ids, err, tc.ids)
			}
		})
	}
}
