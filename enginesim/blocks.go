package enginesim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/tlgate/tlgate/enginesim/kvevents"
)

// blockPool is the KV cache: KVBlocks blocks, each free, referenced
// (by a running sequence or a held handle) or cached-idle. Full blocks are
// cached under their chained hash and shared; idle cached blocks are
// evicted least recently used first when free blocks run out. Every block
// cached, evicted or cleared is reported as a KV cache event when events
// are on (emit). Not safe for concurrent use (the engine's mutex guards
// it).
type blockPool struct {
	total int
	free  int // blocks holding nothing
	cache map[uint64]*cachedBlock
	// lru lists idle cached blocks (no references), most recent first.
	lru  cachedBlock // sentinel
	idle int
	// emit, when set, receives the pool's KV cache events as they happen.
	emit func(kvevents.Event)
}

type cachedBlock struct {
	b          *kvBlock
	refs       int
	prev, next *cachedBlock
}

// blockSet is what a sequence or handle holds: references to cached full
// blocks and a number of private blocks (the partial prompt tail and the
// generated tokens).
type blockSet struct {
	blocks  []*kvBlock
	private int
}

func (s blockSet) size() int { return len(s.blocks) + s.private }

func newBlockPool(total int) *blockPool {
	p := &blockPool{total: total, free: total, cache: make(map[uint64]*cachedBlock)}
	p.lru.prev, p.lru.next = &p.lru, &p.lru
	return p
}

// referenced returns the blocks in use by sequences and handles.
func (p *blockPool) referenced() int { return p.total - p.free - p.idle }

// available returns the blocks a new request can take: free and idle.
func (p *blockPool) available() int { return p.free + p.idle }

// leadingHits returns how many of blocks, from the first, are cached.
func (p *blockPool) leadingHits(blocks []*kvBlock) int {
	for i, b := range blocks {
		if _, ok := p.cache[b.key]; !ok {
			return i
		}
	}
	return len(blocks)
}

// fits reports whether s can be acquired now.
func (p *blockPool) fits(s blockSet) bool {
	need, idleHits := s.private, 0
	for _, b := range s.blocks {
		c, ok := p.cache[b.key]
		switch {
		case !ok:
			need++
		case c.refs == 0:
			idleHits++
		}
	}
	return need <= p.available()-idleHits
}

// acquire takes the blocks of s; it reports false (taking nothing) if they
// do not fit. The blocks of s not cached yet are cached (BlockStored, one
// event per run of consecutive new blocks, after the evictions that made
// room for them).
func (p *blockPool) acquire(s blockSet) bool {
	if !p.fits(s) {
		return false
	}
	// Reference the hits first so eviction below cannot take them.
	missing := make([]bool, len(s.blocks))
	n := 0
	for i, b := range s.blocks {
		if c, ok := p.cache[b.key]; ok {
			if c.refs == 0 {
				p.unlink(c)
			}
			c.refs++
		} else {
			missing[i] = true
			n++
		}
	}
	for range n + s.private {
		p.take()
	}
	for i := 0; i < len(s.blocks); {
		if !missing[i] {
			i++
			continue
		}
		j := i
		for j < len(s.blocks) && missing[j] {
			p.cache[s.blocks[j].key] = &cachedBlock{b: s.blocks[j], refs: 1}
			j++
		}
		p.stored(s.blocks[i:j])
		i = j
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

// promote caches a sequence's private block, now full, under b; it
// reports false (the block stays private) when another block already holds
// that hash, as vLLM keeps such a duplicate uncached.
func (p *blockPool) promote(b *kvBlock) bool {
	if _, ok := p.cache[b.key]; ok {
		return false
	}
	p.cache[b.key] = &cachedBlock{b: b, refs: 1}
	p.stored([]*kvBlock{b})
	return true
}

// take uses one free block, evicting the least recently used idle one if
// none is free. The caller has checked availability.
func (p *blockPool) take() {
	if p.free > 0 {
		p.free--
		return
	}
	c := p.lru.prev
	p.unlink(c)
	delete(p.cache, c.b.key)
	if p.emit != nil {
		p.emit(&kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{c.b.hash}, Medium: kvevents.MediumGPU})
	}
}

// release returns the blocks of s: private ones become free, cached ones
// idle (most recently used) once nobody references them. Like vLLM, a
// chain is released tail first, so its tail is evicted before its head.
func (p *blockPool) release(s blockSet) {
	p.free += s.private
	for i := len(s.blocks) - 1; i >= 0; i-- {
		c := p.cache[s.blocks[i].key]
		c.refs--
		if c.refs == 0 {
			c.next, c.prev = p.lru.next, &p.lru
			p.lru.next.prev = c
			p.lru.next = c
			p.idle++
		}
	}
}

// reset drops every cached block (AllBlocksCleared) if none is
// referenced, as vLLM's reset_prefix_cache; false when some are.
func (p *blockPool) reset() bool {
	if p.referenced() > 0 {
		return false
	}
	p.free, p.idle = p.total, 0
	clear(p.cache)
	p.lru.prev, p.lru.next = &p.lru, &p.lru
	if p.emit != nil {
		p.emit(&kvevents.AllBlocksCleared{})
	}
	return true
}

func (p *blockPool) unlink(c *cachedBlock) {
	c.prev.next, c.next.prev = c.next, c.prev
	c.prev, c.next = nil, nil
	p.idle--
}

// stored reports a run of consecutive blocks newly cached.
func (p *blockPool) stored(run []*kvBlock) {
	if p.emit == nil || len(run) == 0 {
		return
	}
	ev := &kvevents.BlockStored{
		BlockHashes: make([]kvevents.Hash, len(run)),
		Parent:      run[0].parent,
		TokenIDs:    make([]uint32, 0, len(run)*BlockTokens),
		BlockSize:   BlockTokens,
		Medium:      kvevents.MediumGPU,
		LoraName:    run[0].lora,
		ExtraKeys:   make([][]any, len(run)),
		SpecKind:    kvevents.SpecFullAttention,
	}
	for i, b := range run {
		ev.BlockHashes[i] = b.hash
		ev.TokenIDs = append(ev.TokenIDs, b.tokens...)
		ev.ExtraKeys[i] = b.extra
	}
	p.emit(ev)
}

// blockCount returns the blocks n tokens occupy.
func blockCount(n int) int { return (n + BlockTokens - 1) / BlockTokens }

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

// promptBlocks returns the KV blocks of a prompt in push order (hashed
// without extra keys: the KV transfer contract carries none).
func (h *hasher) promptBlocks(ids []uint32) [][]byte {
	full := h.blocks(ids, "", "")
	blocks := make([][]byte, 0, blockCount(len(ids)))
	for i := 0; i < len(ids); i += BlockTokens {
		var h uint64
		if b := i / BlockTokens; b < len(full) {
			h = full[b].key
		}
		blocks = append(blocks, blockData(h, ids[i:min(i+BlockTokens, len(ids))]))
	}
	return blocks
}
