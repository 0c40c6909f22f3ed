package dialect

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/wire/usage"
)

func TestFromBodyAndEstimate(t *testing.T) {
	cases := []struct {
		name   string
		body   string
		prompt string
		want   usage.Usage
		ok     bool
	}{
		{"openai chat", `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`, "", u(12, 5, false), true},
		{"completion only", `{"usage":{"completion_tokens":3}}`, "", u(0, 3, false), true},
		{"null usage: estimated", `{"choices":[{"message":{"content":"12345"}}],"usage":null}`, "abcdefgh", u(2, 2, true), false},
		{"no usage, completions text", `{"choices":[{"text":"abcd"},{"text":"efghi"}]}`, "abc", u(1, 3, true), false},
		{"empty usage object: estimated", `{"choices":[],"usage":{}}`, "", u(0, 0, true), false},
		{"negative and huge figures are clamped", `{"usage":{"prompt_tokens":-4,"completion_tokens":99999999999999}}`, "", u(0, 1<<31-1, false), true},
		{"not JSON", `garbage`, "abcd", u(1, 0, true), false},
		{"embeddings", `{"data":[],"usage":{"prompt_tokens":7,"total_tokens":7}}`, "", u(7, 0, false), true},
		{"rerank: total_tokens only", `{"results":[],"usage":{"total_tokens":9}}`, "", u(9, 0, false), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := Read([]byte(tc.body))
			u, ok := OpenAI.Usage(&a)
			if ok != tc.ok || (ok && u != tc.want) {
				t.Fatalf("FromBody = %+v, %v; want %+v, %v", u, ok, tc.want, tc.ok)
			}
			if got := OpenAI.Estimate(&a, tc.prompt); got != tc.want {
				t.Fatalf("Estimate = %+v, want %+v", got, tc.want)
			}
		})
	}
}

const (
	chunkA    = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n"
	chunkB    = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n"
	usageOnly = "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}}\n\n"
	done      = "data: [DONE]\n\n"
	// llama.cpp: usage (and timings) in the final chunk, which has choices.
	llamaFinal = "data: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"delta\":{}}],\"object\":\"chat.completion.chunk\",\"usage\":{\"completion_tokens\":10,\"prompt_tokens\":5,\"total_tokens\":15},\"timings\":{\"prompt_n\":5}}\n\n"
)

func TestWriter(t *testing.T) {
	cases := []struct {
		name     string
		ct       string
		strip    bool
		writes   []string
		wantBody string
		want     usage.Usage
		reported bool
	}{
		{"openai usage chunk, client asked", "text/event-stream", false,
			[]string{chunkA, chunkB + usageOnly + done}, chunkA + chunkB + usageOnly + done, u(7, 2, false), true},
		{"openai usage chunk, stripped", "text/event-stream", true,
			[]string{chunkA, chunkB + usageOnly + done}, chunkA + chunkB + done, u(7, 2, false), true},
		{"usage chunk alone in a write, stripped", "text/event-stream; charset=utf-8", true,
			[]string{chunkA + chunkB, usageOnly, done}, chunkA + chunkB + done, u(7, 2, false), true},
		{"llama.cpp final chunk is kept", "text/event-stream", true,
			[]string{chunkA, llamaFinal, done}, chunkA + llamaFinal + done, u(5, 10, false), true},
		{"no usage: estimated from events", "text/event-stream", true,
			[]string{": keep-alive\n\n", chunkA, chunkB, done}, ": keep-alive\n\n" + chunkA + chunkB + done, u(3, 2, true), false},
		{"CRLF events", "text/event-stream", true,
			[]string{strings.ReplaceAll(chunkA+usageOnly+done, "\n", "\r\n")}, strings.ReplaceAll(chunkA+done, "\n", "\r\n"), u(7, 2, false), true},
		{"usage chunk split across writes is read, not dropped", "text/event-stream", true,
			[]string{chunkA + usageOnly[:20], usageOnly[20:] + done}, chunkA + usageOnly + done, u(7, 2, false), true},
		{"not SSE: passed through unread", "application/json", true,
			[]string{`{"usage":{"prompt_tokens":1}}`}, `{"usage":{"prompt_tokens":1}}`, u(3, 0, true), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			rec.Header().Set("Content-Type", tc.ct)
			w := OpenAI.NewWriter(rec, tc.strip)
			for _, s := range tc.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write = %d, %v; want %d", n, err, len(s))
				}
			}
			if got := rec.Body.String(); got != tc.wantBody {
				t.Fatalf("client got\n%q\nwant\n%q", got, tc.wantBody)
			}
			if got := w.Usage("0123456789"); got != tc.want || w.Reported() != tc.reported {
				t.Fatalf("usage %+v (reported %v), want %+v (%v)", got, w.Reported(), tc.want, tc.reported)
			}
		})
	}
}

func TestWriterUnwrapsForFlush(t *testing.T) {
	rec := httptest.NewRecorder()
	w := OpenAI.NewWriter(rec, false)
	if err := http.NewResponseController(w).Flush(); err != nil || !rec.Flushed {
		t.Fatalf("flush through the Writer: %v, flushed %v", err, rec.Flushed)
	}
}

// nopWriter is a ResponseWriter that discards, for the allocation check.
type nopWriter struct{ h http.Header }

func (n *nopWriter) Header() http.Header         { return n.h }
func (n *nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (n *nopWriter) WriteHeader(int)             {}

func TestWriterDoesNotAllocatePerEvent(t *testing.T) {
	w := OpenAI.NewWriter(&nopWriter{h: http.Header{"Content-Type": {"text/event-stream"}}}, true)
	a, b := []byte(chunkA), []byte(chunkB+usageOnly+": keep-alive\n\n")
	allocs := testing.AllocsPerRun(200, func() {
		_, _ = w.Write(a)
		_, _ = w.Write(b)
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per pair of writes, want 0", allocs)
	}
}

func BenchmarkWriter(b *testing.B) {
	w := OpenAI.NewWriter(&nopWriter{h: http.Header{"Content-Type": {"text/event-stream"}}}, true)
	p := []byte(chunkA)
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		_, _ = w.Write(p)
	}
}

// TestWriterLimit: the stream reports prompt + events so far; the event
// that crosses the budget is replaced by a rate_limit_exceeded event and
// the Write fails, as every later one does.
func TestWriterLimit(t *testing.T) {
	for _, split := range []bool{false, true} {
		rec := httptest.NewRecorder()
		rec.Header().Set("Content-Type", "text/event-stream")
		w := OpenAI.NewWriter(rec, false)
		var got []int
		w.Limit(10, func(n int) bool { got = append(got, n); return n <= 12 })
		ev := "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
		var err error
		if split { // the third event arrives in two writes
			_, _ = w.Write([]byte(ev + ev + ev[:10]))
			_, err = w.Write([]byte(ev[10:] + ev))
		} else {
			_, err = w.Write([]byte(ev + ev + ev + ev))
		}
		if !errors.Is(err, ErrOverBudget) || !w.OverBudget() {
			t.Fatalf("split %v: err %v", split, err)
		}
		if _, err := w.Write([]byte(ev)); !errors.Is(err, ErrOverBudget) {
			t.Fatalf("a write after the cut: %v", err)
		}
		body := rec.Body.String()
		wantEvents := 2
		if split {
			wantEvents = 3 // the split event's start was out: it is ended
		}
		if n := strings.Count(body, `"text":"a"`); n != wantEvents || !strings.HasSuffix(body, "\n\n") ||
			!strings.Contains(body, `"code":"rate_limit_exceeded"`) || !strings.Contains(body, `"type":"rate_limit_error"`) {
			t.Fatalf("split %v: relayed %d events:\n%s", split, n, body)
		}
		if fmt.Sprint(got) != "[11 12 13]" {
			t.Fatalf("split %v: budget asked %v", split, got)
		}
	}
}

// TestWriterLimitResponses: a Responses stream cut at its budget ends with
// the Responses API's error event, numbered one past the last event
// relayed.
func TestWriterLimitResponses(t *testing.T) {
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "text/event-stream")
	w := Responses.NewWriter(rec, false)
	w.Limit(10, func(n int) bool { return n <= 12 })
	ev := func(seq int) string {
		return fmt.Sprintf("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\",\"sequence_number\":%d}\n\n", seq)
	}
	if _, err := w.Write([]byte(ev(0) + ev(1) + ev(2))); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("err %v", err)
	}
	want := ev(0) + ev(1) + "event: error\ndata: {\"type\":\"error\",\"code\":\"rate_limit_exceeded\",\"message\":\"" + overBudgetMsg + "\",\"param\":null,\"sequence_number\":2}\n\n"
	if got := rec.Body.String(); got != want {
		t.Fatalf("client got\n%s\nwant\n%s", got, want)
	}
}

// TestWriterLimitMessages: a Messages stream cut at its budget ends with
// Anthropic's error event, of type rate_limit_error: the event name its
// SDKs read, not OpenAI's nameless data event, which they skip (the
// stream would end as if complete).
func TestWriterLimitMessages(t *testing.T) {
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "text/event-stream")
	w := Messages.NewWriter(rec, false)
	w.Limit(10, func(n int) bool { return n <= 12 })
	ev := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n"
	if _, err := w.Write([]byte(ev + ev + ev)); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("err %v", err)
	}
	want := ev + ev + "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"" + overBudgetMsg + "\"}}\n\n"
	if got := rec.Body.String(); got != want {
		t.Fatalf("client got\n%s\nwant\n%s", got, want)
	}
}
