package chatbridge

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/anthropic"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// FuzzBridge feeds the bridge what clients and engines may send: any
// request body of either API that the edge's parser accepts, any whole
// answer, and any stream cut into writes of 1 to 16 bytes. It never
// panics; a request it accepts becomes a chat completions body, valid
// JSON, for the same model and with the same stream flag; an answer it
// translates is valid JSON; and a stream comes out as whole events whose
// data is valid JSON, whatever the cuts.
func FuzzBridge(f *testing.F) {
	f.Add(false, []byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"stream":true}`),
		[]byte(`{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`),
		[]byte(toolStream), uint8(7))
	f.Add(true, []byte(`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"tools":[{"type":"function","name":"f","parameters":{}}]}`),
		[]byte(`{"object":"chat.completion","choices":[{"message":{"tool_calls":[{"id":"t","function":{"name":"f","arguments":"{"}}]},"finish_reason":"tool_calls"}]}`),
		[]byte(chunk(`{"content":"a"}`, "")+"data: {\"error\":{\"message\":\"boom\"}}\n\n"), uint8(1))
	f.Add(true, []byte(`{"model":"m","input":"x","stream":true}`), []byte(`{}`), []byte("event: x\ndata: [DONE]\n\n"), uint8(3))
	f.Add(false, []byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"engine\u0007field":1}`), []byte(`{}`), []byte(""), uint8(0))
	f.Fuzz(func(t *testing.T, responses bool, body, answer, stream []byte, cut uint8) {
		api, parse := Messages, anthropic.ParseRequest
		if responses {
			api, parse = Responses, openai.ParseResponses
		}
		if _, err := parse(body); err != nil {
			return // the edge refuses it before the bridge sees it
		}
		b, chat, err := New(api, body)
		if err != nil {
			return
		}
		if !json.Valid(chat) || !gjson.GetBytes(chat, "messages").IsArray() {
			t.Fatalf("New(%v, %q) = %q: not a chat completions body", api, body, chat)
		}
		if got, want := gjson.GetBytes(chat, "model"), gjson.GetBytes(body, "model"); got.Str != want.Str {
			t.Fatalf("New(%v, %q): model %q, the client's %q", api, body, got.Str, want.Str)
		}
		if got, want := gjson.GetBytes(chat, "stream").Bool(), gjson.GetBytes(body, "stream").Bool(); got != want {
			t.Fatalf("New(%v, %q): stream %v, the client's %v", api, body, got, want)
		}
		for _, status := range []int{200, 400, 503} {
			if out, err := b.Answer(status, answer); err == nil && !json.Valid(out) && (status == 200 || api == Messages) {
				t.Fatalf("Answer(%d, %q) = %q: not valid JSON", status, answer, out)
			}
		}
		rec := httptest.NewRecorder()
		rec.Header().Set("Content-Type", "text/event-stream")
		w := b.Stream(rec)
		n := int(cut%16) + 1
		for rest := stream; len(rest) > 0; {
			k := min(n, len(rest))
			if m, err := w.Write(rest[:k]); err != nil || m != k {
				t.Fatalf("Write: %d, %v", m, err)
			}
			rest = rest[k:]
		}
		out := rec.Body.String()
		if out == "" {
			return
		}
		if !strings.HasSuffix(out, "\n\n") {
			t.Fatalf("stream %q: the client got %q, which ends inside an event", stream, out)
		}
		for _, ev := range strings.Split(strings.TrimSuffix(out, "\n\n"), "\n\n") {
			for line := range strings.SplitSeq(ev, "\n") {
				if d, ok := strings.CutPrefix(line, "data: "); ok && !json.Valid([]byte(d)) {
					t.Fatalf("stream %q: the client got data %q, not JSON, in %q", stream, d, out)
				}
			}
		}
	})
}
