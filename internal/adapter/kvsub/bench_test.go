package kvsub_test

import (
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/kvsub"
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

// BenchmarkSubscriberReceive is one engine's batches (a block stored,
// vLLM's map encoding) published on a ZMQ PUB socket and taken in by a
// subscriber on loopback, both in this process, in bursts of a quarter of
// the subscriber's queue: ns/batch is the wall time of a batch, from the
// publisher's write to the subscriber's view; the CPU per batch is what
// perf stat of the test binary says over b.N.
//
//	go test -run '^$' -bench SubscriberReceive -benchmem ./internal/adapter/kvsub/
func BenchmarkSubscriberReceive(b *testing.B) {
	p := kvpub.NewPublisher(b, "kv", true)
	defer p.Close()
	c := &countingView{view: newView()}
	subscribe(b, p, c.view, func(cfg *kvsub.Config) {
		cfg.Observer = c
		cfg.BytesPerSecond = 1 << 40 // the benchmark floods on purpose
	})
	p.WaitSubscribers(1)
	payloads := make([][]byte, 1024)
	for i := range payloads {
		payloads[i] = kvpub.Encode(block(i), kvpub.Options{Encoding: kvpub.Map})
	}
	b.ReportAllocs()
	b.ResetTimer()
	const burst = kvsub.DefaultQueueLen / 4 // a subscriber drops what overflows its queue
	for i := range b.N {
		if i%burst == 0 {
			for c.events.Load() < int64(i) {
				time.Sleep(20 * time.Microsecond)
			}
		}
		p.PublishPayload(payloads[i%len(payloads)])
	}
	for last, idle := int64(-1), 0; c.events.Load() < int64(b.N); {
		if ps := c.view.problemsSeen(); len(ps) > 0 {
			b.Fatalf("problems %v after %d of %d batches", ps, c.events.Load(), b.N)
		}
		if n := c.events.Load(); n == last {
			if idle++; idle > 5000 { // half a second without a batch
				b.Fatalf("%d of %d batches arrived", n, b.N)
			}
		} else {
			last, idle = n, 0
		}
		time.Sleep(100 * time.Microsecond)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/batch")
}

// countingView is a view that counts the events it received.
type countingView struct {
	*view
	events atomic.Int64
}

func (c *countingView) Received(_ string, events int, _ bool) { c.events.Add(int64(events)) }

// problemsSeen is a copy of the problems the view heard of.
func (v *view) problemsSeen() map[string]int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return maps.Clone(v.problems)
}
