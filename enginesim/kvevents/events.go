// Package kvevents publishes an engine's KV cache events as vLLM does
// (vllm/distributed/kv_events.py): a ZMQ PUB socket sends every batch as
// the multipart message [topic, 8-byte big-endian sequence, msgpack
// EventBatch], and an optional ROUTER socket replays buffered batches from
// a requested sequence, ending with the sequence -1.
//
// The EventBatch is always positional, [ts, events, data_parallel_rank].
// Each event is encoded in one of the two forms vLLM has shipped: a tagged
// positional array (["BlockStored", block_hashes, parent_block_hash, ...],
// vLLM before vllm-project/vllm#42892, and SGLang) or a map whose "type"
// key names the event and whose other keys are its fields (vLLM since).
// Block hashes are unsigned 64-bit integers (the low 64 bits of the digest,
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, vLLM's default) or the digest's
// bytes.
package kvevents

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Hash is an engine's block hash: a 32-byte digest.
type Hash [32]byte

// Uint64 returns the hash as vLLM's integer form: the digest read as a
// big-endian integer, masked to its low 64 bits.
func (h Hash) Uint64() uint64 { return binary.BigEndian.Uint64(h[24:]) }

// MediumGPU is the medium of blocks in the engine's own (GPU) KV cache.
const MediumGPU = "GPU"

// SpecFullAttention is the kv_cache_spec_kind of a full-attention cache
// group, the only kind a reference engine has.
const SpecFullAttention = "full_attention"

// Event is one KV cache event: *BlockStored, *BlockRemoved or
// *AllBlocksCleared.
type Event interface{ eventType() string }

// BlockStored reports blocks newly cached, in chain order: each block's
// hash covers its parent's hash, its tokens and its extra keys.
type BlockStored struct {
	BlockHashes []Hash
	// Parent is the hash of the block before the first one; nil when the
	// first block starts a sequence.
	Parent *Hash
	// TokenIDs are the tokens of all the blocks, BlockSize per block.
	TokenIDs  []uint32
	BlockSize int
	Medium    string
	// LoraName is the LoRA adapter the blocks were computed with ("" for
	// the base model, sent as nil).
	LoraName string
	// ExtraKeys has one entry per block: the extra keys hashed with it
	// (LoRA name, cache_salt on a sequence's first block), nil for none.
	ExtraKeys [][]any
	GroupIdx  int
	SpecKind  string
}

// BlockRemoved reports blocks evicted from the cache.
type BlockRemoved struct {
	BlockHashes []Hash
	Medium      string
	GroupIdx    int
}

// AllBlocksCleared reports that the whole prefix cache was reset.
type AllBlocksCleared struct{}

func (*BlockStored) eventType() string      { return "BlockStored" }
func (*BlockRemoved) eventType() string     { return "BlockRemoved" }
func (*AllBlocksCleared) eventType() string { return "AllBlocksCleared" }

// Encoding is the form of each event inside a batch.
type Encoding int

// Encodings.
const (
	// EncodingMap encodes each event as a map with a "type" key (vLLM
	// since vllm-project/vllm#42892).
	EncodingMap Encoding = iota
	// EncodingArray encodes each event as a tagged positional array
	// (older vLLM, SGLang).
	EncodingArray
)

// ParseEncoding parses "map" or "array".
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "map":
		return EncodingMap, nil
	case "array":
		return EncodingArray, nil
	}
	return 0, fmt.Errorf("kvevents: encoding %q is not map or array", s)
}

func (e Encoding) String() string {
	if e == EncodingArray {
		return "array"
	}
	return "map"
}

// HashFormat is how block hashes go on the wire.
type HashFormat int

// Hash formats.
const (
	// HashInt sends the low 64 bits of each digest as an unsigned integer.
	HashInt HashFormat = iota
	// HashBytes sends each digest's 32 bytes.
	HashBytes
)

// ParseHashFormat parses "int" or "bytes".
func ParseHashFormat(s string) (HashFormat, error) {
	switch s {
	case "int":
		return HashInt, nil
	case "bytes":
		return HashBytes, nil
	}
	return 0, fmt.Errorf("kvevents: hash format %q is not int or bytes", s)
}

func (f HashFormat) String() string {
	if f == HashBytes {
		return "bytes"
	}
	return "int"
}

// Encoder encodes event batches.
type Encoder struct {
	Encoding Encoding
	Hashes   HashFormat
}

// EncodeBatch returns the msgpack EventBatch [ts, events,
// data_parallel_rank], ts in seconds since the Unix epoch.
func (c Encoder) EncodeBatch(ts time.Time, events []Event, dpRank int) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	w := &writer{enc: enc, c: c}
	w.arrayLen(3)
	w.check(enc.EncodeFloat64(float64(ts.UnixNano()) / 1e9))
	w.arrayLen(len(events))
	for _, ev := range events {
		w.event(ev)
	}
	w.check(enc.EncodeInt(int64(dpRank)))
	if w.err != nil {
		return nil, fmt.Errorf("kvevents: encode batch: %w", w.err)
	}
	return buf.Bytes(), nil
}

// writer writes one batch, keeping the first error.
type writer struct {
	enc *msgpack.Encoder
	c   Encoder
	err error
}

func (w *writer) check(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *writer) arrayLen(n int) { w.check(w.enc.EncodeArrayLen(n)) }

// field writes one field: its key first in map form.
func (w *writer) field(key string, write func()) {
	if w.c.Encoding == EncodingMap {
		w.check(w.enc.EncodeString(key))
	}
	write()
}

// begin starts an event of n fields (the tag not counted).
func (w *writer) begin(tag string, n int) {
	if w.c.Encoding == EncodingMap {
		w.check(w.enc.EncodeMapLen(n + 1))
		w.check(w.enc.EncodeString("type"))
	} else {
		w.arrayLen(n + 1)
	}
	w.check(w.enc.EncodeString(tag))
}

func (w *writer) event(ev Event) {
	switch ev := ev.(type) {
	case *BlockStored:
		w.blockStored(ev)
	case *BlockRemoved:
		// block_hashes, medium, group_idx
		w.begin(ev.eventType(), 3)
		w.field("block_hashes", func() { w.hashes(ev.BlockHashes) })
		w.field("medium", func() { w.optString(ev.Medium) })
		w.field("group_idx", func() { w.check(w.enc.EncodeInt(int64(ev.GroupIdx))) })
	case *AllBlocksCleared:
		w.begin(ev.eventType(), 0)
	default:
		w.check(fmt.Errorf("unknown event %T", ev))
	}
}

// blockStored writes vLLM's BlockStored: block_hashes, parent_block_hash,
// token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx,
// kv_cache_spec_kind; kv_cache_spec_sliding_window is left out, as msgspec
// leaves out a trailing field at its default (None).
func (w *writer) blockStored(ev *BlockStored) {
	w.begin(ev.eventType(), 10)
	w.field("block_hashes", func() { w.hashes(ev.BlockHashes) })
	w.field("parent_block_hash", func() {
		if ev.Parent == nil {
			w.check(w.enc.EncodeNil())
			return
		}
		w.hash(*ev.Parent)
	})
	w.field("token_ids", func() {
		w.arrayLen(len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			w.check(w.enc.EncodeUint(uint64(t)))
		}
	})
	w.field("block_size", func() { w.check(w.enc.EncodeInt(int64(ev.BlockSize))) })
	w.field("lora_id", func() { w.check(w.enc.EncodeNil()) }) // deprecated in vLLM; lora_name replaces it
	w.field("medium", func() { w.optString(ev.Medium) })
	w.field("lora_name", func() { w.optString(ev.LoraName) })
	w.field("extra_keys", func() {
		if ev.ExtraKeys == nil {
			w.check(w.enc.EncodeNil())
			return
		}
		w.arrayLen(len(ev.ExtraKeys))
		for _, keys := range ev.ExtraKeys {
			if keys == nil {
				w.check(w.enc.EncodeNil())
				continue
			}
			w.arrayLen(len(keys))
			for _, k := range keys {
				w.check(w.enc.Encode(k))
			}
		}
	})
	w.field("group_idx", func() { w.check(w.enc.EncodeInt(int64(ev.GroupIdx))) })
	w.field("kv_cache_spec_kind", func() { w.optString(ev.SpecKind) })
}

func (w *writer) optString(s string) {
	if s == "" {
		w.check(w.enc.EncodeNil())
		return
	}
	w.check(w.enc.EncodeString(s))
}

func (w *writer) hashes(hs []Hash) {
	w.arrayLen(len(hs))
	for _, h := range hs {
		w.hash(h)
	}
}

func (w *writer) hash(h Hash) {
	if w.c.Hashes == HashBytes {
		w.check(w.enc.EncodeBytes(h[:]))
		return
	}
	w.check(w.enc.EncodeUint(h.Uint64()))
}
