package cascade

import (
	"errors"
	"slices"
	"testing"
)

func TestLogprobsOf(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    []float64
		wantErr error
	}{
		{
			name: "completions shape",
			body: `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" Paris","logprobs":{"tokens":[" Par","is"],"token_logprobs":[-0.25,-0.5],"top_logprobs":null,"text_offset":[0,4]},"finish_reason":"stop"}]}`,
			want: []float64{-0.25, -0.5},
		},
		{
			name: "completions shape with null entries skipped",
			body: `{"choices":[{"logprobs":{"tokens":["A","B","C"],"token_logprobs":[null,-1.5,-0.5]}}]}`,
			want: []float64{-1.5, -0.5},
		},
		{
			name: "chat shape",
			body: `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"logprobs":{"content":[{"token":"H","logprob":-0.1,"bytes":[72],"top_logprobs":[]},{"token":"i","logprob":-2,"bytes":[105],"top_logprobs":[]}],"refusal":null}}]}`,
			want: []float64{-0.1, -2},
		},
		{
			name: "chat shape on /v1/completions (llama.cpp)",
			body: `{"object":"text_completion","choices":[{"text":"Hi","index":0,"logprobs":{"content":[{"id":39,"token":"Hi","logprob":-0.75,"bytes":[72,105],"top_logprobs":[]}]}}]}`,
			want: []float64{-0.75},
		},
		{
			name: "chat shape with a null logprob skipped",
			body: `{"choices":[{"logprobs":{"content":[{"token":"a","logprob":null},{"token":"b","logprob":-1}]}}]}`,
			want: []float64{-1},
		},
		{
			name: "chat entry without a logprob skipped",
			body: `{"choices":[{"logprobs":{"content":[{"token":"a"},{"token":"b","logprob":-3}]}}]}`,
			want: []float64{-3},
		},
		{
			name: "completions shape wins when both are present",
			body: `{"choices":[{"logprobs":{"token_logprobs":[-1],"content":[{"logprob":-9}]}}]}`,
			want: []float64{-1},
		},
		{
			name: "first choice only",
			body: `{"choices":[{"logprobs":{"token_logprobs":[-1]}},{"logprobs":{"token_logprobs":[-9]}}]}`,
			want: []float64{-1},
		},
		{
			name: "empty answer is an empty list",
			body: `{"choices":[{"text":"","logprobs":{"tokens":[],"token_logprobs":[]}}]}`,
			want: []float64{},
		},
		{name: "logprobs missing", body: `{"choices":[{"text":"x"}]}`, wantErr: ErrNoLogprobs},
		{name: "logprobs null", body: `{"choices":[{"logprobs":null}]}`, wantErr: ErrNoLogprobs},
		{name: "logprobs without either list", body: `{"choices":[{"logprobs":{"content":null}}]}`, wantErr: ErrNoLogprobs},
		{name: "no choices", body: `{"choices":[]}`, wantErr: ErrNoLogprobs},
		{name: "choices missing", body: `{"error":{"message":"boom"}}`, wantErr: ErrNoLogprobs},
		{name: "not JSON", body: `data: {"choices":[]}`, wantErr: ErrMalformedResponse},
		{name: "truncated", body: `{"choices":[{"logprobs":{"token_logprobs":[-1,`, wantErr: ErrMalformedResponse},
		{name: "string logprob", body: `{"choices":[{"logprobs":{"token_logprobs":["-1"]}}]}`, wantErr: ErrMalformedResponse},
		{name: "content not a list", body: `{"choices":[{"logprobs":{"content":{"logprob":-1}}}]}`, wantErr: ErrMalformedResponse},
		{name: "choices not a list", body: `{"choices":{}}`, wantErr: ErrMalformedResponse},
		{name: "content entry not an object", body: `{"choices":[{"logprobs":{"content":[1]}}]}`, wantErr: ErrMalformedResponse},
		{name: "content entry with a string logprob", body: `{"choices":[{"logprobs":{"content":[{"logprob":-1},{"logprob":"x"}]}}]}`, wantErr: ErrMalformedResponse},
		{name: "logprobs not an object", body: `{"choices":[{"logprobs":[-1]}]}`, wantErr: ErrMalformedResponse},
		{name: "choice not an object", body: `{"choices":[3]}`, wantErr: ErrMalformedResponse},
		{name: "top level array", body: `[]`, wantErr: ErrMalformedResponse},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LogprobsOf([]byte(tc.body))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("LogprobsOf error = %v, want %v", err, tc.wantErr)
				}
				if got != nil {
					t.Fatalf("LogprobsOf returned %v with an error", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("LogprobsOf: %v", err)
			}
			if got == nil || !slices.Equal(got, tc.want) {
				t.Fatalf("LogprobsOf = %#v, want %#v", got, tc.want)
			}
		})
	}
}

func FuzzLogprobsOf(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"logprobs":{"token_logprobs":[null,-1]}}]}`,
		`{"choices":[{"logprobs":{"content":[{"logprob":-1},{}]}}]}`,
		`{"choices":[]}`, `[]`, `{"choices":[{"logprobs":{"content":[1]}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := LogprobsOf(body)
		if err != nil {
			if !errors.Is(err, ErrNoLogprobs) && !errors.Is(err, ErrMalformedResponse) {
				t.Fatalf("LogprobsOf(%q): error %v wraps neither sentinel", body, err)
			}
			if got != nil {
				t.Fatalf("LogprobsOf(%q) = %v with error %v", body, got, err)
			}
			return
		}
		if got == nil {
			t.Fatalf("LogprobsOf(%q) = nil without an error", body)
		}
	})
}
