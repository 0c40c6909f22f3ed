package kvindex

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// The gateway's own block keys. Engines name their blocks with hashes the
// gateway cannot reproduce (vLLM's default sha256 pickles Python objects,
// its root hash is random per process unless PYTHONHASHSEED is set, salts
// and multimodal digests go in), so, as llm-d and Dynamo do, the gateway
// computes its own chained key of every block from the block's token ids,
// and maps the engine's hash to it so that a removal finds it:
//
//	key(0) = H(root(adapter, salt), extra(0), tokens(0))
//	key(i) = H(key(i-1), extra(i), tokens(i))
//
// H is xxhash64 over the previous key, the block's extra-keys digest and
// its tokens, each little-endian, so every replica and every engine of a
// model computes the same keys for the same tokens. A key names a block
// and everything before it: two sequences share a key only if they share
// every token up to its end, in the same namespace.

// Root is the key before a sequence's first block in the namespace of an
// adapter (lora, "" for the base model) and a cache salt (salt, "" for
// none): sequences of different namespaces never share a key.
func Root(lora, salt string) uint64 {
	d := xxhash.New()
	_, _ = d.WriteString("tlgate.kv.root\x00")
	_, _ = d.WriteString(lora)
	_, _ = d.WriteString("\x00")
	_, _ = d.WriteString(salt)
	return d.Sum64()
}

// tag is a short name of a namespace part, kept with every block so that a
// child block can check its parent's namespace (0 for "").
func tag(s string) uint32 {
	if s == "" {
		return 0
	}
	return uint32(xxhash.Sum64String(s)) | 1
}

// chain is H(prev, extra, tokens); buf is scratch, returned grown.
func chain(buf []byte, prev, extra uint64, tokens []uint32) (uint64, []byte) {
	buf = binary.LittleEndian.AppendUint64(buf[:0], prev)
	buf = binary.LittleEndian.AppendUint64(buf, extra)
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	return xxhash.Sum64(buf), buf
}

// Keys appends to dst the keys of tokens' whole blocks of bs tokens in the
// namespace of adapter lora and salt (a trailing partial block has no key:
// engines cache whole blocks only). bs < 1 appends nothing.
func Keys(dst []uint64, lora, salt string, tokens []uint32, bs int) []uint64 {
	if bs < 1 {
		return dst
	}
	var buf [16 + 4*64]byte
	b := buf[:0]
	k := Root(lora, salt)
	for end := bs; end <= len(tokens); end += bs {
		k, b = chain(b, k, 0, tokens[end-bs:end])
		dst = append(dst, k)
	}
	return dst
}
