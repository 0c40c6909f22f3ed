package enginesim

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkGenerate measures the tokens per second one engine generates
// with zero costs, over HTTP, one request of 256 tokens per op.
func BenchmarkGenerate(b *testing.B) {
	e := startEngine(b, Config{Model: "m"})
	c := newClient(b)
	for _, bc := range []struct {
		name string
		body string
	}{
		{"whole", `{"model":"m","prompt":"Benchmark the engine","max_tokens":256,"seed":1}`},
		{"stream", `{"model":"m","prompt":"Benchmark the engine","max_tokens":256,"seed":1,"stream":true}`},
		{"stream_logprobs", `{"model":"m","prompt":"Benchmark the engine","max_tokens":256,"seed":1,"stream":true,"logprobs":5}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				resp, err := c.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader(bc.body))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, resp.Body); err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			b.ReportMetric(float64(256*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkGenerateParallel is BenchmarkGenerate with concurrent clients.
func BenchmarkGenerateParallel(b *testing.B) {
	e := startEngine(b, Config{Model: "m"})
	c := newClient(b)
	body := `{"model":"m","prompt":"Benchmark the engine","max_tokens":256,"stream":true}`
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := c.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
	b.ReportMetric(float64(256*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkStartClose measures starting and closing a unified engine (tests
// start many).
func BenchmarkStartClose(b *testing.B) {
	for b.Loop() {
		e, err := Start(b.Context(), Config{Model: "m"})
		if err != nil {
			b.Fatal(err)
		}
		if err := e.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
