package enginesim

import (
	"crypto/sha256"
	"fmt"

	"github.com/fxamacker/cbor/v2"

	"github.com/tlgate/tlgate/enginesim/kvevents"
)

// DefaultHashSeed is the seed of the root block hash: vLLM's seed for a
// cryptographic hash when PYTHONHASHSEED is unset, so engines compute
// equal hashes for equal blocks.
const DefaultHashSeed = "vllm-none-hash"

// kvBlock is a full KV block as the prefix cache knows it: its chained hash
// and what went into it. The hash is an engine's own, opaque to the
// gateway: sha256 over the canonical CBOR of (parent hash, token ids,
// extra keys), vLLM's sha256_cbor prefix-caching hash.
type kvBlock struct {
	// key is the hash's low 64 bits: the pool's key, vLLM's integer form
	// of the hash in KV events, and the block hash in kv_format 1 data.
	key    uint64
	hash   kvevents.Hash
	parent *kvevents.Hash // nil for a sequence's first block
	tokens []uint32
	extra  []any // extra keys: LoRA name, then cache_salt on the first block
	lora   string
}

// hasher computes chained block hashes from a root (vLLM's NONE_HASH).
type hasher struct {
	root kvevents.Hash
	enc  cbor.EncMode
}

func newHasher(seed string) *hasher {
	enc, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		panic(fmt.Sprintf("enginesim: CBOR encoder: %v", err))
	}
	h := &hasher{enc: enc}
	h.root = h.sum(seed)
	return h
}

// sum is vLLM's sha256_cbor: sha256 of the canonical CBOR of v.
func (h *hasher) sum(v any) kvevents.Hash {
	b, err := h.enc.Marshal(v)
	if err != nil { // only strings, byte strings, integers, arrays and nil are hashed
		panic(fmt.Sprintf("enginesim: CBOR of a block: %v", err))
	}
	return sha256.Sum256(b)
}

// block returns the hash of a block of tokens after parent (nil: the
// first block, chained to the root) with its extra keys (nil: none).
func (h *hasher) block(parent *kvevents.Hash, tokens []uint32, extra []any) kvevents.Hash {
	p := h.root
	if parent != nil {
		p = *parent
	}
	var keys any
	if extra != nil {
		keys = extra
	}
	return h.sum([]any{p[:], tokens, keys})
}

// blocks returns the full blocks of ids, chained from the root. A LoRA
// adapter's name is an extra key of every block; cache_salt one of the
// first block only (vLLM's generate_block_hash_extra_keys).
func (h *hasher) blocks(ids []uint32, lora, salt string) []*kvBlock {
	return h.extend(nil, ids, lora, salt)
}

// extend returns the full blocks of ids after the len(prev) blocks already
// hashed, chained after prev's last block.
func (h *hasher) extend(prev []*kvBlock, ids []uint32, lora, salt string) []*kvBlock {
	var parent *kvevents.Hash
	if n := len(prev); n > 0 {
		parent = &prev[n-1].hash
	}
	var out []*kvBlock
	for i := len(prev); (i+1)*BlockTokens <= len(ids); i++ {
		var extra []any
		if lora != "" {
			extra = append(extra, lora)
		}
		if i == 0 && salt != "" {
			extra = append(extra, salt)
		}
		tokens := ids[i*BlockTokens : (i+1)*BlockTokens : (i+1)*BlockTokens]
		hash := h.block(parent, tokens, extra)
		b := &kvBlock{key: hash.Uint64(), hash: hash, parent: parent, tokens: tokens, extra: extra, lora: lora}
		out = append(out, b)
		parent = &b.hash
	}
	return out
}
