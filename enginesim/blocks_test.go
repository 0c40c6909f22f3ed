package enginesim

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"testing"
)

func TestBlockPoolSharingAndLRU(t *testing.T) {
	p := newBlockPool(6)
	check := func(step string, free, idle, referenced int) {
		t.Helper()
		if p.free != free || p.idle != idle || p.referenced() != referenced {
			t.Fatalf("%s: free %d idle %d referenced %d, want %d %d %d", step, p.free, p.idle, p.referenced(), free, idle, referenced)
		}
	}
	a := blockSet{blocks: keyed(1, 2), private: 1}
	b := blockSet{blocks: keyed(1, 3), private: 1} // shares block 1 with a
	if !p.acquire(a) || !p.acquire(b) {
		t.Fatal("acquire failed")
	}
	check("a and b", 1, 0, 5)
	if p.leadingHits(keyed(1, 2, 9)) != 2 || p.leadingHits(keyed(9, 1)) != 0 {
		t.Fatal("leadingHits")
	}
	p.release(a)
	check("a released", 2, 1, 3) // block 2 idle, block 1 still held by b
	p.release(b)
	check("b released", 3, 3, 0) // blocks 1 and 3 idle too, tail first; LRU: 1, 3, 2 (most recent first)

	// Four private blocks: the three free ones, then the least recently used
	// idle block (2) is evicted.
	if !p.acquire(blockSet{private: 4}) {
		t.Fatal("acquire")
	}
	check("four private", 0, 2, 4)
	if _, ok := p.cache[2]; ok {
		t.Fatal("block 2 not evicted")
	}
	if !p.grow(1) { // evicts 3, now the least recently used
		t.Fatal("grow")
	}
	check("grown", 0, 1, 5)
	var cached []uint64
	for h := range p.cache {
		cached = append(cached, h)
	}
	if !slices.Equal(cached, []uint64{1}) {
		t.Fatalf("cached %v, want [1]", cached)
	}
	// Reusing idle block 1 needs no free block; needing one more block too
	// does not fit, since the only evictable block is the one reused.
	if !p.fits(blockSet{blocks: keyed(1)}) || p.fits(blockSet{blocks: keyed(1), private: 1}) {
		t.Fatal("fits")
	}
	if p.acquire(blockSet{private: 2}) || p.grow(2) {
		t.Fatal("took more than available")
	}
	check("refused", 0, 1, 5)
}

// keyed returns blocks with the given keys (and no other content).
func keyed(keys ...uint64) []*kvBlock {
	out := make([]*kvBlock, len(keys))
	for i, k := range keys {
		out[i] = &kvBlock{key: k}
	}
	return out
}

func TestBlockHashesChain(t *testing.T) {
	ids := make([]uint32, 40)
	for i := range ids {
		ids[i] = uint32(i)
	}
	h := newHasher(DefaultHashSeed)
	b := h.blocks(ids, "", "")
	if len(b) != 2 || b[0].parent != nil || *b[1].parent != b[0].hash || b[0].key != b[0].hash.Uint64() {
		t.Fatalf("%d blocks for 40 tokens, or not chained", len(b))
	}
	other := slices.Clone(ids)
	other[3] = 99 // a change in block 0 changes every later hash
	b2 := h.blocks(other, "", "")
	if b2[0].hash == b[0].hash || b2[1].hash == b[1].hash {
		t.Fatal("hashes do not chain")
	}
	if newHasher("other seed").blocks(ids, "", "")[0].hash == b[0].hash {
		t.Fatal("seed ignored")
	}
	salted := h.blocks(ids, "", "tenant")
	if salted[0].hash == b[0].hash || !slices.Equal(salted[0].extra, []any{"tenant"}) || salted[1].extra != nil {
		t.Fatalf("cache_salt must key the first block only: %v %v", salted[0].extra, salted[1].extra)
	}
	lora := h.blocks(ids, "sql", "tenant")
	if lora[1].hash == b[1].hash || !slices.Equal(lora[0].extra, []any{"sql", "tenant"}) || !slices.Equal(lora[1].extra, []any{"sql"}) {
		t.Fatalf("a LoRA name must key every block: %v %v", lora[0].extra, lora[1].extra)
	}
	if more := h.extend(b[:1], ids, "", ""); len(more) != 1 || more[0].hash != b[1].hash {
		t.Fatal("extend does not continue the chain")
	}
	if blocks := h.promptBlocks(ids); len(blocks) != 3 || len(blocks[2]) != 8+4*8 {
		t.Fatalf("promptBlocks: %d blocks", len(blocks))
	}
}

// TestBlockHashIsVLLMs pins the hash to vLLM's sha256_cbor: the root is
// sha256(cbor("vllm-none-hash")) and a block's hash sha256 of the
// canonical CBOR of [parent digest, token ids, extra keys or null].
func TestBlockHashIsVLLMs(t *testing.T) {
	h := newHasher(DefaultHashSeed)
	// cbor("vllm-none-hash") is 0x6e followed by the 14 bytes.
	if want := sha256.Sum256(append([]byte{0x6e}, "vllm-none-hash"...)); h.root != want {
		t.Fatalf("root %x, want %x", h.root, want)
	}
	// [root, [1, 2, 300], null]: 0x83, 0x58 0x20 root, 0x83 0x01 0x02 0x19 0x01 0x2c, 0xf6.
	enc := append([]byte{0x83, 0x58, 0x20}, h.root[:]...)
	enc = append(enc, 0x83, 0x01, 0x02, 0x19, 0x01, 0x2c, 0xf6)
	first := h.block(nil, []uint32{1, 2, 300}, nil)
	if want := sha256.Sum256(enc); first != want {
		t.Fatalf("block hash %x, want %x", first, want)
	}
	// A child with extra keys; the value is Python's
	// sha256(cbor2.dumps((parent, tuple(range(16)), ("sql", "tenant")), canonical=True)).
	toks := make([]uint32, 16)
	for i := range toks {
		toks[i] = uint32(i)
	}
	child := h.block(&first, toks, []any{"sql", "tenant"})
	if got := fmt.Sprintf("%x", child); got != "7e8ecaefa222d9cd72bf87192b55fe6d3a450651cec576b38f3c95a5336f242c" {
		t.Fatalf("child hash %s", got)
	}
	if child.Uint64() != 10321288982791398444 {
		t.Fatalf("child hash as vLLM's integer: %d", child.Uint64())
	}
}
