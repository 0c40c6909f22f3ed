package dialect

import (
	"cmp"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/tlgate/tlgate/internal/wire/sse"
)

// FuzzWriterCuts checks that a Writer reads a stream the same however the
// engine's bytes arrive: for each dialect (OpenAI's with and without
// stripping usage-only chunks, Responses, Messages), with and without a
// tokens budget, the client gets the same bytes and the stream reports
// the same usage, response id, sequence number and budget outcome when
// the stream is read whole and in reads of 1 to 32 bytes, framed as the
// proxy's relay frames it (WriteEvents, whole blocks). Written through
// Write in pieces, where an event split across writes is relayed before
// it is read (so it is never dropped), the same holds without stripping
// and without a budget.
func FuzzWriterCuts(f *testing.F) {
	f.Add([]byte(chunkA+chunkB+usageOnly+done), uint8(5), uint8(3))
	f.Add([]byte(llamaFinal+": keep-alive\n\n"+chunkA+"data: [DONE]\r\n\r\n"+chunkB), uint8(0), uint8(1))
	f.Add([]byte("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\"}}\n\n"+
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":2}}}\n\n"), uint8(2), uint8(9))
	f.Add([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":1}}}\n\n"+
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":6}}\n\ngarbage\n\n"+chunkA), uint8(6), uint8(2))
	f.Fuzz(func(t *testing.T, stream []byte, cut, budget uint8) {
		n := int(cut%32) + 1
		for _, c := range []struct {
			d     *Dialect
			strip bool
		}{{OpenAI, false}, {OpenAI, true}, {Responses, false}, {Messages, false}} {
			for _, limit := range []bool{false, true} {
				whole := relayCut(c.d, c.strip, limit, int(budget), stream, len(stream))
				pieces := relayCut(c.d, c.strip, limit, int(budget), stream, n)
				if whole != pieces {
					t.Fatalf("%s strip %v limit %v budget %d: %q framed whole gives\n%+v\nread %d bytes at a time\n%+v",
						c.d.Name, c.strip, limit, budget, stream, whole, n, pieces)
				}
			}
			if !c.strip {
				whole := writeCut(c.d, stream, len(stream))
				if pieces := writeCut(c.d, stream, n); whole != pieces {
					t.Fatalf("%s: %q written whole gives\n%+v\nin pieces of %d bytes\n%+v", c.d.Name, stream, whole, n, pieces)
				}
			}
		}
	})
}

// cutResult is what a client and the gateway see of a stream written
// through a Writer.
type cutResult struct {
	body       string
	usage      any
	reported   bool
	respID     string
	seq        int64
	overBudget bool
	err        string
}

var errShortWrite = errors.New("short write")

// newCutWriter is a Writer of d on a recorder, with a budget of budget
// tokens when limit is set.
func newCutWriter(d *Dialect, strip, limit bool, budget int) (*Writer, *httptest.ResponseRecorder) {
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "text/event-stream")
	w := d.NewWriter(rec, strip)
	if limit {
		w.Limit(1, func(tokens int) bool { return tokens <= budget })
	}
	return w, rec
}

// result is what came out of w and rec, err the write error that ended
// the stream (nil: none; ErrOverBudget is expected once over).
func result(w *Writer, rec *httptest.ResponseRecorder, err error) cutResult {
	r := cutResult{body: rec.Body.String(), usage: w.Usage("a prompt"), reported: w.Reported(),
		respID: w.ResponseID(), seq: w.Sequence(), overBudget: w.OverBudget()}
	if err != nil && !errors.Is(err, ErrOverBudget) {
		r.err = err.Error()
	}
	return r
}

// relayCut reads stream n bytes at a time (n > 0) and hands the Writer
// its whole blocks with their events, as the proxy's relay does: up to
// the event that ends the stream, or the first line that is not SSE.
func relayCut(d *Dialect, strip, limit bool, budget int, stream []byte, n int) cutResult {
	w, rec := newCutWriter(d, strip, limit, budget)
	sc := sse.Scanner{Ends: d.Ends()}
	var buf []byte
	for rest := stream; len(rest) > 0; {
		k := min(n, len(rest))
		buf, rest = append(buf, rest[:k]...), rest[k:]
		end, _, done := sc.Scan(buf)
		if end > 0 {
			if m, err := w.WriteEvents(buf[:end], sc.Take()); err != nil || m != end {
				return result(w, rec, cmp.Or(err, errShortWrite))
			}
			if done {
				break
			}
			buf = buf[:copy(buf, buf[end:])]
			sc.Shift(end)
		}
		if sc.Bad {
			break
		}
	}
	return result(w, rec, nil)
}

// writeCut writes stream through a Writer of d, neither stripping nor
// limited, in writes of n bytes (n > 0).
func writeCut(d *Dialect, stream []byte, n int) cutResult {
	w, rec := newCutWriter(d, false, false, 0)
	for rest := stream; len(rest) > 0; {
		k := min(n, len(rest))
		if m, err := w.Write(rest[:k]); err != nil || m != k {
			return result(w, rec, cmp.Or(err, errShortWrite))
		}
		rest = rest[k:]
	}
	return result(w, rec, nil)
}
