// Package sse frames server-sent event streams as engines send them: it
// finds where each event ends (a blank line), notices the event that ends
// a stream ("data: [DONE]", or an API's own last event), and tells a line
// of the SSE grammar from garbage. It scans every byte once across reads,
// and reports each complete event with its data, so that whoever relays a
// stream and whoever reads it (its usage, its sequence numbers) share one
// framing: the proxy's relay frames, and hands the events to an
// EventWriter.
package sse

import (
	"bytes"
	"mime"
)

// ContentType is the media type of an event stream.
const ContentType = "text/event-stream"

// IsEventStream reports whether a Content-Type header's value ct names an
// event stream, parameters allowed ("text/event-stream; charset=utf-8").
// The bare media type, what engines send, is matched without parsing.
func IsEventStream(ct string) bool {
	if ct == ContentType {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == ContentType
}

// Ends says which events end a stream: the "data: [DONE]" event (Done),
// and events whose "event:" line names one of Names.
type Ends struct {
	Done  bool
	Names []string
}

// name reports whether an "event:" line's value is one of e.Names.
func (e *Ends) name(v []byte) bool {
	for _, n := range e.Names {
		if string(v) == n {
			return true
		}
	}
	return false
}

// Event is one complete event of a scanned buffer: its bytes are
// b[Start:End], the blank line that ends it included, and its data is
// b[DataStart:DataEnd] when it has exactly one data line (the only kind
// engines send JSON in), without the space after "data:"; DataStart is -1
// otherwise.
type Event struct {
	Start, End         int
	DataStart, DataEnd int
}

// Data returns the event's data in b, or nil.
func (e Event) Data(b []byte) []byte {
	if e.DataStart < 0 {
		return nil
	}
	return b[e.DataStart:e.DataEnd]
}

// EventWriter is a writer of a stream that takes whole events with the
// spans a Scanner found in them, so that it does not frame them again.
// p holds whole blocks (events and comment blocks); events are its events,
// in order, their offsets into p.
type EventWriter interface {
	WriteEvents(p []byte, events []Event) (int, error)
}

// Scanner finds block boundaries (blank lines) in a buffer that grows at
// its end, scanning every byte once across calls. A block of comment
// lines (": keep-alive") is a block but no event. Lines end with "\n" or
// "\r\n"; a lone "\r" is not taken as a line end. A line that is neither a
// comment nor one of the fields data, event, id and retry is garbage:
// scanning stops before its block and Bad is set.
type Scanner struct {
	// Ends are the events that end the stream.
	Ends Ends
	// Bad is set once a line that is not SSE was met; Scan then returns
	// at once.
	Bad bool

	pos        int  // next byte to scan
	lineStart  int  // start of the current line
	blockStart int  // start of the current block
	blockLines bool // the current block has a line
	eventLines bool // the current block has a field line (not a comment)
	doneLine   bool // the current block ends the stream
	dataLines  int  // data lines of the current block
	dataStart  int  // the current block's (first) data, when dataLines > 0
	dataEnd    int
	events     []Event // completed since Take
}

var (
	doneData      = []byte("data: [DONE]")
	doneDataTight = []byte("data:[DONE]")
	dataField     = []byte("data:")
	eventField    = []byte("event:")
)

// Scan scans b from where it left off and returns the offsets just past
// the last complete block (0 if none) and just past the last complete
// event (0 if none), and done when that event ends the stream (scanning
// stops there). The events it completed are Take's.
func (s *Scanner) Scan(b []byte) (end, endEvent int, done bool) {
	for {
		i := bytes.IndexByte(b[s.pos:], '\n')
		if i < 0 {
			s.pos = len(b)
			return end, endEvent, false
		}
		i += s.pos
		line := b[s.lineStart:i]
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
		start := s.lineStart
		s.pos, s.lineStart = i+1, i+1
		if len(line) > 0 {
			if !Line(line) {
				s.Bad = true
				return end, endEvent, false
			}
			if !s.blockLines {
				s.blockStart = start
			}
			s.blockLines = true
			if line[0] != ':' {
				s.eventLines = true
			}
			if d, ok := bytes.CutPrefix(line, dataField); ok {
				if s.dataLines == 0 {
					s.dataStart = start + len(dataField)
					if len(d) > 0 && d[0] == ' ' {
						s.dataStart++
					}
					s.dataEnd = start + len(line)
				}
				s.dataLines++
			}
			if s.Ends.Done && (bytes.Equal(line, doneData) || bytes.Equal(line, doneDataTight)) {
				s.doneLine = true
			}
			if name := EventName(line); name != nil && s.Ends.name(name) {
				s.doneLine = true
			}
			continue
		}
		if s.blockLines {
			end = i + 1
		}
		if s.eventLines {
			endEvent = i + 1
			ev := Event{Start: s.blockStart, End: i + 1, DataStart: -1, DataEnd: -1}
			if s.dataLines == 1 {
				ev.DataStart, ev.DataEnd = s.dataStart, s.dataEnd
			}
			s.events = append(s.events, ev)
		}
		if s.doneLine {
			return end, endEvent, true
		}
		s.blockLines, s.eventLines, s.dataLines = false, false, 0
	}
}

// Take returns the events completed since the last Take, their offsets
// into the buffer as Scan saw it. The slice is reused by the next Scan.
func (s *Scanner) Take() []Event {
	evs := s.events
	s.events = s.events[:0]
	return evs
}

// Shift accounts for the first n bytes leaving the buffer; n never exceeds
// the start of the current line, nor that of an event not yet taken.
func (s *Scanner) Shift(n int) {
	s.pos -= n
	s.lineStart -= n
	s.blockStart -= n
	s.dataStart -= n
	s.dataEnd -= n
}

// Line reports whether a non-empty line is a comment or a field of the
// SSE grammar that engines send (data, event, id, retry; with or without a
// colon and value).
func Line(line []byte) bool {
	if line[0] == ':' {
		return true
	}
	name := line
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		name = line[:i]
	}
	switch string(name) {
	case "data", "event", "id", "retry":
		return true
	}
	return false
}

// EventName returns the value of an "event:" field line, or nil.
func EventName(line []byte) []byte {
	v, ok := bytes.CutPrefix(line, eventField)
	if !ok {
		return nil
	}
	return bytes.TrimPrefix(v, []byte{' '})
}
