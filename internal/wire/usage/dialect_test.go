package usage

import (
	"net/http/httptest"
	"testing"
)

func TestDialects(t *testing.T) {
	whole := []struct {
		name string
		d    Dialect
		body string
		want Usage
	}{
		{"responses", Responses, `{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"hello"}]}],"usage":{"input_tokens":7,"output_tokens":2,"total_tokens":9}}`, Usage{7, 2, false}},
		{"anthropic", Anthropic, `{"id":"msg_1","type":"message","content":[{"type":"text","text":"hello"}],"usage":{"input_tokens":5,"output_tokens":3}}`, Usage{5, 3, false}},
		{"responses estimated", Responses, `{"output":[{"content":[{"text":"12345678"}]}]}`, Usage{1, 2, true}},
		{"anthropic estimated", Anthropic, `{"content":[{"type":"text","text":"1234"}]}`, Usage{1, 1, true}},
	}
	for _, tc := range whole {
		if u := EstimateOf(tc.d, []byte(tc.body), "abcd"); u != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, u, tc.want)
		}
	}

	streams := []struct {
		name   string
		d      Dialect
		events string
		want   Usage
		id     string
	}{
		{"responses", Responses, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_9\",\"usage\":null}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_9\",\"usage\":{\"input_tokens\":11,\"output_tokens\":4}}}\n\n",
			Usage{11, 4, false}, "resp_9"},
		{"anthropic", Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":6,\"output_tokens\":1}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			Usage{6, 9, false}, ""},
		{"anthropic without usage: estimated", Anthropic, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", Usage{1, 1, true}, ""},
	}
	for _, tc := range streams {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			rec.Header().Set("Content-Type", "text/event-stream")
			w := NewWriterFor(rec, true, tc.d)
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
