package kvevents_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/routing/kvindex"
	"github.com/tlgate/tlgate/internal/testkit/kvpub"
	"github.com/tlgate/tlgate/internal/wire/kvevents"
)

// FuzzDecodeKVEvents feeds the decoder arbitrary payloads: it never
// panics, never reads past its limits, decodes the same bytes the same way
// twice, and whatever it accepts the exact index applies without panicking.
func FuzzDecodeKVEvents(f *testing.F) {
	for _, enc := range []kvpub.Encoding{kvpub.Array, kvpub.Map} {
		for _, o := range []kvpub.Options{{Encoding: enc}, {Encoding: enc, HashBytes: true}, {Encoding: enc, Extra: true}} {
			f.Add(kvpub.Encode(kvpub.Batch{TS: 1, Rank: kvpub.Ptr(1), Events: []any{
				kvpub.Stored{Hashes: []uint64{1, 2}, Tokens: seq(0, 8), BlockSize: 4, Medium: kvpub.Ptr("GPU"), LoRAName: kvpub.Ptr("a"),
					ExtraKeys: [][]any{{"a", "salt"}, {"a", []any{"img", 1}}}},
				kvpub.Stored{Hashes: []uint64{3}, Parent: kvpub.Ptr(uint64(2)), Tokens: seq(8, 4), BlockSize: 4},
				kvpub.Removed{Hashes: []uint64{1, 9}, Medium: kvpub.Ptr("CPU")},
				kvpub.Cleared{},
				kvpub.Unknown{Type: "X"},
			}}, o))
		}
		f.Add(kvpub.Encode(kvpub.Batch{TS: 2, Events: []any{kvpub.Stored{SGLang: true, Hashes: []uint64{5}, Tokens: seq(0, 2), BlockSize: 2, SGLangSalt: "t"}}}, kvpub.Options{Encoding: enc}))
	}
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff})
	lim := kvevents.Limits{MaxEvents: 64, MaxBlocks: 64, MaxTokens: 1024, MaxExtra: 8}
	f.Fuzz(func(t *testing.T, payload []byte) {
		d := kvevents.NewDecoder(lim)
		b, err := d.Decode(payload)
		b2, err2 := kvevents.NewDecoder(lim).Decode(payload)
		if b.TS != b.TS { // NaN: equal to nothing, itself included
			b.TS, b2.TS = 0, 0
		}
		if (err == nil) != (err2 == nil) || err == nil && !reflect.DeepEqual(b, b2) {
			t.Fatalf("two decodes differ: %v / %v", err, err2)
		}
		if err != nil {
			return
		}
		if len(b.Events) > lim.MaxEvents || b.Rank < 0 || b.Rank >= kvindex.MaxRanks {
			t.Fatalf("batch beyond limits: %d events, rank %d", len(b.Events), b.Rank)
		}
		for _, ev := range b.Events {
			if len(ev.Hashes) > lim.MaxBlocks || len(ev.Tokens) > lim.MaxTokens || ev.Extra != nil && len(ev.Extra) != len(ev.Hashes) {
				t.Fatalf("event beyond limits: %d hashes, %d tokens, %d extra", len(ev.Hashes), len(ev.Tokens), len(ev.Extra))
			}
			if ev.Kind == kvindex.Stored && (ev.BlockSize < 1 || ev.BlockSize > kvindex.MaxBlockSize) {
				t.Fatalf("block size %d", ev.BlockSize)
			}
		}
		x := kvindex.New(kvindex.Config{MaxBlocks: 16})
		x.SetState("w", kvindex.Exact)
		now := time.Unix(0, 0)
		if _, err := x.Apply("w", &b, now); err != nil {
			t.Fatalf("apply: %v", err)
		}
		if st, _ := x.Stats("w", now); st.Blocks > 16 {
			t.Fatalf("%d blocks held past the bound", st.Blocks)
		}
	})
}
