package openai

import "testing"

var benchBody = []byte(`{"model":"smol-latest","stream":true,"temperature":0.7,"max_tokens":256,"messages":[` +
	`{"role":"system","content":"You are a helpful assistant. Answer briefly and precisely, and cite your sources."},` +
	`{"role":"user","content":"What is the capital of France, and why did it become the capital?"}]}`)

// BenchmarkParseRequest measures parsing a typical chat body.
func BenchmarkParseRequest(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	for b.Loop() {
		if _, err := ParseRequest(benchBody, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWithModel measures the per-attempt model rewrite.
func BenchmarkWithModel(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := WithModel(benchBody, "smol-v3"); err != nil {
			b.Fatal(err)
		}
	}
}
