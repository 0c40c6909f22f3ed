package test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
)

// TestMessagesWithAnthropicClient: Anthropic's Go client, whole and
// streamed, through the gateway to the reference engine; the key as
// x-api-key too (two different credentials are a 400); the gateway's own
// errors on the path in Anthropic's shape; usage counted from
// input_tokens/output_tokens.
func TestMessagesWithAnthropicClient(t *testing.T) {
	logs := &lockedBuffer{}
	c := limitedCluster(t, newFakeClock(), config.APIKey{TokensPerMinute: 1_000_000}, nil, logs,
		enginesim.Config{ID: "a1", Model: "sim"}, enginesim.Config{ID: "a2", Model: "sim"})
	client := anthropic.NewClient(option.WithBaseURL(c.url+"/"), option.WithAPIKey("key-alice"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	params := anthropic.MessageNewParams{
		Model:     "sim",
		MaxTokens: 8,
		System:    []anthropic.TextBlockParam{{Text: "Answer briefly."}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Tell me about gateways."))},
	}

	msg, err := client.Messages.New(ctx, params, option.WithHeader("X-Client-Request-Id", "msg-whole"))
	if err != nil {
		t.Fatalf("Messages.New: %v", err)
	}
	if len(msg.Content) == 0 || msg.Content[0].Text == "" || msg.Usage.InputTokens == 0 || msg.Usage.OutputTokens == 0 {
		t.Fatalf("message %+v", msg)
	}
	wantLogged(t, logs, "msg-whole", msg.Usage.InputTokens, msg.Usage.OutputTokens)

	stream := client.Messages.NewStreaming(ctx, params, option.WithHeader("X-Client-Request-Id", "msg-stream"))
	var acc anthropic.Message
	var types []string
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		if err := acc.Accumulate(ev); err != nil {
			t.Fatalf("accumulate: %v", err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v (events %v)", err, types)
	}
	_ = stream.Close()
	if len(types) < 4 || types[0] != "message_start" || types[len(types)-1] != "message_stop" {
		t.Fatalf("stream events %v", types)
	}
	if len(acc.Content) == 0 || acc.Content[0].Text == "" || acc.Usage.OutputTokens == 0 || acc.Usage.InputTokens == 0 {
		t.Fatalf("accumulated %+v", acc)
	}
	wantLogged(t, logs, "msg-stream", acc.Usage.InputTokens, acc.Usage.OutputTokens)

	body := `{"model":"sim","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	// x-api-key alone is a credential.
	if r := c.postRaw("/v1/messages", body, "x-api-key", "key-alice"); r.status != http.StatusOK {
		t.Fatalf("x-api-key: %d %s", r.status, r.body)
	}
	// The same key twice is one credential; two different ones are refused.
	if r := c.postRaw("/v1/messages", body, "x-api-key", "key-alice", "Authorization", "Bearer key-alice"); r.status != http.StatusOK {
		t.Fatalf("the same key in both headers: %d %s", r.status, r.body)
	}
	anthropicErr(t, "two credentials", c.postRaw("/v1/messages", body, "x-api-key", "key-alice", "Authorization", "Bearer key-bob"), 400, "invalid_request_error")
	anthropicErr(t, "no key", c.postRaw("/v1/messages", body), 401, "authentication_error")
	anthropicErr(t, "unknown key", c.postRaw("/v1/messages", body, "x-api-key", "nope"), 401, "authentication_error")
	anthropicErr(t, "unknown model", c.postRaw("/v1/messages", strings.Replace(body, `"sim"`, `"nope"`, 1), "x-api-key", "key-alice"), 404, "not_found_error")
	anthropicErr(t, "bad body", c.postRaw("/v1/messages", `{"model":"sim"}`, "x-api-key", "key-alice"), 400, "invalid_request_error")

	// The SDK reads the gateway's error as Anthropic's.
	bad := params
	bad.Model = "nope"
	_, err = client.Messages.New(ctx, bad)
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Message == "" {
		t.Fatalf("unknown model through the SDK: %v", err)
	}
}

// postRaw posts body to path with the header pairs hdr and nothing else.
func (c *cluster) postRaw(path, body string, hdr ...string) reply {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.url+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return c.do(req)
}

// TestMessagesRefusalsAreAnthropicShaped: the refusals written before the
// Messages handler runs, or outside it, are Anthropic-shaped on
// /v1/messages and below, as the handler's own are: a Content-Length over
// max_body_bytes (answered by the body guard, unread) and the same body
// chunked (read by the handler) are both 413 request_too_large; a key
// without the inference scope is 403 permission_error; a GET is 405; a path
// below it that the gateway does not serve (count_tokens) is 404
// not_found_error, with a key or without.
func TestMessagesRefusalsAreAnthropicShaped(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{
		withKeys(config.APIKey{Name: "alice", Key: "key-alice", Scopes: []string{"inference"}},
			config.APIKey{Name: "ops", Key: "key-ops", Scopes: []string{"admin"}}),
		func(c *config.Config) { c.Gateway.MaxBodyBytes = 64 },
	}, enginesim.Config{ID: "a1", Model: "sim"})
	big := `{"model":"sim","max_tokens":4,"messages":[{"role":"user","content":"` + strings.Repeat("x", 200) + `"}]}`
	anthropicErr(t, "Content-Length over max_body_bytes", c.postRaw("/v1/messages", big, "x-api-key", "key-alice"), 413, "request_too_large")
	req, err := http.NewRequest(http.MethodPost, c.url+"/v1/messages", struct{ io.Reader }{strings.NewReader(big)}) // no length: chunked
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-api-key", "key-alice")
	anthropicErr(t, "chunked body over max_body_bytes", c.do(req), 413, "request_too_large")

	small := `{"model":"sim","max_tokens":4,"messages":[]}`
	anthropicErr(t, "key without the inference scope", c.postRaw("/v1/messages", small, "x-api-key", "key-ops"), 403, "permission_error")
	req, err = http.NewRequest(http.MethodGet, c.url+"/v1/messages", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-api-key", "key-alice")
	anthropicErr(t, "GET", c.do(req), 405, "invalid_request_error")
	anthropicErr(t, "count_tokens", c.postRaw("/v1/messages/count_tokens", small, "x-api-key", "key-alice"), 404, "not_found_error")
	anthropicErr(t, "count_tokens without a key", c.postRaw("/v1/messages/count_tokens", small), 404, "not_found_error")

	// Beside it, the shapes stay OpenAI's.
	if r := c.postRaw("/v1/chat/completions", big, "Authorization", "Bearer key-alice"); r.status != 413 || errorCode(t, r.body) != "request_too_large" {
		t.Errorf("chat over max_body_bytes: %d %s, want an OpenAI 413 request_too_large", r.status, r.body)
	}
	if r := c.postRaw("/v1/messagesx", small); r.status != 404 || errorCode(t, r.body) != "not_found" {
		t.Errorf("/v1/messagesx: %d %s, want an OpenAI 404 not_found", r.status, r.body)
	}
}

// TestMessagesMaxTokensZero: Anthropic's max_tokens 0 (the prompt cached,
// nothing generated) is accepted, whole and streamed, through the gateway
// to the reference engine: a message with no content, stop_reason
// max_tokens and no output tokens, its prompt counted.
func TestMessagesMaxTokensZero(t *testing.T) {
	c := newCluster(t, "", nil, enginesim.Config{ID: "a1", Model: "sim"})
	body := `{"model":"sim","max_tokens":0,"messages":[{"role":"user","content":"Warm the cache with this prompt."}]}`
	r := c.postRaw("/v1/messages", body)
	var msg struct {
		Type       string            `json:"type"`
		Content    []json.RawMessage `json:"content"`
		StopReason string            `json:"stop_reason"`
		Usage      struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	if r.status != http.StatusOK || json.Unmarshal(r.body, &msg) != nil {
		t.Fatalf("max_tokens 0: %d %s, want 200 and a message", r.status, r.body)
	}
	if msg.Type != "message" || len(msg.Content) != 0 || msg.StopReason != "max_tokens" || msg.Usage.OutputTokens != 0 || msg.Usage.InputTokens == 0 {
		t.Fatalf("max_tokens 0: %s, want an empty message stopped at max_tokens with its input tokens", r.body)
	}

	r = c.postRaw("/v1/messages", strings.Replace(body, `"max_tokens":0`, `"max_tokens":0,"stream":true`, 1))
	events := string(r.body)
	if r.status != http.StatusOK || !strings.Contains(events, "event: message_stop") ||
		!strings.Contains(events, `"stop_reason":"max_tokens"`) || strings.Contains(events, "content_block_delta") {
		t.Fatalf("max_tokens 0, streamed: %d %s, want a stream with no delta that stops at max_tokens", r.status, r.body)
	}

	// A negative max_tokens is still refused, by the gateway.
	r = c.postRaw("/v1/messages", strings.Replace(body, `"max_tokens":0`, `"max_tokens":-1`, 1))
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "max_tokens") {
		t.Fatalf("max_tokens -1: %d %s, want 400 naming max_tokens", r.status, r.body)
	}
}

// anthropicErr fails t unless r is an Anthropic-shaped error of status
// and error type typ, with a message.
func anthropicErr(t *testing.T, what string, r reply, status int, typ string) {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	if r.status != status || json.Unmarshal(r.body, &e) != nil || e.Type != "error" || e.Error.Type != typ || e.Error.Message == "" {
		t.Fatalf("%s: %d %s, want %d and an Anthropic %s", what, r.status, r.body, status, typ)
	}
}
