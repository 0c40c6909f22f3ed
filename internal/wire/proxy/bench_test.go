package proxy

import (
	"context"
	"net/http"
	"testing"
)

// BenchmarkStreamLoopback measures one whole streamed attempt of 64 events
// over loopback HTTP (pooled connection): request, relay, [DONE].
func BenchmarkStreamLoopback(b *testing.B) {
	const events = 64
	ev := `data: {"choices":[{"index":0,"delta":{"content":" cat"}}]}` + "\n\n"
	srv := upstream(b, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for range events {
			_, _ = w.Write([]byte(ev))
			_ = rc.Flush()
		}
		_, _ = w.Write([]byte(done))
	})
	p := newProxy(b, Options{})
	w := &discardWriter{h: http.Header{}}
	a := Attempt{URL: srv.URL + "/v1/chat/completions", Body: []byte(`{"model":"m","stream":true}`)}
	b.ReportAllocs()
	for b.Loop() {
		if res := p.Stream(context.Background(), a, w, nil); !res.Done {
			b.Fatalf("Result = %+v", res)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
}
