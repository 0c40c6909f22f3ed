package chatbridge

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/anthropic"
)

// Bridge is one request's translation: its API and, for the Responses
// API, the request's members an answer echoes.
type Bridge struct {
	api  API
	echo echo
	id   string // the response id (Responses), made once per request
}

// echo is what a Responses answer repeats of its request.
type echo struct {
	Instructions      json.RawMessage
	MaxOutputTokens   json.RawMessage
	Temperature       json.RawMessage
	TopP              json.RawMessage
	Tools             json.RawMessage
	ToolChoice        json.RawMessage
	ParallelToolCalls json.RawMessage
	Text              json.RawMessage
	Metadata          json.RawMessage
	User              json.RawMessage
}

// New translates a client's body of api into a chat completions body, and
// returns the Bridge that translates the answers back. Refusals are
// *openai.FieldError.
func New(api API, body []byte) (*Bridge, []byte, error) {
	b := &Bridge{api: api}
	var chat []byte
	var err error
	switch api {
	case Messages:
		chat, err = MessagesToChat(body)
	default:
		chat, err = ResponsesToChat(body)
		root := gjson.ParseBytes(body)
		e := &b.echo
		for _, m := range []struct {
			key string
			to  *json.RawMessage
			def string
		}{
			{"instructions", &e.Instructions, "null"}, {"max_output_tokens", &e.MaxOutputTokens, "null"},
			{"temperature", &e.Temperature, "1"}, {"top_p", &e.TopP, "1"}, {"tools", &e.Tools, "[]"},
			{"tool_choice", &e.ToolChoice, `"auto"`}, {"parallel_tool_calls", &e.ParallelToolCalls, "true"},
			{"text", &e.Text, `{"format":{"type":"text"}}`}, {"metadata", &e.Metadata, "{}"}, {"user", &e.User, "null"},
		} {
			if v := root.Get(m.key); v.Exists() && v.Type != gjson.Null {
				*m.to = raw(v)
			} else {
				*m.to = json.RawMessage(m.def)
			}
		}
		b.id = "resp_" + strings.ToLower(rand.Text())
	}
	if err != nil {
		return nil, nil, err
	}
	return b, chat, nil
}

// API is the bridge's client API.
func (b *Bridge) API() API { return b.api }

// Answer translates an engine's whole chat answer: a 200 chat completion
// into the API's answer; an error body (OpenAI's shape) into the API's
// error shape, keeping its message. A 200 answer that is not a chat
// completion is reported as an error.
func (b *Bridge) Answer(status int, body []byte) ([]byte, error) {
	if status != 200 {
		if b.api == Messages {
			msg := gjson.GetBytes(body, "error.message").Str
			if msg == "" {
				msg = strings.TrimSpace(string(body))
			}
			return anthropic.MarshalError(status, msg), nil
		}
		return body, nil // Responses errors are OpenAI's shape
	}
	c := gjson.ParseBytes(body)
	if c.Get("object").Str != "chat.completion" || !c.Get("choices.0").Exists() {
		return nil, ErrNotChat
	}
	if b.api == Messages {
		return json.Marshal(b.message(c))
	}
	return json.Marshal(b.response(c))
}

// elements calls f with each element of v when v is an array: a value of
// another type has none (gjson's ForEach would walk an object's members).
func elements(v gjson.Result, f func(gjson.Result)) {
	if !v.IsArray() {
		return
	}
	v.ForEach(func(_, e gjson.Result) bool {
		f(e)
		return true
	})
}

// ErrNotChat: an engine's 200 answer is not a chat completion.
var ErrNotChat = errors.New("chatbridge: the engine's 200 answer is not a chat completion")

// Anthropic's answer.
type (
	messageJSON struct {
		ID           string             `json:"id"`
		Type         string             `json:"type"`
		Role         string             `json:"role"`
		Model        string             `json:"model"`
		Content      []messageBlockJSON `json:"content"`
		StopReason   *string            `json:"stop_reason"`
		StopSequence *string            `json:"stop_sequence"`
		Usage        messageUsage       `json:"usage"`
	}
	messageBlockJSON struct {
		Type  string          `json:"type"`
		Text  *string         `json:"text,omitempty"`
		ID    string          `json:"id,omitempty"`
		Name  string          `json:"name,omitempty"`
		Input json.RawMessage `json:"input,omitempty"`
	}
	messageUsage struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	}
)

// messageID is the Messages id of a chat completion id.
func messageID(chatID string) string {
	return "msg_" + strings.TrimPrefix(chatID, "chatcmpl-")
}

// matchedStop is the stop string a chat choice says it matched: vLLM's
// stop_reason, SGLang's matched_stop (either may also be a token id).
func matchedStop(ch gjson.Result) gjson.Result {
	if s := ch.Get("stop_reason"); s.Type == gjson.String {
		return s
	}
	return ch.Get("matched_stop")
}

// stopReason maps a chat finish_reason (and the stop string that matched,
// matchedStop) to Anthropic's stop_reason and stop_sequence; tools: the
// message ends in tool_use blocks. Such a message stops for tool_use, as
// Anthropic's do, also where chat says "stop" with no stop string matched
// (OpenAI and vLLM do when the client named the tool to call).
func stopReason(finish string, stop gjson.Result, tools bool) (string, *string) {
	switch finish {
	case "length":
		return "max_tokens", nil
	case "tool_calls", "function_call":
		return "tool_use", nil
	}
	if stop.Type == gjson.String {
		s := stop.Str
		return "stop_sequence", &s
	}
	if tools {
		return "tool_use", nil
	}
	return "end_turn", nil
}

// toolInput is a tool call's arguments as a tool_use block's input: the
// object they hold, else (arguments that are not a JSON object) the
// arguments as a string under "arguments", so that nothing is lost.
func toolInput(args string) json.RawMessage {
	if r := gjson.Parse(args); r.IsObject() && gjson.Valid(args) {
		return json.RawMessage(args)
	}
	b, _ := json.Marshal(map[string]string{"arguments": args})
	return b
}

func (b *Bridge) message(c gjson.Result) messageJSON {
	ch := c.Get("choices.0")
	m := messageJSON{ID: messageID(c.Get("id").Str), Type: "message", Role: "assistant", Model: c.Get("model").Str,
		Content: []messageBlockJSON{}}
	if t := ch.Get("message.content"); t.Str != "" {
		text := t.Str
		m.Content = append(m.Content, messageBlockJSON{Type: "text", Text: &text})
	}
	elements(ch.Get("message.tool_calls"), func(tc gjson.Result) {
		m.Content = append(m.Content, messageBlockJSON{Type: "tool_use", ID: tc.Get("id").Str,
			Name: tc.Get("function.name").Str, Input: toolInput(tc.Get("function.arguments").Str)})
	})
	tools := len(m.Content) > 0 && m.Content[len(m.Content)-1].Type == "tool_use"
	reason, seq := stopReason(ch.Get("finish_reason").Str, matchedStop(ch), tools)
	m.StopReason, m.StopSequence = &reason, seq
	m.Usage = messageUsage{InputTokens: c.Get("usage.prompt_tokens").Int(), OutputTokens: c.Get("usage.completion_tokens").Int()}
	return m
}

// OpenAI's Responses answer.
type (
	responseJSON struct {
		ID                 string          `json:"id"`
		Object             string          `json:"object"`
		CreatedAt          int64           `json:"created_at"`
		Status             string          `json:"status"`
		Error              json.RawMessage `json:"error"`
		IncompleteDetails  json.RawMessage `json:"incomplete_details"`
		Instructions       json.RawMessage `json:"instructions"`
		MaxOutputTokens    json.RawMessage `json:"max_output_tokens"`
		Model              string          `json:"model"`
		Output             []outputItem    `json:"output"`
		ParallelToolCalls  json.RawMessage `json:"parallel_tool_calls"`
		PreviousResponseID *string         `json:"previous_response_id"`
		Store              bool            `json:"store"`
		Temperature        json.RawMessage `json:"temperature"`
		Text               json.RawMessage `json:"text"`
		ToolChoice         json.RawMessage `json:"tool_choice"`
		Tools              json.RawMessage `json:"tools"`
		TopP               json.RawMessage `json:"top_p"`
		Truncation         string          `json:"truncation"`
		Usage              *responseUsage  `json:"usage"`
		User               json.RawMessage `json:"user"`
		Metadata           json.RawMessage `json:"metadata"`
	}
	outputItem struct {
		Type    string           `json:"type"`
		ID      string           `json:"id"`
		Status  string           `json:"status"`
		Role    string           `json:"role,omitempty"`
		Content *[]outputContent `json:"content,omitempty"`
		CallID  string           `json:"call_id,omitempty"`
		Name    string           `json:"name,omitempty"`
		Args    *string          `json:"arguments,omitempty"`
	}
	outputContent struct {
		Type        string          `json:"type"`
		Text        string          `json:"text"`
		Annotations []any           `json:"annotations"`
		Logprobs    json.RawMessage `json:"logprobs"`
	}
	responseUsage struct {
		InputTokens         int64         `json:"input_tokens"`
		InputTokensDetails  cachedDetails `json:"input_tokens_details"`
		OutputTokens        int64         `json:"output_tokens"`
		OutputTokensDetails reasonDetails `json:"output_tokens_details"`
		TotalTokens         int64         `json:"total_tokens"`
	}
	cachedDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	}
	reasonDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	}
)

// itemID is a new output item id with prefix ("msg", "fc").
func itemID(prefix string) string { return prefix + "_" + strings.ToLower(rand.Text()) }

// base is the response object around output, with status.
func (b *Bridge) base(model string, created int64, status string) responseJSON {
	e := b.echo
	return responseJSON{ID: b.id, Object: "response", CreatedAt: created, Status: status,
		Error: json.RawMessage("null"), IncompleteDetails: json.RawMessage("null"),
		Instructions: e.Instructions, MaxOutputTokens: e.MaxOutputTokens, Model: model, Output: []outputItem{},
		ParallelToolCalls: e.ParallelToolCalls, Temperature: e.Temperature, Text: e.Text, ToolChoice: e.ToolChoice,
		Tools: e.Tools, TopP: e.TopP, Truncation: "disabled", User: e.User, Metadata: e.Metadata}
}

// finishStatus is a response's status and incomplete_details for a chat
// finish_reason.
func finishStatus(finish string) (string, json.RawMessage) {
	switch finish {
	case "length":
		return "incomplete", json.RawMessage(`{"reason":"max_output_tokens"}`)
	case "content_filter":
		return "incomplete", json.RawMessage(`{"reason":"content_filter"}`)
	}
	return "completed", json.RawMessage("null")
}

func usageOf(u gjson.Result) *responseUsage {
	if !u.IsObject() {
		return nil
	}
	in, out := u.Get("prompt_tokens").Int(), u.Get("completion_tokens").Int()
	return &responseUsage{InputTokens: in, OutputTokens: out, TotalTokens: in + out,
		InputTokensDetails: cachedDetails{CachedTokens: u.Get("prompt_tokens_details.cached_tokens").Int()}}
}

// logprobsOf is a chat choice's token logprobs as output_text's (the same
// shape), or an empty list.
func logprobsOf(lp gjson.Result) json.RawMessage {
	if c := lp.Get("content"); c.IsArray() {
		return raw(c)
	}
	return json.RawMessage("[]")
}

func (b *Bridge) response(c gjson.Result) responseJSON {
	ch := c.Get("choices.0")
	created := c.Get("created").Int()
	if created == 0 {
		created = time.Now().Unix()
	}
	status, incomplete := finishStatus(ch.Get("finish_reason").Str)
	r := b.base(c.Get("model").Str, created, status)
	r.IncompleteDetails = incomplete
	if t := ch.Get("message.content"); t.Str != "" || !ch.Get("message.tool_calls").IsArray() {
		content := []outputContent{{Type: "output_text", Text: t.Str, Annotations: []any{}, Logprobs: logprobsOf(ch.Get("logprobs"))}}
		r.Output = append(r.Output, outputItem{Type: "message", ID: itemID("msg"), Status: "completed", Role: "assistant", Content: &content})
	}
	elements(ch.Get("message.tool_calls"), func(tc gjson.Result) {
		args := tc.Get("function.arguments").Str
		r.Output = append(r.Output, outputItem{Type: "function_call", ID: itemID("fc"), Status: "completed",
			CallID: tc.Get("id").Str, Name: tc.Get("function.name").Str, Args: &args})
	})
	r.Usage = usageOf(c.Get("usage"))
	return r
}
