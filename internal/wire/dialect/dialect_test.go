package dialect

import (
	"net/http/httptest"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/wire/usage"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// u is the usage of prompt and completion tokens, estimated or not.
func u(prompt, completion int, estimated bool) usage.Usage {
	return usage.Usage{PromptTokens: prompt, CompletionTokens: completion, Estimated: estimated}
}

func TestDialects(t *testing.T) {
	whole := []struct {
		name string
		d    *Dialect
		body string
		want usage.Usage
	}{
		{"responses", Responses, `{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"hello"}]}],"usage":{"input_tokens":7,"output_tokens":2,"total_tokens":9}}`, u(7, 2, false)},
		{"anthropic", Messages, `{"id":"msg_1","type":"message","content":[{"type":"text","text":"hello"}],"usage":{"input_tokens":5,"output_tokens":3}}`, u(5, 3, false)},
		{"responses estimated", Responses, `{"output":[{"content":[{"text":"12345678"}]}]}`, u(1, 2, true)},
		{"anthropic estimated", Messages, `{"content":[{"type":"text","text":"1234"}]}`, u(1, 1, true)},
	}
	for _, tc := range whole {
		a := Read([]byte(tc.body))
		if u := tc.d.Estimate(&a, "abcd"); u != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, u, tc.want)
		}
	}

	streams := []struct {
		name   string
		d      *Dialect
		events string
		want   usage.Usage
		id     string
	}{
		{"responses", Responses, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_9\",\"usage\":null}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_9\",\"usage\":{\"input_tokens\":11,\"output_tokens\":4}}}\n\n",
			u(11, 4, false), "resp_9"},
		{"anthropic", Messages, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":6,\"output_tokens\":1}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			u(6, 9, false), ""},
		{"anthropic without usage: estimated", Messages, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", u(1, 1, true), ""},
	}
	for _, tc := range streams {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			rec.Header().Set("Content-Type", "text/event-stream")
			w := tc.d.NewWriter(rec, true)
			if _, err := w.Write([]byte(tc.events)); err != nil {
				t.Fatal(err)
			}
			if rec.Body.String() != tc.events {
				t.Fatalf("relayed %q, want it unchanged", rec.Body.String())
			}
			if u := w.Usage("abc"); u != tc.want || w.ResponseID() != tc.id {
				t.Fatalf("usage %+v id %q, want %+v %q", u, w.ResponseID(), tc.want, tc.id)
			}
		})
	}
}
