package sse

import (
	"fmt"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

const (
	ev1  = "data: {\"choices\":[{\"delta\":{\"content\":\"The\"}}]}\n\n"
	done = "data: [DONE]\n\n"
)

func TestSSEScanner(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
		ends   []int // end after each chunk
		events int
		done   bool
	}{
		{"one event", []string{ev1}, []int{len(ev1)}, 1, false},
		{"split event", []string{ev1[:5], ev1[5:]}, []int{0, len(ev1)}, 1, false},
		{"split at the blank line", []string{ev1[:len(ev1)-1], "\n"}, []int{0, len(ev1)}, 1, false},
		{"crlf", []string{"data: a\r\n\r\n", "data: [DONE]\r\n\r\n"}, []int{11, 27}, 2, true},
		{"tight done", []string{"data:[DONE]\n\n"}, []int{13}, 1, true},
		{"done stops the scan", []string{done + ev1}, []int{len(done)}, 1, true},
		{"comment and multi-line event", []string{": hi\n\ndata: a\ndata: b\n\n"}, []int{23}, 1, false},
		{"comment block is no event", []string{": keep-alive\n\n"}, []int{14}, 0, false},
		{"leading blank line is no event", []string{"\n" + ev1}, []int{1 + len(ev1)}, 1, false},
		{"[DONE] inside data is not done", []string{"data: {\"t\":\"[DONE]\"}\n\n"}, []int{22}, 1, false},
		{"lone cr is no line end", []string{"data: a\r\r"}, []int{0}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := Scanner{Ends: Ends{Done: true}}
			var buf []byte
			var done bool
			for i, c := range tt.chunks {
				buf = append(buf, c...)
				var end, endEvent int
				end, endEvent, done = sc.Scan(buf)
				if endEvent > end {
					t.Fatalf("chunk %d: endEvent %d past end %d", i, endEvent, end)
				}
				if end != tt.ends[i] {
					t.Fatalf("chunk %d: end %d, want %d", i, end, tt.ends[i])
				}
			}
			if n := len(sc.Take()); n != tt.events || done != tt.done {
				t.Fatalf("events %d done %v, want %d %v", n, done, tt.events, tt.done)
			}
		})
	}
}

// TestSSELine: the lines engines may send, and garbage.
func TestSSELine(t *testing.T) {
	for line, want := range map[string]bool{
		"data: {}": true, "data:{}": true, "data": true, "event: x": true, "id: 1": true, "retry: 10": true,
		": keep-alive": true, ":": true,
		"Data: x": false, "datum: x": false, "<html>": false, "{\"choices\":[]}": false, " data: x": false,
	} {
		if got := Line([]byte(line)); got != want {
			t.Errorf("Line(%q) = %v, want %v", line, got, want)
		}
	}
}

// TestScannerEvents: each event comes with its span and its one data
// line's value, across reads and a Shift; a comment block is no event, and
// an event of two data lines has no single data.
func TestScannerEvents(t *testing.T) {
	in := ": hi\n\n" + "event: e\ndata: {\"a\":1}\n\n" + "data:x\r\n\r\n" + "data: a\ndata: b\n\n" + "id: 1\n\n"
	sc := Scanner{Ends: Ends{Done: true}}
	var all []string
	var data []string
	buf := []byte{}
	for i := 0; i < len(in); i += 7 { // reads of 7 bytes, the buffer shifted after each complete block
		buf = append(buf, in[i:min(i+7, len(in))]...)
		end, _, _ := sc.Scan(buf)
		for _, ev := range sc.Take() {
			all = append(all, string(buf[ev.Start:ev.End]))
			data = append(data, string(ev.Data(buf)))
		}
		if end > 0 {
			buf = append(buf[:0], buf[end:]...)
			sc.Shift(end)
		}
	}
	wantAll := []string{"event: e\ndata: {\"a\":1}\n\n", "data:x\r\n\r\n", "data: a\ndata: b\n\n", "id: 1\n\n"}
	wantData := []string{`{"a":1}`, "x", "", ""}
	if fmt.Sprintf("%q", all) != fmt.Sprintf("%q", wantAll) || fmt.Sprintf("%q", data) != fmt.Sprintf("%q", wantData) {
		t.Fatalf("events %q data %q, want %q %q", all, data, wantAll, wantData)
	}
}

// TestScannerEndNames: an API's last event ends the stream, and [DONE]
// does only when Done is set.
func TestScannerEndNames(t *testing.T) {
	sc := Scanner{Ends: Ends{Names: []string{"message_stop"}}}
	if _, _, done := sc.Scan([]byte(done)); done {
		t.Fatal("[DONE] ended a stream whose Ends do not name it")
	}
	b := []byte(done + "event: message_stop\ndata: {}\n\n")
	if end, _, ok := sc.Scan(b); !ok || end != len(b) {
		t.Fatalf("message_stop: end %d done %v", end, ok)
	}
}

// TestIsEventStream: the bare media type and its parameterized forms name
// an event stream; other types, and what does not parse, do not.
func TestIsEventStream(t *testing.T) {
	for _, tc := range []struct {
		ct   string
		want bool
	}{
		{"text/event-stream", true},
		{"text/event-stream; charset=utf-8", true},
		{"Text/Event-Stream", true},
		{"application/json", false},
		{"text/event-streamx", false},
		{"", false},
		{"text/event-stream; charset", false}, // a parameter without a value does not parse
	} {
		if got := IsEventStream(tc.ct); got != tc.want {
			t.Errorf("IsEventStream(%q) = %v, want %v", tc.ct, got, tc.want)
		}
	}
}
