package usage

import (
	"bytes"
	"errors"
	"mime"
	"net/http"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/openai"
)

// ErrOverBudget is Write's error once the stream's budget refused more
// tokens: the Writer wrote the rate_limit_exceeded event in place of the
// event that crossed it, and the stream should end.
var ErrOverBudget = errors.New("usage: the stream crossed its key's tokens budget")

// overBudgetMsg says why a stream was cut at its key's tokens budget.
const overBudgetMsg = "The key's tokens per minute debt limit was reached while streaming; the response is incomplete."

// overBudgetEvent ends a stream cut at its key's tokens budget.
var overBudgetEvent = openai.MarshalSSEError(http.StatusTooManyRequests, openai.CodeRateLimitExceeded, overBudgetMsg)

// maxCarry bounds the bytes of an event split across writes that the
// Writer keeps to read it whole; a larger one is relayed but not read.
const maxCarry = 64 << 10

var (
	usageKey  = []byte(`"usage"`)
	dataField = []byte("data:")
	doneData  = []byte("[DONE]")
)

// Writer wraps the client's ResponseWriter of a streamed answer and reads
// the usage from the server-sent events written through it: the last
// event whose data holds a "usage" object wins (OpenAI's usage chunk, or
// llama.cpp's final chunk). With strip set it also drops usage-only events
// (an empty "choices" and a usage object: the chunk stream_options
// include_usage adds) from what reaches the client, for a client that did
// not ask for them. Everything else passes through unchanged; a body that is
// not text/event-stream passes through unread.
//
// It reads each Write in place, allocating nothing for events that arrive
// whole (the proxy writes whole events); only an event split across writes
// is copied to be read once complete, and it is never dropped. Write
// reports the whole input as written even when it dropped an event. Flush
// and deadlines reach the wrapped writer through Unwrap
// (http.ResponseController). A Writer serves one stream, from one
// goroutine; read Usage once the stream is over.
type Writer struct {
	w      http.ResponseWriter
	strip  bool
	d      Dialect
	respID string // Responses: the stream's response id
	seq    int64  // Responses: the sequence number after the events read

	checked bool // the Content-Type was looked at
	sse     bool

	found  bool
	usage  Usage
	events int // data events other than [DONE] and usage-only ones

	carry   []byte // the start of an event split across writes
	tooLong bool   // the carried event went over maxCarry

	// prompt and use: the budget (Limit); over: it refused.
	prompt int
	use    func(tokens int) bool
	over   bool
}

// NewWriter wraps w; strip drops usage-only events.
func NewWriter(w http.ResponseWriter, strip bool) *Writer {
	return &Writer{w: w, strip: strip}
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

// NewWriterFor wraps w for a stream of dialect d; strip applies to OpenAI
// streams only (the other dialects' usage is part of their own events).
func NewWriterFor(w http.ResponseWriter, strip bool, d Dialect) *Writer {
	return &Writer{w: w, strip: strip && d == OpenAI, d: d}
}

// Header is the wrapped writer's.
func (s *Writer) Header() http.Header { return s.w.Header() }

// WriteHeader passes to the wrapped writer.
func (s *Writer) WriteHeader(code int) { s.w.WriteHeader(code) }

// Unwrap returns the wrapped writer, for http.ResponseController.
func (s *Writer) Unwrap() http.ResponseWriter { return s.w }

// Write reads the events in p and writes them, less any dropped ones.
func (s *Writer) Write(p []byte) (int, error) {
	if !s.checked {
		s.checked = true
		mt, _, err := mime.ParseMediaType(s.w.Header().Get("Content-Type"))
		s.sse = err == nil && mt == "text/event-stream"
	}
	if s.over {
		return 0, ErrOverBudget
	}
	if !s.sse {
		return s.w.Write(p)
	}
	// kept is the start of the bytes not yet written; start the start of
	// the current event.
	kept, start := 0, 0
	for start < len(p) {
		end := eventEnd(p, start)
		if end < 0 {
			break
		}
		var drop bool
		before, seq := s.events, s.seq
		carried := len(s.carry) > 0 || s.tooLong
		if carried {
			s.joinCarry(p[start:end])
		} else {
			drop = s.event(p[start:end])
		}
		if s.events != before && !s.withinBudget() {
			if carried { // its start is out: end it before the error event
				return s.cut(p[kept:end])
			}
			s.seq = seq // the event is not relayed
			return s.cut(p[kept:start])
		}
		if drop {
			if kept < start {
				if _, err := s.w.Write(p[kept:start]); err != nil {
					return 0, err
				}
			}
			kept = end
		}
		start = end
	}
	if start < len(p) {
		s.keep(p[start:])
	}
	if kept < len(p) {
		if _, err := s.w.Write(p[kept:]); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// cut ends the stream at its budget: it writes head (the events before the
// one that crossed) and the error event.
func (s *Writer) cut(head []byte) (int, error) {
	s.over = true
	if len(head) > 0 {
		if _, err := s.w.Write(head); err != nil {
			return 0, err
		}
	}
	ev := overBudgetEvent
	if s.d == Responses {
		ev = openai.ResponsesErrorEvent(openai.CodeRateLimitExceeded, overBudgetMsg, s.seq)
	}
	if _, err := s.w.Write(ev); err != nil {
		return 0, err
	}
	return 0, ErrOverBudget
}

// OverBudget reports whether the stream was cut at its budget.
func (s *Writer) OverBudget() bool { return s.over }

// keep carries the start of an event split across writes.
func (s *Writer) keep(b []byte) {
	if s.tooLong || len(s.carry)+len(b) > maxCarry {
		s.carry, s.tooLong = s.carry[:0], true
		return
	}
	s.carry = append(s.carry, b...)
}

// joinCarry ends a split event with b and reads it (never dropping it: its
// start is already written).
func (s *Writer) joinCarry(b []byte) {
	if !s.tooLong && len(s.carry)+len(b) <= maxCarry {
		s.carry = append(s.carry, b...)
		s.event(s.carry)
	}
	s.carry, s.tooLong = s.carry[:0], false
}

// eventEnd returns the index after the blank line that ends the event
// starting at from, or -1 when p holds no complete event from there.
func eventEnd(p []byte, from int) int {
	lineStart := from
	for {
		i := bytes.IndexByte(p[lineStart:], '\n')
		if i < 0 {
			return -1
		}
		line := p[lineStart : lineStart+i]
		next := lineStart + i + 1
		if len(line) == 0 || (len(line) == 1 && line[0] == '\r') {
			if lineStart > from {
				return next
			}
			// A blank line before any field: an empty block; skip it.
			from = next
		}
		lineStart = next
	}
}

// event reads one whole event and reports whether to drop it.
func (s *Writer) event(ev []byte) bool {
	data := dataOf(ev)
	if data == nil || bytes.Equal(data, doneData) {
		return false
	}
	// gjson reads a string view of data without copying it: only numbers
	// and existence leave this function, never a string into data (the
	// response id is cloned).
	js := unsafe.String(unsafe.SliceData(data), len(data))
	if s.d != OpenAI {
		s.streamUsage(js, data)
		return false
	}
	if !bytes.Contains(data, usageKey) {
		s.events++
		return false
	}
	u, ok := fromUsage(gjson.Get(js, "usage"))
	if !ok {
		s.events++
		return false
	}
	s.usage, s.found = u, true
	usageOnly := !gjson.Get(js, "choices.0").Exists()
	if !usageOnly {
		s.events++
	}
	return s.strip && usageOnly
}

// dataOf returns the data of an event with one data line (the only kind
// engines send JSON in), trimmed of the space after "data:"; nil for a
// comment-only block or an event without data.
func dataOf(ev []byte) []byte {
	var data []byte
	n := 0
	for len(ev) > 0 {
		i := bytes.IndexByte(ev, '\n')
		line := ev
		if i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if d, ok := bytes.CutPrefix(line, dataField); ok {
			n++
			data = bytes.TrimPrefix(d, []byte{' '})
		}
	}
	if n != 1 {
		return nil
	}
	return data
}

// Reported reports whether the stream carried a usage object.
func (s *Writer) Reported() bool { return s.found }

// Usage returns the stream's usage: the last usage object it carried, or
// an estimate from prompt (the rendered prompt) and the number of data
// events relayed.
func (s *Writer) Usage(prompt string) Usage {
	if s.found {
		return s.usage
	}
	return Usage{PromptTokens: EstimatePrompt(prompt), CompletionTokens: s.events, Estimated: true}
}
