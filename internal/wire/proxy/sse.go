package proxy

import "bytes"

// sseScanner finds block boundaries (blank lines) in a relay buffer and
// notices the "data: [DONE]" event, scanning every byte once across reads.
// A block of comment lines (": keep-alive") is relayed but is no event: it
// does not commit a stream. Lines end with "\n" or "\r\n"; a lone "\r" is
// not taken as a line end. A line that is neither a comment nor one of the
// fields data, event, id and retry is garbage: scanning stops before its
// block and bad is set.
type sseScanner struct {
	pos        int      // next byte to scan
	lineStart  int      // start of the current line
	blockLines bool     // the current block has a line
	eventLines bool     // the current block has a field line (not a comment)
	doneLine   bool     // the current block has a [DONE] data line
	events     int      // events completed since take
	bad        bool     // a line that is not SSE was met; scan returns at once
	d          *Dialect // its EndEvents end the stream like [DONE]
}

var (
	doneData      = []byte("data: [DONE]")
	doneDataTight = []byte("data:[DONE]")
)

// scan scans b from where it left off and returns the offsets just past the
// last complete block (0 if none) and just past the last complete event (0
// if none), and done when that event is the [DONE] event (scanning stops
// there).
func (s *sseScanner) scan(b []byte) (end, endEvent int, done bool) {
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
		s.pos, s.lineStart = i+1, i+1
		if len(line) > 0 {
			if !sseLine(line) {
				s.bad = true
				return end, endEvent, false
			}
			s.blockLines = true
			if line[0] != ':' {
				s.eventLines = true
			}
			if (bytes.Equal(line, doneData) || bytes.Equal(line, doneDataTight)) && s.d.endsOnDone() {
				s.doneLine = true
			}
			if name := eventName(line); name != nil && s.d.endEvent(name) {
				s.doneLine = true
			}
			continue
		}
		if s.blockLines {
			end = i + 1
		}
		if s.eventLines {
			endEvent = i + 1
			s.events++
		}
		if s.doneLine {
			return end, endEvent, true
		}
		s.blockLines, s.eventLines = false, false
	}
}

// sseLine reports whether a non-empty line is a comment or a field of the
// SSE grammar that engines send (data, event, id, retry; with or without a
// colon and value).
func sseLine(line []byte) bool {
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

// take returns the events completed since the last take.
func (s *sseScanner) take() int {
	n := s.events
	s.events = 0
	return n
}

// shift accounts for the first n bytes leaving the buffer; n never exceeds
// the start of the current line.
func (s *sseScanner) shift(n int) {
	s.pos -= n
	s.lineStart -= n
}
