// Package kvpub publishes KV cache events as vLLM and SGLang do, for the
// tests of the gateway's subscriber: EventBatch payloads in both encodings
// (Encode), and a publisher (Publisher) with vLLM's PUB socket (multipart
// [topic, seq, payload]) and ROUTER replay socket, built on go-zeromq/zmq4's
// ZMTP connections, with faults a test can ask for (a lost batch, a
// restart, garbage).
//
// The encodings follow vllm/distributed/kv_events.py (msgspec structs,
// omit_defaults: trailing fields left at their defaults are omitted from
// arrays, and such keys from maps) and SGLang's kv_events.py.
package kvpub

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding is how each event of a batch is encoded.
type Encoding int

// The encodings engines have shipped.
const (
	// Array: each event a tagged positional array (vLLM before mid-2026,
	// SGLang).
	Array Encoding = iota
	// Map: each event a map with a "type" key (vLLM since mid-2026).
	Map
)

// String names the encoding in test names.
func (e Encoding) String() string {
	if e == Map {
		return "map"
	}
	return "array"
}

// Stored is a BlockStored event.
type Stored struct {
	Hashes    []uint64
	Parent    *uint64
	Tokens    []uint32
	BlockSize int
	LoRAID    *int
	Medium    *string
	LoRAName  *string
	// ExtraKeys are vLLM's, one entry per block (nil entries for blocks
	// with none); nil omits the field.
	ExtraKeys [][]any
	GroupIdx  *int
	// SGLangSalt, when set, is sent as SGLang's metadata map
	// {"cache_salt": ...} (in place of vLLM's lora_name in arrays).
	SGLangSalt string
	// SGLang: encode as SGLang's older BlockStored (the first five fields
	// only).
	SGLang bool
}

// Removed is a BlockRemoved event.
type Removed struct {
	Hashes   []uint64
	Medium   *string
	GroupIdx *int
	SGLang   bool // SGLang's older BlockRemoved: block_hashes only
}

// Cleared is an AllBlocksCleared event.
type Cleared struct{}

// Unknown is an event of a type no decoder knows, with a field.
type Unknown struct{ Type string }

// Batch is an EventBatch.
type Batch struct {
	TS     float64
	Events []any // Stored, Removed, Cleared, Unknown
	// Rank is data_parallel_rank; nil omits it (SGLang's [ts, events]).
	Rank *int
}

// Options shape the encoding.
type Options struct {
	Encoding Encoding
	// HashBytes sends block hashes as 32-byte digests (vLLM without
	// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) instead of integers.
	HashBytes bool
	// Extra adds fields a newer publisher might send: a trailing element
	// to every array, an unknown key to every map.
	Extra bool
}

// Ptr returns a pointer to v.
func Ptr[T any](v T) *T { return &v }

// Encode returns b's msgpack payload.
func Encode(b Batch, o Options) []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	n := 2
	if b.Rank != nil {
		n = 3
	}
	if o.Extra {
		n++
	}
	_ = e.EncodeArrayLen(n)
	_ = e.EncodeFloat64(b.TS)
	_ = e.EncodeArrayLen(len(b.Events))
	for _, ev := range b.Events {
		encodeEvent(e, ev, o)
	}
	if b.Rank != nil {
		_ = e.EncodeInt(int64(*b.Rank))
	}
	if o.Extra {
		_ = e.EncodeString("a field of a later version")
	}
	return buf.Bytes()
}

// HashBytes is the 32-byte digest sent for hash h with Options.HashBytes.
func HashBytes(h uint64) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], h)
	d := sha256.Sum256(b[:])
	return d[:]
}

// field is one named field of an event, and whether it is at its default
// (omitted when trailing in an array, always in a map).
type field struct {
	name    string
	val     func(*msgpack.Encoder)
	omitted bool
}

func encodeEvent(e *msgpack.Encoder, ev any, o Options) {
	hashes := func(hs []uint64) func(*msgpack.Encoder) {
		return func(e *msgpack.Encoder) {
			_ = e.EncodeArrayLen(len(hs))
			for _, h := range hs {
				encodeHash(e, h, o)
			}
		}
	}
	optStr := func(s *string) func(*msgpack.Encoder) {
		return func(e *msgpack.Encoder) {
			if s == nil {
				_ = e.EncodeNil()
				return
			}
			_ = e.EncodeString(*s)
		}
	}
	optInt := func(v *int) func(*msgpack.Encoder) {
		return func(e *msgpack.Encoder) {
			if v == nil {
				_ = e.EncodeNil()
				return
			}
			_ = e.EncodeInt(int64(*v))
		}
	}
	var typ string
	var fs []field
	switch ev := ev.(type) {
	case Stored:
		typ = "BlockStored"
		fs = []field{
			{name: "block_hashes", val: hashes(ev.Hashes)},
			{name: "parent_block_hash", val: func(e *msgpack.Encoder) {
				if ev.Parent == nil {
					_ = e.EncodeNil()
					return
				}
				encodeHash(e, *ev.Parent, o)
			}},
			{name: "token_ids", val: func(e *msgpack.Encoder) {
				_ = e.EncodeArrayLen(len(ev.Tokens))
				for _, t := range ev.Tokens {
					_ = e.EncodeUint(uint64(t))
				}
			}},
			{name: "block_size", val: func(e *msgpack.Encoder) { _ = e.EncodeInt(int64(ev.BlockSize)) }},
			{name: "lora_id", val: optInt(ev.LoRAID)},
		}
		if ev.SGLang {
			if ev.Medium != nil || ev.SGLangSalt != "" {
				fs = append(fs, field{name: "medium", val: optStr(ev.Medium)})
			}
			if ev.SGLangSalt != "" {
				fs = append(fs, field{name: "metadata", val: func(e *msgpack.Encoder) {
					_ = e.EncodeMapLen(1)
					_ = e.EncodeString("cache_salt")
					_ = e.EncodeString(ev.SGLangSalt)
				}})
			}
			break
		}
		fs = append(fs,
			field{name: "medium", val: optStr(ev.Medium)},
			field{name: "lora_name", val: optStr(ev.LoRAName)},
			field{name: "extra_keys", omitted: ev.ExtraKeys == nil, val: func(e *msgpack.Encoder) {
				_ = e.EncodeArrayLen(len(ev.ExtraKeys))
				for _, ks := range ev.ExtraKeys {
					if ks == nil {
						_ = e.EncodeNil()
						continue
					}
					_ = e.EncodeArrayLen(len(ks))
					for _, k := range ks {
						_ = e.Encode(k)
					}
				}
			}},
			field{name: "group_idx", omitted: ev.GroupIdx == nil, val: optInt(ev.GroupIdx)},
		)
	case Removed:
		typ = "BlockRemoved"
		fs = []field{{name: "block_hashes", val: hashes(ev.Hashes)}}
		if !ev.SGLang {
			fs = append(fs, field{name: "medium", val: optStr(ev.Medium)},
				field{name: "group_idx", omitted: ev.GroupIdx == nil, val: optInt(ev.GroupIdx)})
		}
	case Cleared:
		typ = "AllBlocksCleared"
	case Unknown:
		typ = ev.Type
		fs = []field{{name: "payload", val: func(e *msgpack.Encoder) { _ = e.EncodeString("?") }}}
	}
	if o.Encoding == Map {
		n := 1
		for _, f := range fs {
			if !f.omitted {
				n++
			}
		}
		if o.Extra {
			n++
		}
		_ = e.EncodeMapLen(n)
		if o.Extra { // "type" need not come first
			_ = e.EncodeString("added_in_a_later_version")
			_ = e.EncodeArrayLen(2)
			_ = e.EncodeInt(1)
			_ = e.EncodeMapLen(0)
		}
		for i, f := range fs {
			if i == 1 { // the tag among the fields: consumers must not depend on key order
				_ = e.EncodeString("type")
				_ = e.EncodeString(typ)
			}
			if f.omitted {
				continue
			}
			_ = e.EncodeString(f.name)
			f.val(e)
		}
		if len(fs) < 2 {
			_ = e.EncodeString("type")
			_ = e.EncodeString(typ)
		}
		return
	}
	// Arrays: trailing fields at their default are omitted (unless a
	// later version's field follows them).
	last := len(fs)
	for last > 0 && fs[last-1].omitted && !o.Extra {
		last--
	}
	n := 1 + last
	if o.Extra {
		n++
	}
	_ = e.EncodeArrayLen(n)
	_ = e.EncodeString(typ)
	for _, f := range fs[:last] {
		if f.omitted {
			_ = e.EncodeNil()
			continue
		}
		f.val(e)
	}
	if o.Extra {
		_ = e.EncodeMapLen(1)
		_ = e.EncodeString("x")
		_ = e.EncodeArrayLen(0)
	}
}

func encodeHash(e *msgpack.Encoder, h uint64, o Options) {
	if o.HashBytes {
		_ = e.EncodeBytes(HashBytes(h))
		return
	}
	_ = e.EncodeUint(h)
}
