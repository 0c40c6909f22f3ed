package enginesim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// blockPool is the KV cache: KVBlocks blocks, each free, referenced
// (by a running sequence or a held handle) or cached-idle. Full prompt blocks
// are cached under their chained hash and shared; idle cached blocks are
// evicted least recently used first when free blocks run out. Not safe for
// concurrent use (the engine's mutex guards it).
type blockPool struct {
	total int
	free  int // blocks holding nothing
	cache map[uint64]*cachedBlock
	// lru lists idle cached blocks (no references), most recent first.
	lru  cachedBlock // sentinel
	idle int
}

type cachedBlock struct {
	hash       uint64
	refs       int
	prev, next *cachedBlock
}

// blockSet is what a sequence or handle holds: references to cached full
// prompt blocks and a number of private blocks (the partial prompt tail and
// the generated tokens).
type blockSet struct {
	hashes  []uint64
	private int
}

func (s blockSet) size() int { return len(s.hashes) + s.private }

func newBlockPool(total int) *blockPool {
	p := &blockPool{total: total, free: total, cache: make(map[uint64]*cachedBlock)}
	p.lru.prev, p.lru.next = &p.lru, &p.lru
	return p
}

// referenced returns the blocks in use by sequences and handles.
func (p *blockPool) referenced() int { return p.total - p.free - p.idle }

// available returns the blocks a new request can take: free and idle.
func (p *blockPool) available() int { return p.free + p.idle }

// leadingHits returns how many of hashes, from the first, are cached.
func (p *blockPool) leadingHits(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := p.cache[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// fits reports whether s can be acquired now.
func (p *blockPool) fits(s blockSet) bool {
	need, idleHits := s.private, 0
	for _, h := range s.hashes {
		b, ok := p.cache[h]
		switch {
		case !ok:
			need++
		case b.refs == 0:
			idleHits++
		}
	}
	return need <= p.available()-idleHits
}

// acquire takes the blocks of s; it reports false (taking nothing) if they
// do not fit.
func (p *blockPool) acquire(s blockSet) bool {
	if !p.fits(s) {
		return false
	}
	// Reference the hits first so eviction below cannot take them.
	var missing []uint64
	for _, h := range s.hashes {
		if b, ok := p.cache[h]; ok {
			if b.refs == 0 {
				p.unlink(b)
			}
			b.refs++
		} else {
			missing = append(missing, h)
		}
	}
	for _, h := range missing {
		p.take()
		p.cache[h] = &cachedBlock{hash: h, refs: 1}
	}
	for range s.private {
		p.take()
	}
	return true
}

// grow takes n more private blocks if they are available.
func (p *blockPool) grow(n int) bool {
	if n > p.available() {
		return false
	}
	for range n {
		p.take()
	}
	return true
}

// take uses one free block, evicting the least recently used idle one if
// none is free. The caller has checked availability.
func (p *blockPool) take() {
	if p.free > 0 {
		p.free--
		return
	}
	b := p.lru.prev
	p.unlink(b)
	delete(p.cache, b.hash)
}

// release returns the blocks of s: private ones become free, cached ones
// idle (most recently used) once nobody references them.
func (p *blockPool) release(s blockSet) {
	p.free += s.private
	for _, h := range s.hashes {
		b := p.cache[h]
		b.refs--
		if b.refs == 0 {
			b.next, b.prev = p.lru.next, &p.lru
			p.lru.next.prev = b
			p.lru.next = b
			p.idle++
		}
	}
}

func (p *blockPool) unlink(b *cachedBlock) {
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next = nil, nil
	p.idle--
}

// blockCount returns the blocks n tokens occupy.
func blockCount(n int) int { return (n + BlockTokens - 1) / BlockTokens }

// blockHashes returns the chained hashes of the full blocks of ids: each
// block's hash covers the previous hash and its own tokens, so equal hashes
// mean equal prefixes. root separates models.
func blockHashes(root uint64, ids []uint32) []uint64 {
	full := len(ids) / BlockTokens
	hashes := make([]uint64, full)
	var buf [8 + 4*BlockTokens]byte
	prev := root
	for i := range full {
		binary.LittleEndian.PutUint64(buf[:8], prev)
		for j, id := range ids[i*BlockTokens : (i+1)*BlockTokens] {
			binary.LittleEndian.PutUint32(buf[8+4*j:], id)
		}
		prev = xxhash.Sum64(buf[:])
		hashes[i] = prev
	}
	return hashes
}

// blockData is the reference engine's KV block layout (kv_format 1): the
// block's chained hash (0 for a partial tail block) followed by its token ids,
// little endian.
func blockData(hash uint64, ids []uint32) []byte {
	data := make([]byte, 8+4*len(ids))
	binary.LittleEndian.PutUint64(data, hash)
	for j, id := range ids {
		binary.LittleEndian.PutUint32(data[8+4*j:], id)
	}
	return data
}

// blockChecksum is the checksum sent with and verified on every KV block.
func blockChecksum(data []byte) uint64 { return xxhash.Sum64(data) }

// promptBlocks returns the KV blocks of a prompt in push order.
func promptBlocks(root uint64, ids []uint32) [][]byte {
	hashes := blockHashes(root, ids)
	blocks := make([][]byte, 0, blockCount(len(ids)))
	for i := 0; i < len(ids); i += BlockTokens {
		var h uint64
		if b := i / BlockTokens; b < len(hashes) {
			h = hashes[b]
		}
		blocks = append(blocks, blockData(h, ids[i:min(i+BlockTokens, len(ids))]))
	}
	return blocks
}
