package kvsub_test

import (
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/kvindex"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/testkit/kvpub"
	"github.com/tlgate/tlgate/internal/wire/kvevents"
)

// BenchmarkKVEventsDecodeApply is the gateway's work for one engine
// step's events past the socket: a batch (vLLM's map encoding) storing a
// block and evicting another, decoded and applied to the worker's exact
// view by the router's state. ns/event is per event.
//
//	go test -run '^$' -bench KVEventsDecodeApply -benchmem ./internal/adapter/kvsub/
func BenchmarkKVEventsDecodeApply(b *testing.B) {
	const n = 4096
	payloads := make([][]byte, n)
	for i := range payloads {
		st := kvpub.Stored{Hashes: []uint64{uint64(i + 1)}, Tokens: toks(i*16, 16), BlockSize: 16, Medium: kvpub.Ptr("GPU")}
		ev := []any{st}
		if i > 0 {
			st.Parent = kvpub.Ptr(uint64(i))
			ev = []any{st, kvpub.Removed{Hashes: []uint64{uint64(i)}, Medium: kvpub.Ptr("GPU")}}
		}
		payloads[i] = kvpub.Encode(kvpub.Batch{TS: 1, Rank: kvpub.Ptr(0), Events: ev}, kvpub.Options{Encoding: kvpub.Map})
	}
	decodeApply(b, payloads)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "ns/event")
}

// BenchmarkKVEventsDecodeLongRun is the gateway's work for a long
// prompt's blocks: a batch (vLLM's map encoding) storing a run of 192
// blocks of 16 tokens in one event (as an engine reports a 3,072-token
// prefill) and removing 192 others, decoded and applied to the worker's
// exact view. ns/block is per block stored and removed.
//
//	go test -run '^$' -bench KVEventsDecodeLongRun -benchmem ./internal/adapter/kvsub/
func BenchmarkKVEventsDecodeLongRun(b *testing.B) {
	const blocks, n = 192, 64
	payloads := make([][]byte, n)
	for i := range payloads {
		extra := make([][]any, blocks)
		st := kvpub.Stored{Hashes: payloadHashes(i, blocks), Tokens: toks(i*blocks*16, blocks*16), BlockSize: 16, Medium: kvpub.Ptr("GPU"), ExtraKeys: extra}
		ev := []any{st}
		if i > 0 {
			ev = append(ev, kvpub.Removed{Hashes: payloadHashes(i-1, blocks), Medium: kvpub.Ptr("GPU")})
		}
		payloads[i] = kvpub.Encode(kvpub.Batch{TS: 1, Rank: kvpub.Ptr(0), Events: ev}, kvpub.Options{Encoding: kvpub.Map})
	}
	decodeApply(b, payloads)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/blocks/2, "ns/block")
}

// payloadHashes are the block hashes BenchmarkKVEventsDecodeLongRun's
// payload i stores.
func payloadHashes(i, blocks int) []uint64 {
	hs := make([]uint64, blocks)
	for j := range hs {
		hs[j] = uint64(i*blocks + j + 1)
	}
	return hs
}

// decodeApply decodes payloads in turn, b.N of them, and applies each to
// one worker's exact view, as the subscriber and the router do.
func decodeApply(b *testing.B, payloads [][]byte) {
	b.Helper()
	s := router.NewState(router.Config{Policy: policy.NameCacheAware}, nil, 1)
	now := time.Unix(1000, 0)
	s.ApplyKV(&router.KVEvents{Worker: "w", State: kvindex.Exact}, now)
	d := kvevents.NewDecoder(kvevents.Limits{})
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		batch, err := d.Decode(payloads[i%len(payloads)])
		if err != nil {
			b.Fatal(err)
		}
		s.ApplyKV(&router.KVEvents{Worker: "w", State: kvindex.Exact, Batches: []kvindex.Batch{batch}}, now)
	}
}
