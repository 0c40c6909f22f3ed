// Package chatbridge speaks OpenAI's Responses API and Anthropic's
// Messages API to clients over engines spoken to in chat completions: it
// translates a client's request into a chat completions body, and the
// engine's chat answer (whole, or streamed as chunks) back into the
// client's API, errors included. The gateway uses it where it must drive
// engines over chat completions itself: the prefill and decode legs of a
// disaggregated pair (vLLM's kv_transfer_params and SGLang's bootstrap
// rooms are chat and completions fields).
//
// What chat completions cannot carry is refused with an error naming the
// field (hosted tools, file ids, stored items), never dropped in silence;
// what only tunes the hosted API (metadata, service_tier, truncation,
// thinking budgets) is left out. Fields neither API defines go to the
// engine as they are: engines' own sampling fields work as on chat.
package chatbridge

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// API is a client API the bridge translates.
type API int

// The APIs.
const (
	// Messages is Anthropic's Messages API (POST /v1/messages).
	Messages API = iota + 1
	// Responses is OpenAI's Responses API (POST /v1/responses).
	Responses
)

// Of returns the API of a request's dialect (dialect.Of), and false for
// one the bridge does not translate.
func Of(d *dialect.Dialect) (API, bool) {
	switch d {
	case dialect.Messages:
		return Messages, true
	case dialect.Responses:
		return Responses, true
	}
	return 0, false
}

// String names the API as its path does.
func (a API) String() string {
	if a == Messages {
		return dialect.PathMessages
	}
	return dialect.PathResponses
}

// ChatPath is the engine path the translated requests go to.
const ChatPath = "/v1/chat/completions"

// chatMessage is one message of a chat completions body.
type chatMessage struct {
	Role       string          `json:"role"`
	Content    any             `json:"content"` // string, []chatPart, or nil beside tool calls
	ToolCalls  []chatToolCall  `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	Name       json.RawMessage `json:"name,omitempty"`
}

type chatPart struct {
	Type     string    `json:"type"`
	Text     *string   `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
}

type imageURL struct {
	URL    string          `json:"url"`
	Detail json.RawMessage `json:"detail,omitempty"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatTool struct {
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name        string          `json:"name"`
	Description json.RawMessage `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      json.RawMessage `json:"strict,omitempty"`
}

// chatBody is a chat completions body being built: the members in the
// order they are written.
type chatBody struct {
	keys []string
	vals map[string]json.RawMessage
}

func (b *chatBody) set(k string, v any) {
	raw, ok := v.(json.RawMessage)
	if !ok {
		var err error
		if raw, err = json.Marshal(v); err != nil {
			panic(fmt.Sprintf("chatbridge: %s: %v", k, err)) // only the package's own types are set
		}
	}
	if b.vals == nil {
		b.vals = map[string]json.RawMessage{}
	}
	if _, seen := b.vals[k]; !seen {
		b.keys = append(b.keys, k)
	}
	b.vals[k] = raw
}

// drop removes member k, if set.
func (b *chatBody) drop(k string) {
	if _, ok := b.vals[k]; !ok {
		return
	}
	delete(b.vals, k)
	for i, key := range b.keys {
		if key == k {
			b.keys = append(b.keys[:i], b.keys[i+1:]...)
			break
		}
	}
}

// with is the body with its messages (the leading system messages
// merged, leadingSystem), less what only tools give meaning to when no
// tool is sent (engines refuse a tool_choice without tools).
func (b *chatBody) with(msgs []chatMessage) []byte {
	if _, ok := b.vals["tools"]; !ok {
		b.drop("tool_choice")
		b.drop("parallel_tool_calls")
	}
	if msgs == nil {
		msgs = []chatMessage{} // an array, which the engine judges
	}
	b.set("messages", leadingSystem(msgs))
	return b.bytes()
}

func (b *chatBody) bytes() []byte {
	out := []byte{'{'}
	for i, k := range b.keys {
		if i > 0 {
			out = append(out, ',')
		}
		out = gjson.AppendJSONString(out, k)
		out = append(out, ':')
		out = append(out, b.vals[k]...)
	}
	return append(out, '}')
}

// raw is a member's JSON as sent.
func raw(v gjson.Result) json.RawMessage { return json.RawMessage(v.Raw) }

// fieldErr is a refusal naming the field in the API's notation.
func fieldErr(param, format string, args ...any) *openai.FieldError {
	return &openai.FieldError{Param: param, Msg: fmt.Sprintf(format, args...)}
}

// stream asks a streamed chat answer for its usage chunk, which the
// client's API reports at the end of every stream.
func (b *chatBody) stream(on bool) {
	if !on {
		return
	}
	b.set("stream", true)
	b.set("stream_options", map[string]bool{"include_usage": true})
}

// MessagesToChat translates a Messages body (checked by
// anthropic.ParseRequest) into a chat completions body. Fields are named
// in Anthropic's dotted notation.
func MessagesToChat(body []byte) ([]byte, error) {
	var out chatBody
	var msgs []chatMessage
	var ferr *openai.FieldError
	gjson.ParseBytes(body).ForEach(func(k, v gjson.Result) bool {
		switch key := k.Str; key {
		case "model", "temperature", "top_p", "top_k", "cache_salt":
			out.set(key, raw(v))
		case "max_tokens":
			out.set("max_tokens", raw(v))
		case "stream":
			out.stream(v.Bool())
		case "stop_sequences":
			out.set("stop", raw(v))
		case "system":
			if v.Type == gjson.Null {
				break
			}
			var text string
			if text, ferr = blocksText(v, "system"); ferr == nil {
				msgs = append([]chatMessage{{Role: "system", Content: text}}, msgs...)
			}
		case "messages":
			var ms []chatMessage
			if ms, ferr = anthropicMessages(v); ferr == nil {
				msgs = append(msgs, ms...)
			}
		case "tools":
			var tools []chatTool
			if tools, ferr = anthropicTools(v); ferr == nil && len(tools) > 0 {
				out.set("tools", tools)
			}
		case "tool_choice":
			ferr = anthropicToolChoice(&out, v)
		case "metadata":
			if u := v.Get("user_id"); u.Type == gjson.String {
				out.set("user", u.Str)
			}
		case "thinking", "service_tier":
			// the hosted API's own tuning; chat completions has none
		case "container", "mcp_servers":
			ferr = fieldErr(key, "%s needs Anthropic's hosted tools, which engines served over chat completions do not run", key)
		default:
			out.set(key, raw(v)) // an engine's own field
		}
		return ferr == nil
	})
	if ferr != nil {
		return nil, ferr
	}
	prefill(&out, msgs)
	return out.with(msgs), nil
}

// prefill asks the engine to continue a final assistant message of text,
// as Anthropic's API does (a prefill: the answer goes on from its last
// word, such as "{" to force JSON), instead of opening a new assistant
// turn after it: vLLM's continue_final_message, without a generation
// prompt. A client's own value of either field is kept.
func prefill(out *chatBody, msgs []chatMessage) {
	if len(msgs) == 0 {
		return
	}
	last := msgs[len(msgs)-1]
	if last.Role != "assistant" || len(last.ToolCalls) > 0 || last.Content == nil {
		return
	}
	_, cont := out.vals["continue_final_message"]
	_, gen := out.vals["add_generation_prompt"]
	if cont || gen {
		return
	}
	out.set("continue_final_message", true)
	out.set("add_generation_prompt", false)
}

// blocksText is the text of a string or of an array of text blocks.
func blocksText(v gjson.Result, param string) (string, *openai.FieldError) {
	if v.Type == gjson.String {
		return v.Str, nil
	}
	var b strings.Builder
	var ferr *openai.FieldError
	i := 0
	v.ForEach(func(_, blk gjson.Result) bool {
		if t := blk.Get("type").Str; t != "text" {
			ferr = fieldErr(fmt.Sprintf("%s.%d.type", param, i), "only text blocks can be sent here, not %q", t)
			return false
		}
		b.WriteString(blk.Get("text").Str)
		i++
		return true
	})
	return b.String(), ferr
}

// anthropicMessages translates a Messages "messages" array: text and
// image blocks become content parts, an assistant's tool_use blocks its
// tool calls, a user's tool_result blocks tool messages before the rest
// of its content, thinking blocks are left out (chat completions has no
// place for a model's earlier reasoning).
func anthropicMessages(v gjson.Result) ([]chatMessage, *openai.FieldError) {
	var out []chatMessage
	var ferr *openai.FieldError
	i := 0
	v.ForEach(func(_, m gjson.Result) bool {
		param := fmt.Sprintf("messages.%d", i)
		i++
		role := m.Get("role").Str
		content := m.Get("content")
		if content.Type == gjson.String {
			out = append(out, chatMessage{Role: role, Content: content.Str})
			return true
		}
		msg := chatMessage{Role: role}
		var parts []chatPart
		var tools []chatMessage
		j := 0
		content.ForEach(func(_, blk gjson.Result) bool {
			bp := fmt.Sprintf("%s.content.%d", param, j)
			j++
			switch t := blk.Get("type").Str; t {
			case "text":
				text := blk.Get("text").Str
				parts = append(parts, chatPart{Type: "text", Text: &text})
			case "image":
				var url string
				if url, ferr = imageSource(blk.Get("source"), bp+".source"); ferr != nil {
					return false
				}
				parts = append(parts, chatPart{Type: "image_url", ImageURL: &imageURL{URL: url}})
			case "tool_use":
				if role != "assistant" {
					ferr = fieldErr(bp+".type", "tool_use blocks belong in assistant messages")
					return false
				}
				input := blk.Get("input").Raw
				if input == "" {
					input = "{}"
				}
				msg.ToolCalls = append(msg.ToolCalls, chatToolCall{ID: blk.Get("id").Str, Type: "function",
					Function: chatFunction{Name: blk.Get("name").Str, Arguments: input}})
			case "tool_result":
				var text string
				if c := blk.Get("content"); c.Exists() && c.Type != gjson.Null {
					if text, ferr = blocksText(c, bp+".content"); ferr != nil {
						return false
					}
				}
				tools = append(tools, chatMessage{Role: "tool", ToolCallID: blk.Get("tool_use_id").Str, Content: text})
			case "thinking", "redacted_thinking":
			default:
				ferr = fieldErr(bp+".type", "content blocks of type %q cannot be sent to engines served over chat completions (text, image, tool_use and tool_result can)", t)
				return false
			}
			return true
		})
		if ferr != nil {
			return false
		}
		out = append(out, tools...)
		if len(parts) > 0 || len(msg.ToolCalls) > 0 || len(tools) == 0 {
			msg.Content = flatten(parts)
			out = append(out, msg)
		}
		return true
	})
	return out, ferr
}

// flatten is parts as chat content: nil for none, the text for text parts
// only (how engines' chat templates read content best), else the parts.
func flatten(parts []chatPart) any {
	if len(parts) == 0 {
		return nil
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return parts
		}
		b.WriteString(*p.Text)
	}
	return b.String()
}

// imageSource is an image block's source as an image_url: a data URL for
// base64 data, else its URL.
func imageSource(src gjson.Result, param string) (string, *openai.FieldError) {
	switch t := src.Get("type").Str; t {
	case "base64":
		return "data:" + src.Get("media_type").Str + ";base64," + src.Get("data").Str, nil
	case "url":
		return src.Get("url").Str, nil
	default:
		return "", fieldErr(param+".type", "image sources of type %q cannot be sent to engines served over chat completions (base64 and url can)", t)
	}
}

// anthropicTools translates Messages tools (name, description,
// input_schema) into chat function tools.
func anthropicTools(v gjson.Result) ([]chatTool, *openai.FieldError) {
	var out []chatTool
	var ferr *openai.FieldError
	i := 0
	v.ForEach(func(_, t gjson.Result) bool {
		if typ := t.Get("type").Str; typ != "" && typ != "custom" {
			ferr = fieldErr(fmt.Sprintf("tools.%d.type", i), "tools of type %q are Anthropic's hosted tools, which engines served over chat completions do not run", typ)
			return false
		}
		out = append(out, chatTool{Type: "function", Function: toolFunction{Name: t.Get("name").Str,
			Description: optRaw(t.Get("description")), Parameters: optRaw(t.Get("input_schema"))}})
		i++
		return true
	})
	return out, ferr
}

// optRaw is a member's JSON, or nil when it is absent.
func optRaw(v gjson.Result) json.RawMessage {
	if !v.Exists() {
		return nil
	}
	return raw(v)
}

// anthropicToolChoice translates a Messages tool_choice.
func anthropicToolChoice(out *chatBody, v gjson.Result) *openai.FieldError {
	if v.Type == gjson.Null {
		return nil
	}
	switch t := v.Get("type").Str; t {
	case "auto", "none":
		out.set("tool_choice", t)
	case "any":
		out.set("tool_choice", "required")
	case "tool":
		out.set("tool_choice", map[string]any{"type": "function", "function": map[string]string{"name": v.Get("name").Str}})
	default:
		return fieldErr("tool_choice.type", "tool_choice of type %q is not one of auto, any, tool and none", t)
	}
	if v.Get("disable_parallel_tool_use").Bool() {
		out.set("parallel_tool_calls", false)
	}
	return nil
}

// ResponsesToChat translates a Responses body (checked by
// openai.ParseResponses) into a chat completions body. A request that
// continues a stored response (previous_response_id), or asks to be
// stored, background or a hosted prompt or conversation, is refused: an
// engine served over chat completions stores nothing.
func ResponsesToChat(body []byte) ([]byte, error) {
	var out chatBody
	var system []chatMessage
	var msgs []chatMessage
	var ferr *openai.FieldError
	gjson.ParseBytes(body).ForEach(func(k, v gjson.Result) bool {
		switch key := k.Str; key {
		case "model", "temperature", "top_p", "parallel_tool_calls", "user", "cache_salt", "seed":
			out.set(key, raw(v))
		case "max_output_tokens":
			if v.Type != gjson.Null {
				out.set("max_tokens", raw(v))
			}
		case "top_logprobs":
			if v.Type != gjson.Null && v.Int() > 0 {
				out.set("logprobs", true)
				out.set("top_logprobs", raw(v))
			}
		case "stream":
			out.stream(v.Bool())
		case "instructions":
			if v.Str != "" {
				system = []chatMessage{{Role: "system", Content: v.Str}}
			}
		case "input":
			msgs, ferr = responsesInput(v)
		case "tools":
			var tools []chatTool
			if tools, ferr = responsesTools(v); ferr == nil && len(tools) > 0 {
				out.set("tools", tools)
			}
		case "tool_choice":
			ferr = responsesToolChoice(&out, v)
		case "text":
			ferr = responsesFormat(&out, v.Get("format"))
		case "reasoning":
			if e := v.Get("effort"); e.Type == gjson.String {
				out.set("reasoning_effort", e.Str)
			}
		case "store":
			if v.Bool() {
				ferr = fieldErr(key, "the engines, driven over chat completions, store nothing: send store false, or leave it out")
			}
		case "previous_response_id":
			if v.Type != gjson.Null {
				ferr = fieldErr(key, "the engines, driven over chat completions, store no response to continue: send the conversation so far in input")
			}
		case "background", "prompt", "conversation":
			if v.Type != gjson.Null && v.Type != gjson.False {
				ferr = fieldErr(key, "%s needs responses stored by the engine, and the engines, driven over chat completions, store nothing", key)
			}
		case "metadata", "truncation", "include", "service_tier", "prompt_cache_key", "safety_identifier", "max_tool_calls":
			// the hosted API's own bookkeeping; chat completions has none
		default:
			out.set(key, raw(v)) // an engine's own field
		}
		return ferr == nil
	})
	if ferr != nil {
		return nil, ferr
	}
	return out.with(append(system, msgs...)), nil
}

// responsesInput translates a Responses input: a string is one user
// message; items are messages (developer as system), function calls
// (consecutive ones as one assistant message's tool calls) and their
// outputs (tool messages); a function call joins the assistant message
// before it (the text that announced it, or the calls beside it), as one
// chat turn; reasoning items are left out.
func responsesInput(v gjson.Result) ([]chatMessage, *openai.FieldError) {
	if v.Type == gjson.String {
		return []chatMessage{{Role: "user", Content: v.Str}}, nil
	}
	var out []chatMessage
	var ferr *openai.FieldError
	i := 0
	v.ForEach(func(_, it gjson.Result) bool {
		param := fmt.Sprintf("input[%d]", i)
		i++
		typ := it.Get("type").Str
		if typ == "" && it.Get("role").Exists() {
			typ = "message"
		}
		switch typ {
		case "message":
			role := it.Get("role").Str
			if role == "developer" {
				role = "system"
			}
			var content any
			if content, ferr = responsesContent(it.Get("content"), param+".content"); ferr != nil {
				return false
			}
			out = append(out, chatMessage{Role: role, Content: content})
		case "function_call":
			call := chatToolCall{ID: it.Get("call_id").Str, Type: "function",
				Function: chatFunction{Name: it.Get("name").Str, Arguments: it.Get("arguments").Str}}
			if n := len(out); n > 0 && out[n-1].Role == "assistant" {
				out[n-1].ToolCalls = append(out[n-1].ToolCalls, call)
			} else {
				out = append(out, chatMessage{Role: "assistant", ToolCalls: []chatToolCall{call}})
			}
		case "function_call_output":
			o := it.Get("output")
			text := o.Str
			if o.IsArray() {
				var c any
				if c, ferr = responsesContent(o, param+".output"); ferr != nil {
					return false
				}
				var ok bool
				if text, ok = c.(string); !ok {
					ferr = fieldErr(param+".output", "a function call's output can only be text here: a chat completions tool message carries no images")
					return false
				}
			}
			out = append(out, chatMessage{Role: "tool", ToolCallID: it.Get("call_id").Str, Content: text})
		case "reasoning":
		default:
			ferr = fieldErr(param+".type", "input items of type %q cannot be sent to engines served over chat completions (message, function_call and function_call_output can)", typ)
			return false
		}
		return true
	})
	return out, ferr
}

// leadingSystem merges the system messages a conversation opens with
// (instructions, then developer or system items) into one, their texts
// joined by a blank line: many chat templates take one system message,
// first.
func leadingSystem(msgs []chatMessage) []chatMessage {
	n := 0
	for n < len(msgs) && msgs[n].Role == "system" {
		if _, ok := msgs[n].Content.(string); !ok {
			break
		}
		n++
	}
	if n < 2 {
		return msgs
	}
	texts := make([]string, n)
	for i := range n {
		texts[i] = msgs[i].Content.(string)
	}
	msgs[n-1].Content = strings.Join(texts, "\n\n")
	return msgs[n-1:]
}

// responsesContent is a message's content as chat content: a string, or
// its text parts joined, or its parts with images.
func responsesContent(v gjson.Result, param string) (any, *openai.FieldError) {
	if v.Type == gjson.String {
		return v.Str, nil
	}
	var parts []chatPart
	var ferr *openai.FieldError
	i := 0
	v.ForEach(func(_, p gjson.Result) bool {
		pp := fmt.Sprintf("%s[%d]", param, i)
		i++
		switch t := p.Get("type").Str; t {
		case "input_text", "output_text", "text":
			text := p.Get("text").Str
			parts = append(parts, chatPart{Type: "text", Text: &text})
		case "refusal":
			text := p.Get("refusal").Str
			parts = append(parts, chatPart{Type: "text", Text: &text})
		case "input_image":
			u := p.Get("image_url")
			if u.Type != gjson.String {
				ferr = fieldErr(pp+".image_url", "images must be given by image_url here: file ids name files an engine served over chat completions does not have")
				return false
			}
			parts = append(parts, chatPart{Type: "image_url", ImageURL: &imageURL{URL: u.Str, Detail: optRaw(p.Get("detail"))}})
		default:
			ferr = fieldErr(pp+".type", "content parts of type %q cannot be sent to engines served over chat completions (input_text, output_text and input_image can)", t)
			return false
		}
		return true
	})
	if ferr != nil {
		return nil, ferr
	}
	if c := flatten(parts); c != nil {
		return c, nil
	}
	return "", nil
}

// responsesTools translates Responses function tools (name, description,
// parameters and strict at the top) into chat function tools.
func responsesTools(v gjson.Result) ([]chatTool, *openai.FieldError) {
	var out []chatTool
	var ferr *openai.FieldError
	i := 0
	v.ForEach(func(_, t gjson.Result) bool {
		if typ := t.Get("type").Str; typ != "function" {
			ferr = fieldErr(fmt.Sprintf("tools[%d].type", i), "tools of type %q are OpenAI's hosted tools, which engines served over chat completions do not run (function tools can be sent)", typ)
			return false
		}
		out = append(out, chatTool{Type: "function", Function: toolFunction{Name: t.Get("name").Str,
			Description: optRaw(t.Get("description")), Parameters: optRaw(t.Get("parameters")), Strict: optRaw(t.Get("strict"))}})
		i++
		return true
	})
	return out, ferr
}

// responsesToolChoice translates a Responses tool_choice.
func responsesToolChoice(out *chatBody, v gjson.Result) *openai.FieldError {
	if v.Type == gjson.Null {
		return nil
	}
	if v.Type == gjson.String {
		out.set("tool_choice", v.Str)
		return nil
	}
	if v.Get("type").Str != "function" {
		return fieldErr("tool_choice", "tool_choice can be a string or a function here, not %s", v.Raw)
	}
	out.set("tool_choice", map[string]any{"type": "function", "function": map[string]string{"name": v.Get("name").Str}})
	return nil
}

// responsesFormat translates text.format into chat's response_format.
func responsesFormat(out *chatBody, f gjson.Result) *openai.FieldError {
	switch t := f.Get("type").Str; t {
	case "", "text":
	case "json_object":
		out.set("response_format", map[string]string{"type": "json_object"})
	case "json_schema":
		schema := map[string]json.RawMessage{"name": optRaw(f.Get("name")), "schema": optRaw(f.Get("schema"))}
		for _, k := range []string{"description", "strict"} {
			if r := f.Get(k); r.Exists() {
				schema[k] = raw(r)
			}
		}
		for k, r := range schema {
			if r == nil {
				delete(schema, k)
			}
		}
		out.set("response_format", map[string]any{"type": "json_schema", "json_schema": schema})
	default:
		return fieldErr("text.format.type", "text.format of type %q is not one of text, json_object and json_schema", t)
	}
	return nil
}
