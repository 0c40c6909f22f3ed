package test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// TestDisaggregatedMessagesAndResponses: Anthropic's Messages API and
// OpenAI's Responses API on a disaggregated route, whose engines the
// gateway drives over chat completions, for vLLM's and SGLang's protocols
// and tlgate's own contract: every
// answer, whole and streamed, read by the API's own Go client, is the
// unified engine's answer to the same request through its own API (text,
// stop reason, usage); both legs were chat completions; what chat
// completions cannot carry (a stored response, a hosted tool) is a 400
// that names the field, in the API's error shape.
func TestDisaggregatedMessagesAndResponses(t *testing.T) {
	for kind, protocol := range map[string]string{"vllm": "vllm", "sglang": "sglang", "heartbeat": "tlgate"} {
		t.Run(kind, func(t *testing.T) {
			var reps pdReports
			f := newPDFleet(t, pdOpts{deps: reps.hook},
				pdSpec{id: "u", kind: kind}, pdSpec{id: "p", kind: kind, role: "prefill"}, pdSpec{id: "d", kind: kind, role: "decode"})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			disaggMessages(ctx, t, f)
			disaggResponses(ctx, t, f)
			reps.wantProtocol(t, protocol, 4)
			for _, id := range []string{"p", "d"} {
				if f.byID[id] == nil {
					continue // heartbeat engines: no front to record
				}
				for _, r := range f.byID[id].front.requests() {
					if r.path != "/v1/chat/completions" {
						t.Errorf("engine %s was sent %s, want every leg as chat completions", id, r.path)
					}
				}
			}
		})
	}
}

// disaggMessages compares the Messages API's answers on big-pd with big's.
func disaggMessages(ctx context.Context, t *testing.T, f *pdFleet) {
	t.Helper()
	client := anthropic.NewClient(aoption.WithBaseURL(f.url+"/"), aoption.WithAPIKey("unused"), aoption.WithMaxRetries(0))
	params := func(model string) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{
			Model: anthropic.Model(model), MaxTokens: 12,
			System:   []anthropic.TextBlockParam{{Text: "You are terse."}},
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("The gateway sends the prompt to a prefill engine."))},
		}
	}
	seed := aoption.WithJSONSet("seed", 11)
	type answer struct {
		text, stop string
		in, out    int64
		blocks     int
		firstLast  string
	}
	whole := func(model string, opts ...func(*anthropic.MessageNewParams)) answer {
		p := params(model)
		for _, o := range opts {
			o(&p)
		}
		msg, err := client.Messages.New(ctx, p, seed)
		if err != nil {
			t.Fatalf("messages %s: %v", model, err)
		}
		a := answer{stop: string(msg.StopReason), in: msg.Usage.InputTokens, out: msg.Usage.OutputTokens, blocks: len(msg.Content)}
		for _, b := range msg.Content {
			a.text += b.Text
		}
		return a
	}
	streamed := func(model string) answer {
		s := client.Messages.NewStreaming(ctx, params(model), seed)
		var acc anthropic.Message
		var types []string
		for s.Next() {
			ev := s.Current()
			types = append(types, ev.Type)
			if err := acc.Accumulate(ev); err != nil {
				t.Fatalf("messages %s: accumulate: %v", model, err)
			}
		}
		if err := s.Err(); err != nil {
			t.Fatalf("messages %s stream: %v (events %v)", model, err, types)
		}
		_ = s.Close()
		a := answer{stop: string(acc.StopReason), out: acc.Usage.OutputTokens, blocks: len(acc.Content), firstLast: types[0] + "…" + types[len(types)-1]}
		for _, b := range acc.Content {
			a.text += b.Text
		}
		return a
	}
	u, d := whole("big"), whole("big-pd")
	if u.text == "" || u != d {
		t.Fatalf("messages, whole:\nunified        %+v\ndisaggregated  %+v", u, d)
	}
	u, d = streamed("big"), streamed("big-pd")
	if u.text == "" || u != d || d.firstLast != "message_start…message_stop" {
		t.Fatalf("messages, streamed:\nunified        %+v\ndisaggregated  %+v", u, d)
	}
	// An assistant prefill, which the bridge sends as chat completions
	// continuing the final message without a generation prompt: the
	// prefill engine computes the KV of the prompt the decode engine
	// renders, so the answer is the unified engine's to that chat request
	// (the reference engine's own Messages API renders a new turn after
	// the assistant's message instead).
	d = whole("big-pd", func(p *anthropic.MessageNewParams) {
		p.Messages = append(p.Messages, anthropic.NewAssistantMessage(anthropic.NewTextBlock(`{"answer":`)))
	})
	r := f.post("/v1/chat/completions", "", map[string]any{"model": "big", "max_tokens": 12, "seed": 11,
		"continue_final_message": true, "add_generation_prompt": false,
		"messages": []map[string]string{{"role": "system", "content": "You are terse."},
			{"role": "user", "content": "The gateway sends the prompt to a prefill engine."}, {"role": "assistant", "content": `{"answer":`}}})
	var usage struct {
		Usage struct {
			PromptTokens int64 `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if r.status != http.StatusOK || json.Unmarshal(r.body, &usage) != nil {
		t.Fatalf("unified chat continuing the final message: %d %s", r.status, r.body)
	}
	if want := completionText(t, r.body); want == "" || d.text != want || d.in != usage.Usage.PromptTokens {
		t.Fatalf("messages with an assistant prefill: %q of %d prompt tokens; unified chat continuing it %q of %d",
			d.text, d.in, want, usage.Usage.PromptTokens)
	}
	r = f.post("/v1/messages", "", `{"model":"big-pd","max_tokens":4,"messages":[{"role":"user","content":"hi"}],"mcp_servers":[{"type":"url","url":"https://example.com","name":"x"}]}`)
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), `"type":"invalid_request_error"`) || !strings.Contains(string(r.body), "mcp_servers") {
		t.Fatalf("messages with mcp_servers: %d %s, want an Anthropic 400 naming mcp_servers", r.status, r.body)
	}
}

// disaggResponses compares the Responses API's answers on big-pd with
// big's.
func disaggResponses(ctx context.Context, t *testing.T, f *pdFleet) {
	t.Helper()
	client := openai.NewClient(option.WithBaseURL(f.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	params := func(model string) responses.ResponseNewParams {
		return responses.ResponseNewParams{
			Model: model, Instructions: openai.String("You are terse."), MaxOutputTokens: openai.Int(12), Store: openai.Bool(false),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("The gateway sends the prompt to a prefill engine.")},
		}
	}
	seed := option.WithJSONSet("seed", 11)
	type answer struct {
		text, status string
		in, out      int64
		firstLast    string
	}
	resp, err := client.Responses.New(ctx, params("big"), seed)
	if err != nil {
		t.Fatalf("responses big: %v", err)
	}
	u := answer{text: resp.OutputText(), status: string(resp.Status), in: resp.Usage.InputTokens, out: resp.Usage.OutputTokens}
	if resp, err = client.Responses.New(ctx, params("big-pd"), seed); err != nil {
		t.Fatalf("responses big-pd: %v", err)
	}
	d := answer{text: resp.OutputText(), status: string(resp.Status), in: resp.Usage.InputTokens, out: resp.Usage.OutputTokens}
	if u.text == "" || u != d || resp.Object != "response" {
		t.Fatalf("responses, whole:\nunified        %+v\ndisaggregated  %+v (object %q)", u, d, resp.Object)
	}
	streamed := func(model string) answer {
		s := client.Responses.NewStreaming(ctx, params(model), seed)
		var types []string
		var text strings.Builder
		var done responses.Response
		for s.Next() {
			ev := s.Current()
			types = append(types, ev.Type)
			switch ev.Type {
			case "response.output_text.delta":
				text.WriteString(ev.Delta)
			case "response.completed", "response.incomplete":
				done = ev.Response
			}
		}
		if err := s.Err(); err != nil {
			t.Fatalf("responses %s stream: %v (events %v)", model, err, types)
		}
		_ = s.Close()
		if done.OutputText() != text.String() {
			t.Fatalf("responses %s stream: deltas %q, final response %q", model, text.String(), done.OutputText())
		}
		return answer{text: text.String(), status: string(done.Status), in: done.Usage.InputTokens, out: done.Usage.OutputTokens,
			firstLast: types[0] + "…" + types[len(types)-1]}
	}
	u, d = streamed("big"), streamed("big-pd")
	// The reference engine, as vLLM does, ends every stream with
	// response.completed; the bridge as OpenAI's API does, with
	// response.incomplete for an incomplete response.
	last := "response.created…response." + d.status
	u.firstLast, d.firstLast = "", strings.TrimSuffix(d.firstLast, last)
	if u.text == "" || u != d {
		t.Fatalf("responses, streamed (the bridge's stream to end with %s):\nunified        %+v\ndisaggregated  %+v", last, u, d)
	}
	for _, c := range []struct{ body, names string }{
		{`{"model":"big-pd","input":"hi","store":true}`, `"param":"store"`},
		{`{"model":"big-pd","input":"hi","store":false,"tools":[{"type":"web_search"}]}`, `"param":"tools[0].type"`},
	} {
		r := f.post("/v1/responses", "", c.body)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), c.names) {
			t.Errorf("responses %s: %d %s, want a 400 with %s", c.body, r.status, r.body, c.names)
		}
	}
}
