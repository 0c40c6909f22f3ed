package dialect

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/sse"
	"github.com/tlgate/tlgate/internal/wire/usage"
)

// ErrOverBudget is Write's error once the stream's budget refused more
// tokens: the Writer wrote the rate_limit_exceeded event in place of the
// event that crossed it, and the stream should end.
var ErrOverBudget = errors.New("dialect: the stream crossed its key's tokens budget")

// overBudgetMsg says why a stream was cut at its key's tokens budget.
const overBudgetMsg = "The key's tokens per minute debt limit was reached while streaming; the response is incomplete."

// overBudgetEvent ends a stream cut at its key's tokens budget.
var overBudgetEvent = openai.MarshalSSEError(http.StatusTooManyRequests, openai.CodeRateLimitExceeded, overBudgetMsg)

// maxCarry bounds the bytes of an event split across writes that the
// Writer keeps to read it whole; past it the rest of the stream is relayed
// unread.
const maxCarry = 64 << 10

var (
	usageKey       = []byte(`"usage"`)
	doneData       = []byte("[DONE]")
	responseCreate = []byte(`"response.created"`)
)

// Writer wraps the client's ResponseWriter of a streamed answer of a
// dialect and reads, from the server-sent events written through it, the
// usage (the last usage object wins: OpenAI's usage chunk, llama.cpp's
// final chunk, a Responses stream's response.completed, Anthropic's
// message_start and message_delta), a Responses stream's response id and
// its sequence numbers. With strip set (OpenAI's streams) it also drops
// usage-only events (an empty "choices" and a usage object: the chunk
// stream_options include_usage adds) from what reaches the client, for a
// client that did not ask for them. Everything else passes through
// unchanged; a body that is not text/event-stream passes through unread.
//
// The proxy's relay frames the stream and hands it over whole events with
// their spans (WriteEvents, sse.EventWriter), which the Writer reads in
// place without framing them again; Write frames what it is given itself,
// reading an event split across writes once it is complete (it is never
// dropped). Write reports the whole input as written even when it dropped
// an event. Flush and deadlines reach the wrapped writer through Unwrap
// (http.ResponseController). A Writer serves one stream, from one
// goroutine; read Usage once the stream is over.
type Writer struct {
	w      http.ResponseWriter
	strip  bool
	d      *Dialect
	respID string // Responses: the stream's response id
	seq    int64  // Responses: the sequence number after the events read

	checked bool // the Content-Type was looked at
	sse     bool

	found     bool
	usage     usage.Usage
	events    int  // data events other than [DONE] and usage-only ones
	usageOnly bool // the event just read is an OpenAI usage-only chunk

	// Write's framing: the bytes of the event in progress (written
	// already) and the scanner over them; blind once an event outgrew
	// maxCarry.
	pending []byte
	sc      sse.Scanner
	blind   bool

	// prompt and use: the budget (Limit); over: it refused.
	prompt int
	use    func(tokens int) bool
	over   bool
}

// NewWriter wraps w for a stream of dialect d; strip applies to OpenAI's
// streams only (the other dialects' usage is part of their own events).
func (d *Dialect) NewWriter(w http.ResponseWriter, strip bool) *Writer {
	return &Writer{w: w, strip: strip && d == OpenAI, d: d}
}

// Limit makes the stream report its running usage to use after each data
// event: the last usage object's total, else prompt plus the data events
// so far. When use reports false the event that crossed is not relayed:
// the Writer writes one rate_limit_exceeded error event instead, and this
// and every later Write fail with ErrOverBudget.
func (s *Writer) Limit(prompt int, use func(tokens int) bool) {
	s.prompt, s.use = prompt, use
}

// withinBudget asks the budget about the usage so far.
func (s *Writer) withinBudget() bool {
	if s.use == nil {
		return true
	}
	n := s.prompt + s.events
	if s.found {
		n = max(n, s.usage.Total())
	}
	return s.use(n)
}

// Header is the wrapped writer's.
func (s *Writer) Header() http.Header { return s.w.Header() }

// WriteHeader passes to the wrapped writer.
func (s *Writer) WriteHeader(code int) { s.w.WriteHeader(code) }

// Unwrap returns the wrapped writer, for http.ResponseController.
func (s *Writer) Unwrap() http.ResponseWriter { return s.w }

// isSSE reports whether the answer is an event stream (its Content-Type,
// looked at once).
func (s *Writer) isSSE() bool {
	if !s.checked {
		s.checked = true
		s.sse = sse.IsEventStream(s.w.Header().Get("Content-Type"))
	}
	return s.sse
}

// WriteEvents reads and writes whole blocks framed by the relay: events
// are p's events (sse.EventWriter).
func (s *Writer) WriteEvents(p []byte, events []sse.Event) (int, error) {
	if s.over {
		return 0, ErrOverBudget
	}
	if !s.isSSE() || s.blind {
		return s.w.Write(p)
	}
	if err := s.relay(p, 0, events); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Write frames p, reads its events and writes them, less any dropped ones.
func (s *Writer) Write(p []byte) (int, error) {
	if s.over {
		return 0, ErrOverBudget
	}
	if !s.isSSE() || s.blind {
		return s.w.Write(p)
	}
	from := len(s.pending) // the bytes before it were written already
	s.pending = append(s.pending, p...)
	end, _, _ := s.sc.Scan(s.pending)
	if err := s.relay(s.pending, from, s.sc.Take()); err != nil {
		return 0, err
	}
	switch {
	case s.sc.Bad: // not SSE after all: the rest goes unread
		s.blind = true
	case end > 0:
		s.pending = s.pending[:copy(s.pending, s.pending[end:])]
		s.sc.Shift(end)
	}
	if len(s.pending) > maxCarry {
		s.blind, s.pending = true, nil
	}
	return len(p), nil
}

// relay reads the events of b and writes b[from:] less the events it
// drops. An event that starts before from was written already (its
// start): it is read but never dropped.
func (s *Writer) relay(b []byte, from int, events []sse.Event) error {
	kept := from
	for _, ev := range events {
		before, seq := s.events, s.seq
		drop := s.event(ev.Data(b))
		carried := ev.Start < from
		if s.events != before && !s.withinBudget() {
			if carried { // its start is out: end it before the error event
				return s.cut(b[kept:ev.End])
			}
			s.seq = seq // the event is not relayed
			return s.cut(b[kept:ev.Start])
		}
		if drop && !carried {
			if kept < ev.Start {
				if _, err := s.w.Write(b[kept:ev.Start]); err != nil {
					return err
				}
			}
			kept = ev.End
		}
	}
	if kept < len(b) {
		if _, err := s.w.Write(b[kept:]); err != nil {
			return err
		}
	}
	return nil
}

// cut ends the stream at its budget: it writes head (the events before the
// one that crossed) and the error event.
func (s *Writer) cut(head []byte) error {
	s.over = true
	if len(head) > 0 {
		if _, err := s.w.Write(head); err != nil {
			return err
		}
	}
	ev := overBudgetEvent
	if s.d.budgetEvent != nil {
		ev = s.d.budgetEvent(s.seq)
	}
	if _, err := s.w.Write(ev); err != nil {
		return err
	}
	return ErrOverBudget
}

// OverBudget reports whether the stream was cut at its budget.
func (s *Writer) OverBudget() bool { return s.over }

// event reads the data of one whole event (nil: none, or several data
// lines) and reports whether to drop the event.
func (s *Writer) event(data []byte) bool {
	if data == nil || bytes.Equal(data, doneData) {
		return false
	}
	// gjson reads a string view of data without copying it: only numbers
	// and existence leave the readers, never a string into data (the
	// response id is cloned).
	js := unsafe.String(unsafe.SliceData(data), len(data))
	s.d.streamEvent(s, js, data)
	return s.strip && s.usageOnly
}

// openAIEvent reads an OpenAI stream's data event: a usage object (the
// last one wins), and whether the event is usage-only.
func openAIEvent(s *Writer, js string, data []byte) {
	s.usageOnly = false
	if !bytes.Contains(data, usageKey) {
		s.events++
		return
	}
	u, ok := usage.FromOpenAI(gjson.Get(js, "usage"))
	if !ok {
		s.events++
		return
	}
	s.usage, s.found = u, true
	s.usageOnly = !gjson.Get(js, "choices.0").Exists()
	if !s.usageOnly {
		s.events++
	}
}

// responsesEvent reads a Responses stream's data event: its sequence
// number, the response id of response.created, and the usage inside
// response.completed's "response".
func responsesEvent(s *Writer, js string, data []byte) {
	s.usageOnly = false
	s.events++
	s.seq = openai.NextSequenceNumber(data, s.seq)
	if s.respID == "" && bytes.Contains(data, responseCreate) {
		if id := gjson.Get(js, "response.id"); id.Type == gjson.String {
			s.respID = strings.Clone(id.Str)
		}
	}
	if !bytes.Contains(data, usageKey) {
		return
	}
	if u, ok := usage.FromInputOutput(gjson.Get(js, "response.usage")); ok {
		s.usage, s.found = u, true
	}
}

// messagesEvent reads an Anthropic stream's data event: the input in
// message_start's "message.usage", the output so far in each
// message_delta's "usage".
func messagesEvent(s *Writer, js string, data []byte) {
	s.usageOnly = false
	s.events++
	if !bytes.Contains(data, usageKey) {
		return
	}
	switch gjson.Get(js, "type").Str {
	case "message_start":
		if u, ok := usage.FromInputOutput(gjson.Get(js, "message.usage")); ok {
			s.usage, s.found = u, true
		}
	case "message_delta":
		u := gjson.Get(js, "usage")
		if !u.IsObject() {
			return
		}
		if out := u.Get("output_tokens"); out.Exists() {
			s.usage.CompletionTokens, s.found = usage.Clamp(out.Int()), true
		}
		if in := u.Get("input_tokens"); in.Exists() && in.Int() > 0 {
			s.usage.PromptTokens, s.found = usage.Clamp(in.Int()), true
		}
	}
}

// ResponseID returns the id of the response a Responses stream announced
// in its response.created event ("" if none was seen).
func (s *Writer) ResponseID() string { return s.respID }

// Sequence returns the sequence number after the events read (a
// Responses stream's).
func (s *Writer) Sequence() int64 { return s.seq }

// Reported reports whether the stream carried a usage object.
func (s *Writer) Reported() bool { return s.found }

// Usage returns the stream's usage: the last usage object it carried, or
// an estimate from prompt (the rendered prompt) and the number of data
// events relayed.
func (s *Writer) Usage(prompt string) usage.Usage {
	if s.found {
		return s.usage
	}
	return usage.Usage{PromptTokens: usage.EstimatePrompt(prompt), CompletionTokens: s.events, Estimated: true}
}
