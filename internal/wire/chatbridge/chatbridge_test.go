package chatbridge

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// TestRequests: each API's body as chat completions, member by member
// (gjson paths into the chat body and the JSON they must hold), and the
// refusals, naming the field.
func TestRequests(t *testing.T) {
	cases := []struct {
		name  string
		api   API
		body  string
		want  map[string]string // gjson path → raw JSON
		param string            // a refusal's field
	}{
		{
			name: "messages: system, text, sampling, stream asks usage", api: Messages,
			body: `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"Be "},{"type":"text","text":"terse."}],"messages":[{"role":"user","content":"hi"}],"stop_sequences":["X"],"top_k":3,"stream":true,"seed":7,"metadata":{"user_id":"u1"},"thinking":{"type":"enabled","budget_tokens":9}}`,
			want: map[string]string{"model": `"m"`, "max_tokens": "5", "stop": `["X"]`, "top_k": "3", "seed": "7", "user": `"u1"`, "thinking": "",
				"messages.0": `{"role":"system","content":"Be terse."}`, "messages.1": `{"role":"user","content":"hi"}`,
				"stream": "true", "stream_options": `{"include_usage":true}`},
		},
		{
			name: "messages: images, tool use and results, thinking left out", api: Messages,
			body: `{"model":"m","max_tokens":5,"messages":[
				{"role":"user","content":[{"type":"text","text":"see"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAA"}}]},
				{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"calling"},{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"42"}]},{"type":"text","text":"so?"}]}],
				"tools":[{"name":"f","description":"d","input_schema":{"type":"object"}}],"tool_choice":{"type":"any","disable_parallel_tool_use":true}}`,
			want: map[string]string{
				"messages.0.content": `[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAA"}}]`,
				"messages.1":         `{"role":"assistant","content":"calling","tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}`,
				"messages.2":         `{"role":"tool","content":"42","tool_call_id":"t1"}`,
				"messages.3":         `{"role":"user","content":"so?"}`,
				"tools":              `[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"}}}]`,
				"tool_choice":        `"required"`, "parallel_tool_calls": "false",
			},
		},
		{
			name: "messages: a final assistant message is a prefill the answer continues", api: Messages,
			body: `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"JSON please"},{"role":"assistant","content":[{"type":"text","text":"{"}]}]}`,
			want: map[string]string{"messages.1": `{"role":"assistant","content":"{"}`, "continue_final_message": "true", "add_generation_prompt": "false"},
		},
		{
			name: "messages: a client's own add_generation_prompt is kept", api: Messages,
			body: `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"{"}],"add_generation_prompt":true}`,
			want: map[string]string{"add_generation_prompt": "true", "continue_final_message": ""},
		},
		{
			name: "messages: no prefill after a user message or a tool call", api: Messages,
			body: `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}]}`,
			want: map[string]string{"continue_final_message": "", "add_generation_prompt": ""},
		},
		{name: "messages: a document block", api: Messages, param: "messages.0.content.0.type",
			body: `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`},
		{name: "messages: a hosted tool", api: Messages, param: "tools.0.type",
			body: `{"model":"m","max_tokens":5,"messages":[],"tools":[{"type":"web_search_20250305","name":"w"}]}`},
		{
			name: "responses: instructions, items, tools, format", api: Responses,
			body: `{"model":"m","instructions":"Be terse.","max_output_tokens":9,"top_logprobs":2,"store":false,"metadata":{"k":"v"},"input":[
				{"role":"developer","content":"rules"},
				{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
				{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
				{"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},
				{"type":"function_call_output","call_id":"c1","output":"1"},
				{"type":"reasoning","summary":[]}],
				"tools":[{"type":"function","name":"f","parameters":{"type":"object"},"strict":true}],"tool_choice":{"type":"function","name":"f"},
				"text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"}}}}`,
			want: map[string]string{"max_tokens": "9", "logprobs": "true", "top_logprobs": "2", "store": "", "metadata": "",
				"messages.0": `{"role":"system","content":"Be terse.\n\nrules"}`,
				"messages.1": `{"role":"user","content":"ab"}`,
				"messages.2": `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"{}"}}]}`,
				"messages.3": `{"role":"tool","content":"1","tool_call_id":"c1"}`, "messages.4": "",
				"tools":       `[{"type":"function","function":{"name":"f","parameters":{"type":"object"},"strict":true}}]`,
				"tool_choice": `{"function":{"name":"f"},"type":"function"}`, "response_format": `{"json_schema":{"name":"s","schema":{"type":"object"}},"type":"json_schema"}`,
			},
		},
		{
			name: "responses: a call joins the text that announced it; tool_choice without tools left out", api: Responses,
			body: `{"model":"m","tool_choice":"auto","parallel_tool_calls":false,"tools":[],"input":[{"role":"user","content":"q"},
				{"type":"message","role":"assistant","content":[{"type":"output_text","text":"let me check"}]},
				{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"42"}]}]}`,
			want: map[string]string{"tool_choice": "", "parallel_tool_calls": "", "tools": "",
				"messages.1": `{"role":"assistant","content":"let me check","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}`,
				"messages.2": `{"role":"tool","content":"42","tool_call_id":"c1"}`, "messages.3": ""},
		},
		{name: "messages: tool_choice null, no tools", api: Messages, body: `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"}],"tool_choice":null}`,
			want: map[string]string{"tool_choice": ""}},
		{name: "responses: tool_choice null", api: Responses, body: `{"model":"m","input":"x","tool_choice":null}`,
			want: map[string]string{"tool_choice": ""}},
		{name: "responses: an image as a function's output", api: Responses, param: "input[0].output",
			body: `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"see"},{"type":"input_image","image_url":"http://x"}]}]}`},
		{name: "responses: store", api: Responses, param: "store", body: `{"model":"m","input":"x","store":true}`},
		{name: "responses: previous_response_id", api: Responses, param: "previous_response_id", body: `{"model":"m","input":"x","previous_response_id":"resp_1"}`},
		{name: "responses: a file input", api: Responses, param: "input[0].content[0].type",
			body: `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`},
		{name: "responses: an item reference", api: Responses, param: "input[1].type",
			body: `{"model":"m","input":[{"role":"user","content":"x"},{"type":"item_reference","id":"i"}]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, chat, err := New(c.api, []byte(c.body))
			if c.param != "" {
				var fe *openai.FieldError
				if !errors.As(err, &fe) || fe.Param != c.param || fe.Msg == "" {
					t.Fatalf("got %s %v, want a refusal naming %s", chat, err, c.param)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !gjson.ValidBytes(chat) {
				t.Fatalf("not JSON: %s", chat)
			}
			if _, err := openai.ParseRequest(chat, true); err != nil {
				t.Fatalf("the chat body %s does not parse as chat: %v", chat, err)
			}
			for path, want := range c.want {
				if got := gjson.GetBytes(chat, path).Raw; got != want {
					t.Errorf("%s = %s, want %s\n(body %s)", path, got, want, chat)
				}
			}
		})
	}
}

// TestAnswers: a chat completion as each API's answer, and an engine's
// error in each API's shape.
func TestAnswers(t *testing.T) {
	chat := `{"id":"chatcmpl-9","object":"chat.completion","created":100,"model":"m","choices":[{"index":0,
		"message":{"role":"assistant","content":"hello","tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},{"id":"t2","type":"function","function":{"name":"g","arguments":"oops"}}]},
		"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":4}}}`
	b, _, err := New(Messages, []byte(`{"model":"m","max_tokens":5,"messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Answer(200, []byte(chat))
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"id": `"msg_9"`, "type": `"message"`, "role": `"assistant"`, "model": `"m"`, "stop_reason": `"tool_use"`, "stop_sequence": "null",
		"content.0": `{"type":"text","text":"hello"}`, "content.1": `{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}`,
		"content.2.input": `{"arguments":"oops"}`, "usage": `{"input_tokens":7,"output_tokens":3}`,
	} {
		if g := gjson.GetBytes(got, path).Raw; g != want {
			t.Errorf("messages %s = %s, want %s", path, g, want)
		}
	}
	stopped := strings.Replace(chat, `"finish_reason":"tool_calls"`, `"finish_reason":"stop","stop_reason":"END"`, 1)
	if got, _ := b.Answer(200, []byte(stopped)); gjson.GetBytes(got, "stop_reason").Str != "stop_sequence" || gjson.GetBytes(got, "stop_sequence").Str != "END" {
		t.Errorf("a matched stop string: %s", got)
	}
	e, _ := b.Answer(400, []byte(`{"error":{"message":"too long","type":"BadRequestError","code":400}}`))
	if gjson.GetBytes(e, "type").Str != "error" || gjson.GetBytes(e, "error.type").Str != "invalid_request_error" || gjson.GetBytes(e, "error.message").Str != "too long" {
		t.Errorf("messages error %s", e)
	}
	if _, err := b.Answer(200, []byte(`{"object":"text_completion","choices":[{}]}`)); !errors.Is(err, ErrNotChat) {
		t.Errorf("a completion answered %v, want ErrNotChat", err)
	}

	b, _, err = New(Responses, []byte(`{"model":"m","input":"x","instructions":"I","temperature":0.5}`))
	if err != nil {
		t.Fatal(err)
	}
	length := strings.Replace(chat, `"finish_reason":"tool_calls"`, `"finish_reason":"length"`, 1)
	got, err = b.Answer(200, []byte(length))
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"object": `"response"`, "status": `"incomplete"`, "incomplete_details": `{"reason":"max_output_tokens"}`, "created_at": "100",
		"instructions": `"I"`, "temperature": "0.5", "top_p": "1", "store": "false", "previous_response_id": "null",
		"output.0.type": `"message"`, "output.0.content.0.text": `"hello"`, "output.1.type": `"function_call"`, "output.1.call_id": `"t1"`,
		"output.1.arguments": `"{\"a\":1}"`, "output.2.name": `"g"`,
		"usage": `{"input_tokens":7,"input_tokens_details":{"cached_tokens":4},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":10}`,
	} {
		if g := gjson.GetBytes(got, path).Raw; g != want {
			t.Errorf("responses %s = %s, want %s", path, g, want)
		}
	}
	if id := gjson.GetBytes(got, "id").Str; !strings.HasPrefix(id, "resp_") {
		t.Errorf("response id %q", id)
	}
}

// chunk is a chat stream chunk's data event.
func chunk(delta, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `data: {"id":"chatcmpl-5","object":"chat.completion.chunk","created":100,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + "}]}\n\n"
}

const usageChunk = `data: {"id":"chatcmpl-5","object":"chat.completion.chunk","created":100,"model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}` + "\n\n"

// events reads an API stream back: each event's name and data.
func events(t *testing.T, s string) (names []string, data []gjson.Result) {
	t.Helper()
	for _, blk := range strings.Split(strings.TrimSuffix(s, "\n\n"), "\n\n") {
		lines := strings.Split(blk, "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "event: ") || !strings.HasPrefix(lines[1], "data: ") {
			t.Fatalf("not an event: %q in\n%s", blk, s)
		}
		d := strings.TrimPrefix(lines[1], "data: ")
		if !gjson.Valid(d) {
			t.Fatalf("data not JSON: %s", d)
		}
		names = append(names, strings.TrimPrefix(lines[0], "event: "))
		data = append(data, gjson.Parse(d))
	}
	return names, data
}

// relay writes stream to a bridge's Stream in pieces of n bytes (events
// split across writes) and returns what the client got.
func relay(t *testing.T, b *Bridge, stream string, n int) string {
	t.Helper()
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "text/event-stream")
	w := b.Stream(rec)
	for len(stream) > 0 {
		k := min(n, len(stream))
		if m, err := w.Write([]byte(stream[:k])); err != nil || m != k {
			t.Fatalf("write: %d %v", m, err)
		}
		stream = stream[k:]
	}
	return rec.Body.String()
}

// toolStream is a chat stream of text (with token logprobs), then a tool
// call in three chunks, then its usage.
var toolStream = chunk(`{"role":"assistant","content":""}`, "") +
	strings.Replace(chunk(`{"content":"hel"}`, ""), `"finish_reason"`, `"logprobs":{"content":[{"token":"hel","logprob":-0.5,"bytes":[104,101,108],"top_logprobs":[]}]},"finish_reason"`, 1) +
	strings.Replace(chunk(`{"content":"lo"}`, ""), `"finish_reason"`, `"logprobs":{"content":[{"token":"lo","logprob":-0.25,"bytes":[108,111],"top_logprobs":[]}]},"finish_reason"`, 1) +
	chunk(`{"tool_calls":[{"index":0,"id":"t1","type":"function","function":{"name":"f","arguments":""}}]}`, "") +
	chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":"}}]}`, "") +
	chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}`, "") +
	chunk(`{}`, "tool_calls") + usageChunk + "data: [DONE]\n\n"

func TestStreamMessages(t *testing.T) {
	b, _, _ := New(Messages, []byte(`{"model":"m","max_tokens":5,"messages":[]}`))
	for _, n := range []int{1, 7, 1 << 20} {
		names, data := events(t, relay(t, b, toolStream, n))
		want := "message_start content_block_start content_block_delta content_block_delta content_block_stop content_block_start content_block_delta content_block_stop message_delta message_stop"
		if got := strings.Join(names, " "); got != want {
			t.Fatalf("pieces of %d: events %s, want %s", n, got, want)
		}
		for i, w := range map[int]string{
			0: `{"message":{"id":"msg_5","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}},"type":"message_start"}`,
			2: `{"delta":{"text":"hel","type":"text_delta"},"index":0,"type":"content_block_delta"}`,
			5: `{"content_block":{"type":"tool_use","id":"t1","name":"f","input":{}},"index":1,"type":"content_block_start"}`,
			6: `{"delta":{"partial_json":"{\"a\":1}","type":"input_json_delta"},"index":1,"type":"content_block_delta"}`,
			8: `{"delta":{"stop_reason":"tool_use","stop_sequence":null},"type":"message_delta","usage":{"input_tokens":7,"output_tokens":3}}`,
		} {
			if data[i].Raw != w {
				t.Errorf("event %d (%s) = %s, want %s", i, names[i], data[i].Raw, w)
			}
		}
	}
}

func TestStreamResponses(t *testing.T) {
	b, _, _ := New(Responses, []byte(`{"model":"m","input":"x"}`))
	for _, n := range []int{1, 7, 1 << 20} {
		names, data := events(t, relay(t, b, toolStream, n))
		want := "response.created response.in_progress response.output_item.added response.content_part.added response.output_text.delta response.output_text.delta " +
			"response.output_text.done response.content_part.done response.output_item.done response.output_item.added response.function_call_arguments.delta response.function_call_arguments.delta " +
			"response.function_call_arguments.done response.output_item.done response.completed"
		if got := strings.Join(names, " "); got != want {
			t.Fatalf("pieces of %d: events %s, want %s", n, got, want)
		}
		for i, d := range data {
			if d.Get("sequence_number").Int() != int64(i) || d.Get("type").Str != names[i] {
				t.Errorf("event %d: %s", i, d.Raw)
			}
		}
		last := data[len(data)-1].Get("response")
		for path, w := range map[string]string{
			"status": `"completed"`, "output.0.content.0.text": `"hello"`, "output.1.arguments": `"{\"a\":1}"`, "output.1.call_id": `"t1"`,
			"usage.input_tokens": "7", "usage.output_tokens": "3",
		} {
			if g := last.Get(path).Raw; g != w {
				t.Errorf("response.completed %s = %s, want %s", path, g, w)
			}
		}
		if data[0].Get("response.id").Str != last.Get("id").Str || data[12].Get("arguments").Str != `{"a":1}` || data[7].Get("part.text").Str != "hello" {
			t.Errorf("ids or texts differ: %s / %s", data[0].Raw, last.Raw)
		}
		if data[5].Get("logprobs.0.logprob").Float() != -0.25 || last.Get("output.0.content.0.logprobs.#").Int() != 2 || data[6].Get("logprobs.1.token").Str != "lo" {
			t.Errorf("token logprobs: delta %s, done %s, completed %s", data[5].Raw, data[6].Raw, last.Get("output.0.content.0").Raw)
		}
	}
}

// TestStreamMessagesInterleavedCalls: two tool calls whose arguments
// chat interleaves are two whole tool_use blocks, each with its own
// input; a matched stop string does not hide the tool_use stop reason.
func TestStreamMessagesInterleavedCalls(t *testing.T) {
	b, _, _ := New(Messages, []byte(`{"model":"m","max_tokens":5,"messages":[]}`))
	stream := chunk(`{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\":"}},{"index":1,"id":"b","type":"function","function":{"name":"g","arguments":"{\"y\":"}}]}`, "") +
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"1}"}},{"index":1,"function":{"arguments":"2}"}}]}`, "") +
		strings.Replace(chunk(`{}`, "tool_calls"), `"finish_reason"`, `"stop_reason":"</s>","finish_reason"`, 1) + "data: [DONE]\n\n"
	names, data := events(t, relay(t, b, stream, 3))
	if got := strings.Join(names, " "); got != "message_start content_block_start content_block_delta content_block_stop content_block_start content_block_delta content_block_stop message_delta message_stop" {
		t.Fatalf("events %s", got)
	}
	if data[1].Get("content_block.id").Str != "a" || data[2].Get("delta.partial_json").Str != `{"x":1}` ||
		data[4].Get("content_block.name").Str != "g" || data[5].Get("delta.partial_json").Str != `{"y":2}` || data[5].Get("index").Int() != 1 {
		t.Errorf("blocks: %v", data)
	}
	if d := data[7].Get("delta"); d.Get("stop_reason").Str != "tool_use" || d.Get("stop_sequence").Type != gjson.Null {
		t.Errorf("message_delta %s, want tool_use and no stop_sequence", data[7].Raw)
	}
}

// TestStreamErrors: an error event in the chat stream (the engine's, or
// the gateway's after a cut) is the API's error event, its message kept
// (and, for Messages, a rate limit typed as one), and nothing is written
// after it.
func TestStreamErrors(t *testing.T) {
	failed := chunk(`{"content":"hel"}`, "") + `data: {"error":{"message":"engine went away","type":"server_error","code":"upstream_failed"}}` + "\n\n" + "data: [DONE]\n\n"
	b, _, _ := New(Messages, []byte(`{"model":"m","max_tokens":5,"messages":[]}`))
	names, data := events(t, relay(t, b, failed, 5))
	if n := len(names); names[n-1] != "error" || data[n-1].Get("error.message").Str != "engine went away" || data[n-1].Get("error.type").Str != "api_error" || names[n-2] != "content_block_delta" {
		t.Errorf("messages: %v %v", names, data)
	}
	b, _, _ = New(Responses, []byte(`{"model":"m","input":"x"}`))
	names, data = events(t, relay(t, b, failed, 5))
	if n := len(names); names[n-1] != "error" || data[n-1].Get("code").Str != "upstream_failed" || data[n-1].Get("message").Str != "engine went away" || data[n-1].Get("sequence_number").Int() != int64(n-1) {
		t.Errorf("responses: %v %v", names, data)
	}
	// The gateway's cut at the key's tokens budget is a rate limit, as
	// Anthropic types it: a client retries later, not as for a fault.
	cut := chunk(`{"content":"hel"}`, "") + `data: {"error":{"message":"budget","type":"rate_limit_error","code":"rate_limit_exceeded"}}` + "\n\n"
	b, _, _ = New(Messages, []byte(`{"model":"m","max_tokens":5,"messages":[]}`))
	names, data = events(t, relay(t, b, cut, 5))
	if n := len(names); names[n-1] != "error" || data[n-1].Get("error.type").Str != "rate_limit_error" || data[n-1].Get("error.message").Str != "budget" {
		t.Errorf("messages cut at the budget: %v %v", names, data)
	}
}

// TestStreamNotSSE: an answer that is not an event stream passes as it is.
func TestStreamNotSSE(t *testing.T) {
	b, _, _ := New(Messages, []byte(`{"model":"m","max_tokens":5,"messages":[]}`))
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "application/json")
	w := b.Stream(rec)
	if _, err := w.Write([]byte(`{"x":1}`)); err != nil || rec.Body.String() != `{"x":1}` {
		t.Fatalf("%q %v", rec.Body.String(), err)
	}
	var _ http.ResponseWriter = w
}

// TestToolCallsNotAList: an engine's tool_calls that is not a list (an
// object here) makes no tool blocks, whole or streamed, in either API.
func TestToolCallsNotAList(t *testing.T) {
	const calls = `{"id":"t1","type":"function","function":{"name":"f","arguments":"{}"}}`
	whole := `{"id":"chatcmpl-9","object":"chat.completion","created":100,"model":"m","choices":[{"index":0,
		"message":{"role":"assistant","content":"hello","tool_calls":` + calls + `},"finish_reason":"stop"}]}`
	stream := chunk(`{"content":"hi"}`, "") + chunk(`{"tool_calls":`+calls+`}`, "") + chunk(`{}`, "stop") + usageChunk + "data: [DONE]\n\n"
	for _, tc := range []struct {
		api  API
		body string
	}{{Messages, `{"model":"m","max_tokens":5,"messages":[]}`}, {Responses, `{"model":"m","input":"x"}`}} {
		b, _, err := New(tc.api, []byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		got, err := b.Answer(200, []byte(whole))
		if err != nil {
			t.Fatal(err)
		}
		tool := func(s string) bool { return strings.Contains(s, "tool_use") || strings.Contains(s, "function_call") }
		if tool(string(got)) {
			t.Errorf("%v answer %s: a tool block made of an object", tc.api, got)
		}
		if out := relay(t, b, stream, 5); tool(out) {
			t.Errorf("%v stream %s: a tool block made of an object", tc.api, out)
		}
	}
}

// TestNamedToolStopsForToolUse: a message that ends in tool calls stops
// for tool_use, whole and streamed, also when chat says "stop", as OpenAI
// and vLLM do for a tool the client named (Anthropic's tool_choice
// {"type":"tool"}); an agent loop that waits for tool_use runs the tool.
// Text alone still ends the turn.
func TestNamedToolStopsForToolUse(t *testing.T) {
	req := []byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"}}`)
	call := `{"role":"assistant","content":null,"tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}`
	for _, tc := range []struct {
		name, message, want string
	}{
		{"a named tool", call, "tool_use"},
		{"text", `{"role":"assistant","content":"hello"}`, "end_turn"},
	} {
		b, _, err := New(Messages, req)
		if err != nil {
			t.Fatal(err)
		}
		whole := `{"id":"chatcmpl-9","object":"chat.completion","created":100,"model":"m","choices":[{"index":0,"message":` + tc.message + `,"finish_reason":"stop"}]}`
		got, err := b.Answer(200, []byte(whole))
		if err != nil || gjson.GetBytes(got, "stop_reason").Str != tc.want {
			t.Errorf("%s, whole: %s %v, want stop_reason %s", tc.name, got, err, tc.want)
		}
		delta := gjson.Get(tc.message, `@this`).Raw
		if tc.want == "tool_use" {
			delta = `{"tool_calls":[{"index":0,"id":"t1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}`
		}
		b, _, _ = New(Messages, req)
		names, data := events(t, relay(t, b, chunk(delta, "")+chunk(`{}`, "stop")+"data: [DONE]\n\n", 7))
		if n := len(names); n < 2 || names[n-2] != "message_delta" || data[n-2].Get("delta.stop_reason").Str != tc.want {
			t.Errorf("%s, streamed: %v %v, want stop_reason %s", tc.name, names, data, tc.want)
		}
	}
}
