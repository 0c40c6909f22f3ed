package enginesim

import (
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
	a := blockSet{hashes: []uint64{1, 2}, private: 1}
	b := blockSet{hashes: []uint64{1, 3}, private: 1} // shares block 1 with a
	if !p.acquire(a) || !p.acquire(b) {
		t.Fatal("acquire failed")
	}
	check("a and b", 1, 0, 5)
	if p.leadingHits([]uint64{1, 2, 9}) != 2 || p.leadingHits([]uint64{9, 1}) != 0 {
		t.Fatal("leadingHits")
	}
	p.release(a)
	check("a released", 2, 1, 3) // block 2 idle, block 1 still held by b
	p.release(b)
	check("b released", 3, 3, 0) // blocks 1 and 3 idle too; LRU: 3, 1, 2 (most recent first)

	// Four private blocks: the three free ones, then the least recently used
	// idle block (2) is evicted.
	if !p.acquire(blockSet{private: 4}) {
		t.Fatal("acquire")
	}
	check("four private", 0, 2, 4)
	if _, ok := p.cache[2]; ok {
		t.Fatal("block 2 not evicted")
	}
	if !p.grow(1) { // evicts 1, now the least recently used
		t.Fatal("grow")
	}
	check("grown", 0, 1, 5)
	var cached []uint64
	for h := range p.cache {
		cached = append(cached, h)
	}
	if !slices.Equal(cached, []uint64{3}) {
		t.Fatalf("cached %v, want [3]", cached)
	}
	// Reusing idle block 3 needs no free block; needing one more block too
	// does not fit, since the only evictable block is the one reused.
	if !p.fits(blockSet{hashes: []uint64{3}}) || p.fits(blockSet{hashes: []uint64{3}, private: 1}) {
		t.Fatal("fits")
	}
	if p.acquire(blockSet{private: 2}) || p.grow(2) {
		t.Fatal("took more than available")
	}
	check("refused", 0, 1, 5)
}

func TestBlockHashesChain(t *testing.T) {
	ids := make([]uint32, 40)
	for i := range ids {
		ids[i] = uint32(i)
	}
	h := blockHashes(7, ids)
	if len(h) != 2 {
		t.Fatalf("%d hashes for 40 tokens", len(h))
	}
	other := slices.Clone(ids)
	other[3] = 99 // a change in block 0 changes every later hash
	h2 := blockHashes(7, other)
	if h2[0] == h[0] || h2[1] == h[1] {
		t.Fatal("hashes do not chain")
	}
	if blockHashes(8, ids)[0] == h[0] {
		t.Fatal("root ignored")
	}
	if blocks := promptBlocks(7, ids); len(blocks) != 3 || len(blocks[2]) != 8+4*8 {
		t.Fatalf("promptBlocks: %d blocks", len(blocks))
	}
}
