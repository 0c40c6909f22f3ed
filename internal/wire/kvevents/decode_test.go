package kvevents_test

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tlgate/tlgate/internal/routing/kvindex"
	"github.com/tlgate/tlgate/internal/testkit/kvpub"
	"github.com/tlgate/tlgate/internal/wire/kvevents"
)

func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// TestDecodeBothEncodings decodes the same batch, sent in every shape vLLM
// and SGLang have shipped, to the same events.
func TestDecodeBothEncodings(t *testing.T) {
	batch := kvpub.Batch{TS: 1789095808.84, Rank: kvpub.Ptr(2), Events: []any{
		kvpub.Stored{Hashes: []uint64{11, 12}, Tokens: seq(0, 8), BlockSize: 4, Medium: kvpub.Ptr("GPU")},
		kvpub.Stored{Hashes: []uint64{13}, Parent: kvpub.Ptr(uint64(12)), Tokens: seq(8, 4), BlockSize: 4, Medium: kvpub.Ptr("CPU"),
			LoRAName: kvpub.Ptr("sql"), ExtraKeys: [][]any{{"sql"}}, GroupIdx: kvpub.Ptr(0)},
		kvpub.Removed{Hashes: []uint64{11}, Medium: kvpub.Ptr("GPU")},
		kvpub.Unknown{Type: "BlockUpdated"},
		kvpub.Cleared{},
	}}
	for _, enc := range []kvpub.Encoding{kvpub.Array, kvpub.Map} {
		for _, hb := range []bool{false, true} {
			for _, extra := range []bool{false, true} {
				o := kvpub.Options{Encoding: enc, HashBytes: hb, Extra: extra}
				t.Run(enc.String(), func(t *testing.T) {
					b, err := kvevents.Decode(kvpub.Encode(batch, o))
					if err != nil {
						t.Fatalf("%+v: %v", o, err)
					}
					h := func(v uint64) uint64 {
						if hb {
							return xxhash.Sum64(kvpub.HashBytes(v))
						}
						return v
					}
					if b.TS != 1789095808.84 || b.Rank != 2 || b.Unknown != 1 || len(b.Events) != 4 {
						t.Fatalf("%+v: batch %+v", o, b)
					}
					s0, s1, r, c := b.Events[0], b.Events[1], b.Events[2], b.Events[3]
					if s0.Kind != kvindex.Stored || len(s0.Hashes) != 2 || s0.Hashes[1] != h(12) || s0.HasParent || s0.BlockSize != 4 ||
						len(s0.Tokens) != 8 || s0.Medium != kvindex.GPU || s0.LoRA != "" || s0.Extra != nil {
						t.Errorf("%+v: first stored %+v", o, s0)
					}
					if !s1.HasParent || s1.Parent != h(12) || s1.Medium != kvindex.CPU || s1.LoRA != "sql" || s1.Extra != nil || s1.Salt != "" {
						t.Errorf("%+v: second stored %+v", o, s1)
					}
					if r.Kind != kvindex.Removed || r.Hashes[0] != h(11) || r.Medium != kvindex.GPU {
						t.Errorf("%+v: removed %+v", o, r)
					}
					if c.Kind != kvindex.Cleared {
						t.Errorf("%+v: cleared %+v", o, c)
					}
				})
			}
		}
	}
}

// TestDecodeSGLang reads SGLang's batches: [ts, events] with no rank,
// BlockStored of five fields, BlockRemoved of one, and the metadata map
// that carries cache_salt where vLLM has lora_name.
func TestDecodeSGLang(t *testing.T) {
	for _, enc := range []kvpub.Encoding{kvpub.Array, kvpub.Map} {
		b, err := kvevents.Decode(kvpub.Encode(kvpub.Batch{TS: 3, Events: []any{
			kvpub.Stored{SGLang: true, Hashes: []uint64{1}, Tokens: seq(0, 16), BlockSize: 16},
			kvpub.Stored{SGLang: true, Hashes: []uint64{2}, Tokens: seq(0, 16), BlockSize: 16, Medium: kvpub.Ptr("GPU"), SGLangSalt: "tenant-a"},
			kvpub.Removed{SGLang: true, Hashes: []uint64{1}},
		}}, kvpub.Options{Encoding: enc}))
		if err != nil {
			t.Fatalf("%s: %v", enc, err)
		}
		if b.Rank != 0 || len(b.Events) != 3 || b.Events[0].Salt != "" || b.Events[1].Salt != "tenant-a" || b.Events[1].LoRA != "" ||
			b.Events[2].Kind != kvindex.Removed || b.Events[2].Medium != kvindex.GPU {
			t.Errorf("%s: %+v", enc, b)
		}
	}
}

// TestDecodeExtraKeys reads vLLM's extra keys: the adapter's name leading
// every block's keys is dropped, the cache salt is the last string of a
// sequence's first block, and anything else (multimodal identifiers)
// makes the block's Extra digest.
func TestDecodeExtraKeys(t *testing.T) {
	tests := []struct {
		name   string
		ev     kvpub.Stored
		salt   string
		extra0 bool // block 0 has an Extra digest
		extra1 bool
	}{
		{"salt only", kvpub.Stored{ExtraKeys: [][]any{{"tenant"}, nil}}, "tenant", false, false},
		{"adapter and salt", kvpub.Stored{LoRAName: kvpub.Ptr("sql"), ExtraKeys: [][]any{{"sql", "tenant"}, {"sql"}}}, "tenant", false, false},
		{"adapter named like the salt", kvpub.Stored{LoRAName: kvpub.Ptr("x"), ExtraKeys: [][]any{{"x", "x"}, {"x"}}}, "x", false, false},
		{"image then salt", kvpub.Stored{ExtraKeys: [][]any{{[]any{"img-digest", 3}, "tenant"}, {[]any{"img-digest", 0}}}}, "tenant", true, true},
		{"a child's strings are no salt", kvpub.Stored{Parent: kvpub.Ptr(uint64(9)), ExtraKeys: [][]any{{"mm-hash"}, nil}}, "", true, false},
		{"prompt embeddings", kvpub.Stored{ExtraKeys: [][]any{nil, {[]byte{1, 2, 3}}}}, "", false, true},
		{"deprecated lora id", kvpub.Stored{LoRAID: kvpub.Ptr(7), ExtraKeys: [][]any{{7}, {7}}}, "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := tt.ev
			ev.Hashes, ev.Tokens, ev.BlockSize = []uint64{1, 2}, seq(0, 8), 4
			for _, enc := range []kvpub.Encoding{kvpub.Array, kvpub.Map} {
				b, err := kvevents.Decode(kvpub.Encode(kvpub.Batch{Events: []any{ev}, Rank: kvpub.Ptr(0)}, kvpub.Options{Encoding: enc}))
				if err != nil {
					t.Fatalf("%s: %v", enc, err)
				}
				got := b.Events[0]
				e0 := got.Extra != nil && got.Extra[0] != 0
				e1 := got.Extra != nil && got.Extra[1] != 0
				if got.Salt != tt.salt || e0 != tt.extra0 || e1 != tt.extra1 {
					t.Errorf("%s: salt %q extra %v, want %q %v %v", enc, got.Salt, got.Extra, tt.salt, tt.extra0, tt.extra1)
				}
				if tt.ev.LoRAID != nil && got.LoRA != "#lora-id:7" {
					t.Errorf("%s: lora %q", enc, got.LoRA)
				}
			}
		})
	}
}

// TestDecodeRefusesBadInput refuses what is not a batch, naming the
// problem, and stays within its limits.
func TestDecodeRefusesBadInput(t *testing.T) {
	enc := func(fn func(e *msgpack.Encoder)) []byte {
		var buf bytes.Buffer
		fn(msgpack.NewEncoder(&buf))
		return buf.Bytes()
	}
	deep := bytes.Repeat([]byte{0x91}, 1<<16) // [[[[...
	tests := []struct {
		name    string
		payload []byte
		want    error
		msg     string
	}{
		{"empty", nil, kvevents.ErrMalformed, "truncated"},
		{"not an array", enc(func(e *msgpack.Encoder) { _ = e.EncodeString("hi") }), kvevents.ErrMalformed, "not an array"},
		{"short batch", enc(func(e *msgpack.Encoder) { _ = e.EncodeArrayLen(1); _ = e.EncodeFloat64(1) }), kvevents.ErrMalformed, "1 elements"},
		{"events not an array", enc(func(e *msgpack.Encoder) { _ = e.EncodeArrayLen(2); _ = e.EncodeFloat64(1); _ = e.EncodeInt(3) }), kvevents.ErrMalformed, "events is not an array"},
		{"truncated", kvpub.Encode(kvpub.Batch{Events: []any{kvpub.Stored{Hashes: []uint64{1}, Tokens: seq(0, 16), BlockSize: 16}}}, kvpub.Options{})[:20], kvevents.ErrMalformed, "truncated"},
		{"block size 0", kvpub.Encode(kvpub.Batch{Events: []any{kvpub.Stored{Hashes: []uint64{1}, Tokens: seq(0, 16)}}}, kvpub.Options{}), kvevents.ErrMalformed, "block_size 0"},
		{"missing tokens", enc(func(e *msgpack.Encoder) {
			_ = e.EncodeArrayLen(2)
			_ = e.EncodeFloat64(1)
			_ = e.EncodeArrayLen(1)
			_ = e.EncodeArrayLen(2)
			_ = e.EncodeString("BlockStored")
			_ = e.EncodeArrayLen(0)
		}), kvevents.ErrMalformed, "required"},
		{"negative token", enc(func(e *msgpack.Encoder) {
			_ = e.EncodeArrayLen(2)
			_ = e.EncodeFloat64(1)
			_ = e.EncodeArrayLen(1)
			_ = e.EncodeMap(map[string]any{"type": "BlockStored", "block_hashes": []uint64{1}, "token_ids": []int{-1}, "block_size": 1})
		}), kvevents.ErrMalformed, "token_ids[0]"},
		{"map event without type", enc(func(e *msgpack.Encoder) {
			_ = e.EncodeArrayLen(2)
			_ = e.EncodeFloat64(1)
			_ = e.EncodeArrayLen(1)
			_ = e.EncodeMap(map[string]any{"block_hashes": []uint64{1}})
		}), kvevents.ErrMalformed, "no type"},
		{"a metadata key past the string bound", enc(func(e *msgpack.Encoder) {
			_ = e.EncodeArrayLen(2)
			_ = e.EncodeFloat64(1)
			_ = e.EncodeArrayLen(1)
			_ = e.EncodeMap(map[string]any{"type": "BlockStored", "block_hashes": []uint64{1}, "token_ids": []int{1}, "block_size": 1,
				"metadata": map[string]any{strings.Repeat("k", kvevents.MaxString+1): "x", "cache_salt": "s"}})
		}), kvevents.ErrTooLarge, "metadata key"},
		{"rank out of range", kvpub.Encode(kvpub.Batch{Rank: kvpub.Ptr(1 << 20)}, kvpub.Options{}), kvevents.ErrMalformed, "data_parallel_rank"},
		{"a million hashes", enc(func(e *msgpack.Encoder) {
			_ = e.EncodeArrayLen(2)
			_ = e.EncodeFloat64(1)
			_ = e.EncodeArrayLen(1)
			_ = e.EncodeArrayLen(2)
			_ = e.EncodeString("BlockRemoved")
			_ = e.EncodeArrayLen(1 << 20)
			for range 1 << 20 {
				_ = e.EncodeUint(1)
			}
		}), kvevents.ErrTooLarge, "1048576 block hashes"},
		{"a header claiming 4 billion events", append(enc(func(e *msgpack.Encoder) { _ = e.EncodeArrayLen(2); _ = e.EncodeFloat64(1) }), 0xdd, 0xff, 0xff, 0xff, 0xff), kvevents.ErrTooLarge, "events"},
		{"deep nesting", append(enc(func(e *msgpack.Encoder) {
			_ = e.EncodeArrayLen(2)
			_ = e.EncodeFloat64(1)
			_ = e.EncodeArrayLen(1)
			_ = e.EncodeArrayLen(2)
			_ = e.EncodeString("BlockUpdated")
		}), deep...), kvevents.ErrMalformed, "nested deeper"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := kvevents.Decode(tt.payload)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err %v, want %v containing %q", err, tt.want, tt.msg)
			}
		})
	}
}

func TestParseFrames(t *testing.T) {
	seq8 := []byte{0, 0, 0, 0, 0, 0, 1, 2}
	if s, p, err := kvevents.ParseMessage([][]byte{[]byte("kv@a"), seq8, {0x90}}, "kv@"); err != nil || s != 258 || len(p) != 1 {
		t.Fatalf("message: %d %v %v", s, p, err)
	}
	for _, bad := range [][][]byte{{seq8, {1}}, {[]byte("x"), seq8, {1}}, {[]byte("kv@"), {1}, {1}}} {
		if _, _, err := kvevents.ParseMessage(bad, "kv@"); !errors.Is(err, kvevents.ErrMalformed) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	req := kvevents.ReplayRequest(258)
	if len(req) != 2 || len(req[0]) != 0 || !bytes.Equal(req[1], seq8) {
		t.Fatalf("replay request %q", req)
	}
	if s, _, end, err := kvevents.ParseReplay([][]byte{{}, seq8, {0x90}}); err != nil || end || s != 258 {
		t.Fatalf("replay: %d %v %v", s, end, err)
	}
	if _, _, end, err := kvevents.ParseReplay([][]byte{{}, bytes.Repeat([]byte{0xff}, 8), {}}); err != nil || !end {
		t.Fatalf("end: %v %v", end, err)
	}
	if _, _, _, err := kvevents.ParseReplay([][]byte{{1}}); !errors.Is(err, kvevents.ErrMalformed) {
		t.Fatalf("bad replay: %v", err)
	}
}

// TestDecodeEveryIntegerForm: token ids and block hashes read the same
// in every msgpack integer form an encoder may choose (the unsigned forms
// are read straight from the payload, the others by msgpack's readers),
// and a token id past 32 bits is refused in either.
func TestDecodeEveryIntegerForm(t *testing.T) {
	forms := []func(e *msgpack.Encoder, v uint64) error{
		func(e *msgpack.Encoder, v uint64) error { return e.EncodeUint(v) }, // the smallest form
		func(e *msgpack.Encoder, v uint64) error { return e.EncodeUint64(v) },
		func(e *msgpack.Encoder, v uint64) error { return e.EncodeUint32(uint32(v)) },
		func(e *msgpack.Encoder, v uint64) error { return e.EncodeInt64(int64(v)) },
		func(e *msgpack.Encoder, v uint64) error { return e.EncodeInt32(int32(v)) },
	}
	tokens := []uint64{0, 5, 127, 128, 255, 256, 65535, 65536, 1<<31 - 1}
	batch := func(form func(e *msgpack.Encoder, v uint64) error, toks []uint64, hashes []uint64) []byte {
		values := func(vs []uint64) []func(e *msgpack.Encoder) {
			out := make([]func(e *msgpack.Encoder), len(vs))
			for i, v := range vs {
				out[i] = func(e *msgpack.Encoder) { _ = form(e, v) }
			}
			return out
		}
		return positionalStored(values(hashes), values(toks), len(toks))
	}
	want := make([]uint32, len(tokens))
	for i, v := range tokens {
		want[i] = uint32(v)
	}
	for i, form := range forms {
		b, err := kvevents.Decode(batch(form, tokens, []uint64{7, 1 << 20}))
		if err != nil {
			t.Fatalf("form %d: %v", i, err)
		}
		ev := b.Events[0]
		if !slices.Equal(ev.Tokens, want) || !slices.Equal(ev.Hashes, []uint64{7, 1 << 20}) {
			t.Fatalf("form %d: tokens %v hashes %v, want %v and [7 1048576]", i, ev.Tokens, ev.Hashes, want)
		}
	}
	for i, form := range forms[:2] {
		if _, err := kvevents.Decode(batch(form, []uint64{1, 1 << 32}, []uint64{7})); !errors.Is(err, kvevents.ErrMalformed) {
			t.Fatalf("form %d: a token id past 32 bits: %v", i, err)
		}
	}
}

// TestDecodeByteHashForms: a block hash sent as bytes reduces to the
// xxhash64 of its bytes in every string and bin form (the short ones are
// read straight from the payload), and one past 1 KiB is refused.
func TestDecodeByteHashForms(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		bin  bool
	}{
		{"fixstr", 5, false}, {"str8", 40, false}, {"bin8, vLLM's 32 bytes", 32, true},
		{"bin16", 300, true}, {"str16", 1024, false}, {"empty bin", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := bytes.Repeat([]byte{0xab}, tc.n)
			payload := byteHashBatch(h, tc.bin)
			b, err := kvevents.Decode(payload)
			if err != nil {
				t.Fatal(err)
			}
			if got := b.Events[0].Hashes; !slices.Equal(got, []uint64{xxhash.Sum64(h), xxhash.Sum64(h)}) {
				t.Fatalf("hashes %x, want xxhash64 of the bytes twice", got)
			}
		})
	}
	if _, err := kvevents.Decode(byteHashBatch(make([]byte, 1025), true)); !errors.Is(err, kvevents.ErrTooLarge) {
		t.Fatalf("a 1025-byte hash: %v", err)
	}
}

// byteHashBatch is a positional batch storing two blocks of one token,
// both of hash h, sent as bin (or str).
func byteHashBatch(h []byte, bin bool) []byte {
	hash := func(e *msgpack.Encoder) { _ = e.EncodeString(string(h)) }
	if bin {
		hash = func(e *msgpack.Encoder) { _ = e.EncodeBytes(h) }
	}
	tok := func(e *msgpack.Encoder) { _ = e.EncodeUint(1) }
	return positionalStored([]func(e *msgpack.Encoder){hash, hash}, []func(e *msgpack.Encoder){tok, tok}, 1)
}

// positionalStored is a positional batch of one BlockStored event with no
// parent, whose block hashes and token ids are written by hashes and
// tokens, one function a value.
func positionalStored(hashes, tokens []func(e *msgpack.Encoder), blockSize int) []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	_ = e.EncodeArrayLen(2)
	_ = e.EncodeFloat64(1)
	_ = e.EncodeArrayLen(1)
	_ = e.EncodeArrayLen(5)
	_ = e.EncodeString("BlockStored")
	_ = e.EncodeArrayLen(len(hashes))
	for _, h := range hashes {
		h(e)
	}
	_ = e.EncodeNil()
	_ = e.EncodeArrayLen(len(tokens))
	for _, t := range tokens {
		t(e)
	}
	_ = e.EncodeInt(int64(blockSize))
	return buf.Bytes()
}
