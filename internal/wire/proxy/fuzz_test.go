package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/tlgate/tlgate/internal/wire/dialect"
)

// chunkReader returns data in reads of at most size bytes, as a network
// connection may.
type chunkReader struct {
	data []byte
	size int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.size)], c.data)
	c.data = c.data[n:]
	return n, nil
}

func FuzzSSERelay(f *testing.F) {
	for _, s := range []string{
		ev1 + ev2 + done,
		ev1 + ev2[:9],
		ev1,
		done + ev1,
		"data: a\r\n\r\ndata:[DONE]\r\n\r\n",
		": comment\n\n\n\ndata: x\n\n",
		"data: " + string(bytes.Repeat([]byte("y"), 300)) + "\n\n" + done,
		"",
		"\n\n",
	} {
		f.Add([]byte(s), uint8(7))
	}
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		upstream := append([]byte(nil), data...)
		p := New(Options{MaxEventBytes: 128, Client: memClient(200, "text/event-stream", func(context.Context) io.ReadCloser {
			return io.NopCloser(&chunkReader{data: upstream, size: int(chunk%64) + 1})
		})})
		cw := newClientWriter()
		res := p.Stream(context.Background(), Attempt{URL: "http://engine/v1/completions", Body: []byte(`{}`)}, cw, nil)
		_, out := cw.got()
		if !res.Committed {
			if out != "" || res.Err == nil || res.Done {
				t.Fatalf("uncommitted %+v, client got %q", res, out)
			}
			return
		}
		if res.Bytes > int64(len(out)) {
			t.Fatalf("Bytes %d > %d written", res.Bytes, len(out))
		}
		relayed, extra := out[:res.Bytes], out[res.Bytes:]
		if !bytes.HasPrefix(data, []byte(relayed)) {
			t.Fatalf("client got %q, not a prefix of the upstream %q", relayed, data)
		}
		if !bytes.HasSuffix([]byte(relayed), []byte("\n\n")) && !bytes.HasSuffix([]byte(relayed), []byte("\n\r\n")) {
			t.Fatalf("relayed %q does not end at an event boundary", relayed)
		}
		if res.Done {
			if res.Err != nil || extra != "" {
				t.Fatalf("done with %v, extra %q", res.Err, extra)
			}
			return
		}
		if res.Err == nil || extra != string(dialect.OpenAI.ErrorEvent(string(ReasonOf(res.Err)), 0)) {
			t.Fatalf("failed stream (%v) ends with %q, want one error event", res.Err, extra)
		}
	})
}

// discardWriter is a client that reads as fast as the relay writes.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) Flush()                      {}

// eventReader yields n copies of ev, one per read (as an engine flushes
// each token), then [DONE].
type eventReader struct {
	ev   []byte
	n    int
	done bool
}

func (e *eventReader) Read(p []byte) (int, error) {
	switch {
	case e.n > 0:
		e.n--
		return copy(p, e.ev), nil
	case !e.done:
		e.done = true
		return copy(p, done), nil
	}
	return 0, io.EOF
}

// BenchmarkRelayEvent measures the relay's cost per SSE event (one op =
// one event read, scanned, written and flushed), without the network.
func BenchmarkRelayEvent(b *testing.B) {
	ev := []byte(`data: {"id":"cmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"smol-v3","choices":[{"index":0,"delta":{"content":" cat"},"finish_reason":null}]}` + "\n\n")
	p := New(Options{Client: memClient(200, "text/event-stream", func(context.Context) io.ReadCloser {
		return io.NopCloser(&eventReader{ev: ev, n: b.N})
	})})
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	b.ResetTimer()
	res := p.Stream(context.Background(), Attempt{URL: "http://engine/v1/chat/completions", Body: []byte(`{}`)}, w, nil)
	if !res.Done || res.Events != b.N+1 {
		b.Fatalf("Result = %+v", res)
	}
}
