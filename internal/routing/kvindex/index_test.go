package kvindex

import (
	"math"
	"runtime"
	"slices"
	"testing"
	"time"
)

const bs = 4

var t0 = time.Unix(1000, 0)

func toks(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// stored is a Stored event of the blocks of tokens, named by hashes, after
// parent (0: none).
func stored(tokens []uint32, parent uint64, hashes ...uint64) Event {
	return Event{Kind: Stored, Hashes: hashes, Parent: parent, HasParent: parent != 0, Tokens: tokens, BlockSize: bs}
}

func removed(m Medium, hashes ...uint64) Event {
	return Event{Kind: Removed, Hashes: hashes, Medium: m}
}

func newExact(t *testing.T, cfg Config, ids ...string) *Index {
	t.Helper()
	x := New(cfg)
	for _, id := range ids {
		x.SetState(id, Exact)
	}
	return x
}

func apply(t *testing.T, x *Index, id string, rank int, evs ...Event) Applied {
	t.Helper()
	a, err := x.Apply(id, &Batch{Rank: rank, Events: evs}, t0)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestKeysChained(t *testing.T) {
	a := Keys(nil, "", "", toks(0, 10), bs)
	if len(a) != 2 {
		t.Fatalf("%d keys of 10 tokens in blocks of 4, want 2", len(a))
	}
	b := Keys(nil, "", "", append(toks(0, 8), 99, 98, 97, 96), bs)
	if len(b) != 3 || b[0] != a[0] || b[1] != a[1] {
		t.Fatalf("a longer prompt does not share its prefix's keys: %v %v", a, b)
	}
	c := Keys(nil, "", "", append([]uint32{7}, toks(1, 7)...), bs)
	if c[0] == a[0] || c[1] == a[1] {
		t.Fatal("a key does not name everything before it")
	}
	for _, ns := range [][2]string{{"lora", ""}, {"", "salt"}, {"lora", "salt"}} {
		k := Keys(nil, ns[0], ns[1], toks(0, 8), bs)
		if k[0] == a[0] || k[1] == a[1] {
			t.Errorf("namespace %q shares keys with the base model's", ns)
		}
	}
	if Keys(nil, "a", "", toks(0, 4), bs)[0] == Keys(nil, "", "a", toks(0, 4), bs)[0] {
		t.Error("an adapter named like a salt shares keys")
	}
}

func TestMatchFollowsEvents(t *testing.T) {
	req := Keys(nil, "", "", toks(0, 16), bs) // 4 blocks
	tests := []struct {
		name    string
		events  []Event
		blocks  int
		tokens  float64
		applied Applied
	}{
		{"stored in two events", []Event{stored(toks(0, 8), 0, 1, 2), stored(toks(8, 4), 2, 3)}, 3, 12, Applied{Events: 2, Stored: 3}},
		{"a diverging block", []Event{stored(toks(0, 4), 0, 1), stored([]uint32{9, 9, 9, 9}, 1, 2)}, 1, 4, Applied{Events: 2, Stored: 2}},
		{"a removed middle block ends the run", []Event{stored(toks(0, 12), 0, 1, 2, 3), removed(GPU, 2)}, 1, 4, Applied{Events: 2, Stored: 3, Removed: 1}},
		{"an unknown parent is not indexed", []Event{stored(toks(0, 4), 0, 1), stored(toks(4, 4), 77, 2)}, 1, 4, Applied{Events: 2, Stored: 1, Unresolved: 1}},
		{"tokens that do not fill the blocks", []Event{stored(toks(0, 7), 0, 1, 2)}, 0, 0, Applied{Events: 1, Unresolved: 2}},
		{"cleared", []Event{stored(toks(0, 8), 0, 1, 2), {Kind: Cleared}}, 0, 0, Applied{Events: 2, Stored: 2, Cleared: 1}},
		{"removed from the CPU only", []Event{stored(toks(0, 8), 0, 1, 2), removed(CPU, 1)}, 2, 8, Applied{Events: 2, Stored: 2, UnknownRemoved: 1}},
		{"offloaded, then evicted from the GPU", []Event{stored(toks(0, 8), 0, 1, 2),
			{Kind: Stored, Hashes: []uint64{1}, Tokens: toks(0, 4), BlockSize: bs, Medium: CPU}, removed(GPU, 1)}, 2, 0.8*4 + 4, Applied{Events: 3, Stored: 3, Removed: 1}},
		{"another KV group is not indexed", []Event{{Kind: Stored, Hashes: []uint64{1}, Tokens: toks(0, 4), BlockSize: bs, Group: 1}}, 0, 0, Applied{Events: 1, OtherGroups: 1}},
		{"an image block and what follows it", []Event{{Kind: Stored, Hashes: []uint64{1, 2}, Tokens: toks(0, 8), BlockSize: bs, Extra: []uint64{0, 5}},
			stored(toks(8, 4), 2, 3)}, 1, 4, Applied{Events: 2, Stored: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newExact(t, Config{}, "w")
			a := apply(t, x, "w", 0, tt.events...)
			if a != tt.applied {
				t.Errorf("applied %+v, want %+v", a, tt.applied)
			}
			m := x.Match("w", req, t0)
			if m.Blocks != tt.blocks || m.Tokens != tt.tokens {
				t.Errorf("match %+v, want %d blocks, %v tokens", m, tt.blocks, tt.tokens)
			}
		})
	}
}

func TestNamespacesKeptApart(t *testing.T) {
	x := newExact(t, Config{}, "w")
	apply(t, x, "w", 0,
		Event{Kind: Stored, Hashes: []uint64{1, 2}, Tokens: toks(0, 8), BlockSize: bs, Salt: "tenant-a"},
		Event{Kind: Stored, Hashes: []uint64{3}, Parent: 2, HasParent: true, Tokens: toks(8, 4), BlockSize: bs},
		Event{Kind: Stored, Hashes: []uint64{4}, Tokens: toks(0, 4), BlockSize: bs, LoRA: "sql"},
		// A child claiming another salt than its parent's is not indexed.
		Event{Kind: Stored, Hashes: []uint64{5}, Parent: 1, HasParent: true, Tokens: toks(4, 4), BlockSize: bs, Salt: "tenant-b"},
		// Nor one of another adapter.
		Event{Kind: Stored, Hashes: []uint64{6}, Parent: 4, HasParent: true, Tokens: toks(4, 4), BlockSize: bs},
	)
	for _, tt := range []struct {
		lora, salt string
		blocks     int
	}{{"", "", 0}, {"", "tenant-a", 3}, {"", "tenant-b", 0}, {"sql", "", 1}, {"sql", "tenant-a", 0}} {
		if m := x.Match("w", Keys(nil, tt.lora, tt.salt, toks(0, 16), bs), t0); m.Blocks != tt.blocks {
			t.Errorf("adapter %q salt %q: %d blocks, want %d", tt.lora, tt.salt, m.Blocks, tt.blocks)
		}
	}
}

func TestRanksMatchedApart(t *testing.T) {
	x := newExact(t, Config{}, "w")
	apply(t, x, "w", 0, stored(toks(0, 8), 0, 1, 2))
	apply(t, x, "w", 1, stored(toks(0, 4), 0, 1))
	apply(t, x, "w", 1, stored(toks(8, 4), 9, 3)) // parent 9 unknown on rank 1
	req := Keys(nil, "", "", toks(0, 16), bs)
	if m := x.Match("w", req, t0); m.Blocks != 2 {
		t.Fatalf("best rank holds 2 blocks, matched %d", m.Blocks)
	}
	apply(t, x, "w", 0, removed(GPU, 1))
	if m := x.Match("w", req, t0); m.Blocks != 1 {
		t.Fatalf("rank 1 still holds block 0: matched %d", m.Blocks)
	}
	if _, err := x.Apply("w", &Batch{Rank: MaxRanks}, t0); err == nil {
		t.Fatal("a rank out of range applied")
	}
}

func TestReplacedHashes(t *testing.T) {
	x := newExact(t, Config{}, "w")
	// The engine names other tokens with a hash it used before (SGLang
	// names equal tokens alike under any salt): the old block is gone.
	apply(t, x, "w", 0, stored(toks(0, 4), 0, 1), Event{Kind: Stored, Hashes: []uint64{1}, Tokens: toks(0, 4), BlockSize: bs, Salt: "s"})
	if m := x.Match("w", Keys(nil, "", "", toks(0, 4), bs), t0); m.Blocks != 0 {
		t.Fatal("a replaced block still matches")
	}
	if m := x.Match("w", Keys(nil, "", "s", toks(0, 4), bs), t0); m.Blocks != 1 {
		t.Fatal("the replacing block does not match")
	}
	// The same block under a new engine hash: removing the old hash finds
	// nothing, removing the new one forgets it.
	apply(t, x, "w", 0, Event{Kind: Stored, Hashes: []uint64{2}, Tokens: toks(0, 4), BlockSize: bs, Salt: "s"}, removed(GPU, 1))
	if st, _ := x.Stats("w", t0); st.Blocks != 1 {
		t.Fatalf("%d blocks", st.Blocks)
	}
	apply(t, x, "w", 0, removed(GPU, 2))
	if st, _ := x.Stats("w", t0); st.Blocks != 0 || st.ByMedium != [NumMedia]int{} {
		t.Fatalf("stats %+v", st)
	}
}

// TestCollidedHashesPlaceNoChild: SGLang names a page by its tokens
// alone, so one hash can name the same page after two prefixes; a block
// stored after such a hash cannot be placed (its parent may be either)
// and is left out, never recorded after the wrong prefix.
func TestCollidedHashesPlaceNoChild(t *testing.T) {
	x := newExact(t, Config{}, "w")
	a, b, tt, c := toks(100, 4), toks(200, 4), toks(300, 4), toks(400, 4)
	const ha, hb, ht, hc = 11, 12, 13, 14
	apply(t, x, "w", 0, stored(a, 0, ha), stored(tt, ha, ht), stored(b, 0, hb), stored(tt, hb, ht))
	got := apply(t, x, "w", 0, stored(c, ht, hc)) // after a's t, or b's?
	if got.Unresolved != 1 {
		t.Fatalf("applied %+v: want the block after a collided hash left out", got)
	}
	cat := func(ps ...[]uint32) []uint32 {
		var out []uint32
		for _, p := range ps {
			out = append(out, p...)
		}
		return out
	}
	if m := x.Match("w", Keys(nil, "", "", cat(b, tt, c), bs), t0); m.Blocks != 2 {
		t.Fatalf("b t c matched %d blocks, want the 2 the engine surely holds", m.Blocks)
	}
	// A cleared view forgets the collisions with the blocks.
	apply(t, x, "w", 0, Event{Kind: Cleared}, stored(a, 0, ha), stored(tt, ha, ht), stored(c, ht, hc))
	if m := x.Match("w", Keys(nil, "", "", cat(a, tt, c), bs), t0); m.Blocks != 3 {
		t.Fatalf("after a clear, a t c matched %d blocks, want 3", m.Blocks)
	}
}

// TestSpeculativeBounded: whatever a pick or a peer speculates (one key
// over and over, at one time or at many), the speculative entries and the
// queue that expires them stay within MaxSpeculative's bound.
func TestSpeculativeBounded(t *testing.T) {
	x := newExact(t, Config{MaxSpeculative: 100}, "w")
	same := make([]uint64, 100_000)
	for i := range same {
		same[i] = 7
	}
	x.Speculate("w", same, bs, t0)
	if sp := &x.workers["w"].spec; len(sp.fifo)-sp.head != 1 || x.Match("w", []uint64{7}, t0).Blocks != 1 {
		t.Fatalf("one key speculated 100,000 times: %d queued, want 1 held", len(sp.fifo)-sp.head)
	}
	for i := range 10_000 {
		x.Speculate("w", []uint64{uint64(i % 3)}, bs, t0.Add(time.Duration(i)*time.Microsecond))
	}
	sp := &x.workers["w"].spec
	if n := len(sp.fifo) - sp.head; n > 2*100+1 || sp.len() > 100 {
		t.Fatalf("%d speculative entries, %d queued to expire: want at most 100 and 201", sp.len(), n)
	}
}

func TestBlockSizeChangeClears(t *testing.T) {
	x := newExact(t, Config{}, "w")
	apply(t, x, "w", 0, stored(toks(0, 8), 0, 1, 2))
	apply(t, x, "w", 0, Event{Kind: Stored, Hashes: []uint64{3}, Tokens: toks(0, 8), BlockSize: 8})
	if x.BlockSize("w") != 8 || x.Match("w", Keys(nil, "", "", toks(0, 8), bs), t0).Blocks != 0 {
		t.Fatal("blocks of the old size kept")
	}
	if x.Match("w", Keys(nil, "", "", toks(0, 8), 8), t0).Blocks != 1 {
		t.Fatal("the new block is missing")
	}
}

func TestSpeculativeUntilTTL(t *testing.T) {
	x := newExact(t, Config{SpeculativeTTL: time.Second, MaxSpeculative: 4}, "w")
	apply(t, x, "w", 0, stored(toks(0, 4), 0, 1))
	req := Keys(nil, "", "", toks(0, 16), bs)
	x.Speculate("w", req, bs, t0)
	if m := x.Match("w", req, t0.Add(999*time.Millisecond)); m.Blocks != 4 || m.Speculative != 3 {
		t.Fatalf("before the TTL: %+v", m)
	}
	if m := x.Match("w", req, t0.Add(time.Second)); m.Blocks != 1 {
		t.Fatalf("at the TTL: %+v", m)
	}
	// Confirmed blocks outlive their speculation.
	x.Speculate("w", req, bs, t0)
	apply(t, x, "w", 0, stored(toks(4, 4), 1, 2))
	if m := x.Match("w", req, t0.Add(time.Hour)); m.Blocks != 2 || m.Speculative != 0 {
		t.Fatalf("confirmed: %+v", m)
	}
	// Bounded: the oldest speculative blocks go first.
	many := Keys(nil, "", "", toks(100, 40), bs)
	x.Speculate("w", many, bs, t0)
	if st, _ := x.Stats("w", t0); st.Speculative > 4 {
		t.Fatalf("%d speculative blocks, bound 4", st.Speculative)
	}
	// A worker whose block size is not known yet takes the pick's.
	x.SetState("new", Exact)
	x.Speculate("new", req, bs, t0)
	if m := x.Match("new", req, t0); m.Blocks != 4 || m.Tokens != 16 {
		t.Fatalf("new worker: %+v", m)
	}
}

func TestStateAndExpect(t *testing.T) {
	x := New(Config{EventTimeout: time.Second})
	if x.State("w", t0) != None || x.Usable("w", t0) {
		t.Fatal("an unknown worker is usable")
	}
	x.Watch("w")
	if x.State("w", t0) != Pending || x.Usable("w", t0) {
		t.Fatal("a pending view is usable")
	}
	x.SetState("w", Exact)
	x.Expect("w", t0)
	x.Expect("w", t0.Add(500*time.Millisecond)) // the first expectation stands
	if !x.Usable("w", t0.Add(999*time.Millisecond)) {
		t.Fatal("stale before the timeout")
	}
	if x.Usable("w", t0.Add(time.Second)) || x.State("w", t0.Add(time.Second)) != Stale {
		t.Fatal("usable after the timeout")
	}
	if x.Usable("w", t0) {
		t.Fatal("a silent view turned usable again without a batch")
	}
	if _, err := x.Apply("w", &Batch{}, t0.Add(2*time.Second)); err != nil || !x.Usable("w", t0.Add(2*time.Second)) {
		t.Fatal("a batch did not end the silence")
	}
	apply(t, x, "w", 0, stored(toks(0, 4), 0, 1))
	x.Clear("w")
	if st, _ := x.Stats("w", t0); st.Blocks != 0 || st.State != Exact {
		t.Fatalf("cleared: %+v", st)
	}
	x.SetState("w", None)
	if _, ok := x.Stats("w", t0); ok {
		t.Fatal("None keeps the view")
	}
}

// TestKVIndexBoundedPerWorker floods one worker with more blocks than its
// bound and measures the memory per block (BytesPerBlock).
func TestKVIndexBoundedPerWorker(t *testing.T) {
	const limit = 1 << 15
	x := newExact(t, Config{MaxBlocks: limit}, "w")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	parent := uint64(0)
	for i := range 4 * limit / 64 {
		hs := make([]uint64, 64)
		for j := range hs {
			hs[j] = uint64(i*64 + j + 1)
		}
		a := apply(t, x, "w", 0, stored(toks(i*256, 256), parent, hs...))
		if i >= limit/64 && a.Evicted != 64 {
			t.Fatalf("batch %d evicted %d, want 64", i, a.Evicted)
		}
		parent = hs[63]
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	st, _ := x.Stats("w", t0)
	if st.Blocks != limit {
		t.Fatalf("%d blocks held, bound %d", st.Blocks, limit)
	}
	per := float64(after.HeapAlloc-before.HeapAlloc) / limit
	t.Logf("%.0f bytes per block (BytesPerBlock %d)", per, BytesPerBlock)
	if per > 2*BytesPerBlock {
		t.Errorf("%.0f bytes per block, more than twice BytesPerBlock", per)
	}
	// The newest blocks are kept: the last stored still chain.
	last := Keys(nil, "", "", toks(0, 4*limit*4), bs)
	if x.Holds("w", last) != 0 {
		t.Error("the oldest blocks were kept")
	}
	runtime.KeepAlive(x)
}

// join is ps one after the other.
func join(ps ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range ps {
		out = append(out, p...)
	}
	return out
}

// TestUnchainedHashesMissNotMisplace: an engine that names a page by its
// tokens alone (older SGLang) names every equal page alike after any
// prefix. Once the view has seen one hash name two blocks, it resolves a
// parent's hash only on a rank it knows whole; elsewhere a child whose
// parent's hash it holds for another block is left out, not keyed after
// the wrong prefix. A view never seen colliding resolves parents as ever.
func TestUnchainedHashesMissNotMisplace(t *testing.T) {
	p, tp, c, d := toks(100, 4), toks(300, 4), toks(400, 4), toks(450, 4)
	const hp, ht, hc, hd = 11, 13, 14, 15
	type step func(t *testing.T, x *Index) Applied
	batch := func(rank int, evs ...Event) step {
		return func(t *testing.T, x *Index) Applied { return apply(t, x, "w", rank, evs...) }
	}
	call := func(fn func(x *Index)) step {
		return func(_ *testing.T, x *Index) Applied { fn(x); return Applied{} }
	}
	// unchain has the engine name two root blocks with one hash.
	unchain := batch(0, stored(toks(500, 4), 0, 1000), stored(toks(600, 4), 0, 1000))
	cleared := batch(0, Event{Kind: Cleared})
	rootT, cAfterT := batch(0, stored(tp, 0, ht)), batch(0, stored(c, ht, hc))
	tests := []struct {
		name      string
		maxBlocks int
		steps     []step
		// unresolved is the last step's; blocks is how many of t c the
		// view holds.
		unresolved, blocks int
	}{
		{"unchained view begun mid-stream", 0, []step{unchain, rootT, cAfterT}, 1, 1},
		{"unchained, the parent evicted past the bound", 3, []step{unchain, cleared,
			batch(0, stored(p, 0, hp), stored(tp, hp, ht)), batch(0, stored(toks(900, 12), 0, 90, 91, 92)), rootT, cAfterT}, 1, 1},
		{"chained, the parent evicted past the bound", 3, []step{
			batch(0, stored(p, 0, hp), stored(tp, hp, ht)), batch(0, stored(toks(900, 12), 0, 90, 91, 92)),
			batch(0, stored(tp, 0, 23)), batch(0, stored(c, 23, hc))}, 0, 2},
		{"unchained, complete after AllBlocksCleared", 0, []step{unchain, cleared, rootT, cAfterT}, 0, 2},
		{"unchained, complete after a restart", 0, []step{unchain, call(func(x *Index) { x.ClearRestarted("w") }), rootT, cAfterT}, 0, 2},
		{"unchained kept by a clear of lost events", 0, []step{unchain, call(func(x *Index) { x.Clear("w") }), rootT, cAfterT}, 1, 1},
		{"unchained forgotten with the view", 0, []step{unchain, call(func(x *Index) { x.SetState("w", None); x.SetState("w", Exact) }), rootT, cAfterT}, 0, 2},
		{"unchained forgotten with a new block size", 0, []step{unchain,
			batch(0, Event{Kind: Stored, Hashes: []uint64{1001}, Tokens: toks(700, 8), BlockSize: 8}), rootT, cAfterT}, 0, 2},
		{"complete lost on an eviction", 3, []step{unchain, cleared, rootT, cAfterT,
			batch(0, stored(toks(900, 8), 0, 90, 91)), batch(0, stored(d, hc, hd))}, 1, 0},
		{"complete lost on a block left out", 0, []step{unchain, cleared, batch(0, stored(d, 777, hd)), rootT, cAfterT}, 1, 1},
		{"complete lost on a collision", 0, []step{unchain, cleared, batch(0, stored(p, 0, ht)), rootT, cAfterT}, 1, 1},
		{"complete lost on an event of an unknown kind", 0, []step{unchain, func(t *testing.T, x *Index) Applied {
			a, err := x.Apply("w", &Batch{Events: []Event{{Kind: Cleared}}, Unknown: 1}, t0)
			if err != nil {
				t.Fatal(err)
			}
			return a
		}, rootT, cAfterT}, 1, 1},
		{"complete per rank", 0, []step{unchain, call(func(x *Index) { x.ClearRestarted("w") }),
			batch(1, stored(d, 777, hd)), batch(1, stored(tp, 0, ht)), batch(1, stored(c, ht, hc)), rootT, cAfterT}, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newExact(t, Config{MaxBlocks: tt.maxBlocks}, "w")
			var a Applied
			for _, s := range tt.steps {
				a = s(t, x)
			}
			if a.Unresolved != tt.unresolved {
				t.Errorf("last step %+v, want %d unresolved", a, tt.unresolved)
			}
			if n := x.Holds("w", Keys(nil, "", "", join(tp, c), bs)); n != tt.blocks {
				t.Errorf("t c held as %d blocks, want %d", n, tt.blocks)
			}
		})
	}
}

// TestEvictsOldestAcrossRanks: past MaxBlocks the worker's oldest block
// goes, whatever its rank, so that a rank storing now is not left with
// its own newest blocks evicted while another keeps old ones.
func TestEvictsOldestAcrossRanks(t *testing.T) {
	// Block i is a root block of its own tokens, engine hash i+1.
	type step struct {
		rank, block int
		clock       uint32 // set the view's clock first (0: leave it)
	}
	tests := []struct {
		name      string
		maxBlocks int
		steps     []step
		held      []int
	}{
		{"the oldest of two ranks", 4, []step{{0, 0, 0}, {1, 1, 0}, {0, 2, 0}, {1, 3, 0}, {1, 4, 0}, {0, 5, 0}}, []int{2, 3, 4, 5}},
		{"a block stored again is young", 3, []step{{0, 0, 0}, {1, 1, 0}, {0, 2, 0}, {0, 0, 0}, {1, 3, 0}}, []int{0, 2, 3}},
		{"stamps renumbered before they wrap", 3, []step{{0, 0, 0}, {0, 1, 0}, {1, 2, math.MaxUint32 - 1}, {1, 3, 0}, {0, 4, 0}, {1, 5, 0}}, []int{3, 4, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newExact(t, Config{MaxBlocks: tt.maxBlocks}, "w")
			for _, s := range tt.steps {
				if s.clock != 0 {
					x.workers["w"].clock = s.clock
				}
				apply(t, x, "w", s.rank, stored(toks(100*s.block, bs), 0, uint64(s.block+1)))
			}
			var held []int
			for i := range 10 {
				if x.Holds("w", Keys(nil, "", "", toks(100*i, bs), bs)) == 1 {
					held = append(held, i)
				}
			}
			if !slices.Equal(held, tt.held) {
				t.Errorf("blocks %v held, want %v", held, tt.held)
			}
		})
	}
	// At the bound with rank 0 full, rank 1 keeps every block it stores
	// (up to the bound), not only its last.
	x := newExact(t, Config{MaxBlocks: 8}, "w")
	apply(t, x, "w", 0, stored(toks(0, 32), 0, 1, 2, 3, 4, 5, 6, 7, 8))
	apply(t, x, "w", 1, stored(toks(1000, 16), 0, 21, 22, 23, 24))
	if n := x.Holds("w", Keys(nil, "", "", toks(1000, 16), bs)); n != 4 {
		t.Fatalf("rank 1 holds %d of the 4 blocks it stored", n)
	}
	if st, _ := x.Stats("w", t0); st.Blocks != 8 {
		t.Fatalf("%d blocks held, bound 8", st.Blocks)
	}
}

// TestKVIndexBoundedAcrossRanks: an engine that fills its ranks in turn,
// each up to the bound, then empties them (or all but a block), leaves
// the worker's view within a small multiple of the bound: an empty rank
// is forgotten, and one holding far fewer blocks than it did gives back
// its room.
func TestKVIndexBoundedAcrossRanks(t *testing.T) {
	const limit, ranks = 1 << 10, 64
	tests := []struct {
		name   string
		stored int // blocks each rank stores in turn
		kept   int // of them, the newest kept
	}{
		{"filled, then emptied", limit, 0},
		{"filled, then emptied but a block", limit / 2, 1},
		{"filled, then evicted by the next", limit, limit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newExact(t, Config{MaxBlocks: limit}, "w")
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for r := range ranks {
				hs := make([]uint64, tt.stored)
				for j := range hs {
					hs[j] = uint64(r*limit + j + 1)
				}
				apply(t, x, "w", r, stored(toks(r*limit*bs, tt.stored*bs), 0, hs...))
				apply(t, x, "w", r, removed(GPU, hs[:tt.stored-tt.kept]...))
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			room := 0
			for _, rv := range x.workers["w"].ranks {
				room += cap(rv.ents) + cap(rv.free)
			}
			st, _ := x.Stats("w", t0)
			heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			t.Logf("%d blocks in %d ranks: room for %d entries, %d bytes", st.Blocks, st.Ranks, room, heap)
			if room > 2*limit {
				t.Errorf("room for %d entries across %d ranks, bound %d blocks", room, st.Ranks, limit)
			}
			if heap > 4*limit*BytesPerBlock {
				t.Errorf("%d bytes held, more than 4 times the bound's %d", heap, limit*BytesPerBlock)
			}
			runtime.KeepAlive(x)
		})
	}
}

// TestCompactedRankKeepsItsBlocks: a rank that gives back its room keeps
// its blocks, their engine hashes and their order.
func TestCompactedRankKeepsItsBlocks(t *testing.T) {
	x := newExact(t, Config{MaxBlocks: 256}, "w")
	hs := make([]uint64, 200)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	chain := Keys(nil, "", "", toks(0, 200*bs), bs)
	apply(t, x, "w", 0, stored(toks(0, 200*bs), 0, hs...))
	apply(t, x, "w", 0, removed(GPU, hs[5:195]...))
	rv := x.workers["w"].ranks[0]
	if len(rv.ents) >= 200 || x.Holds("w", chain) != 5 {
		t.Fatalf("room for %d entries, %d blocks of the chain held: want compacted, 5", len(rv.ents), x.Holds("w", chain))
	}
	// The hashes resolve: a child of the last block, a removal of the first.
	if a := apply(t, x, "w", 0, stored(toks(9000, bs), 200, 201), removed(GPU, 1)); a.Stored != 1 || a.Removed != 1 {
		t.Fatalf("after compaction: %+v", a)
	}
	// The order holds: at the bound the oldest left (block 1, hash 2) goes.
	x.cfg.MaxBlocks = 10
	apply(t, x, "w", 0, stored(toks(9100, bs), 0, 202))
	rv = x.workers["w"].ranks[0]
	if h := rv.ents[rv.oldest].hash; h != 3 {
		t.Fatalf("oldest block left has hash %d, want 3", h)
	}
}

// TestOtherTiers: vLLM's OffloadingConnector names the blocks it copies
// from the GPU to the CPU by their hashes alone (no tokens, no parent):
// the view holds those it has in the CPU tier too, as long as hashes name
// blocks. Blocks of another size are the engine's new configuration only
// on the GPU; another tier's are left out.
func TestOtherTiers(t *testing.T) {
	req := Keys(nil, "", "", toks(0, 16), bs)
	offload := func(hashes ...uint64) Event {
		return Event{Kind: Stored, Hashes: hashes, Tokens: []uint32{}, BlockSize: 16, Medium: CPU}
	}
	sized := func(m Medium, size int, h uint64) Event {
		return Event{Kind: Stored, Hashes: []uint64{h}, Tokens: toks(0, size), BlockSize: size, Medium: m}
	}
	unchain := []Event{stored(toks(500, 4), 0, 1000), stored(toks(600, 4), 0, 1000)}
	tests := []struct {
		name      string
		events    []Event
		blocks    int
		tokens    float64
		applied   Applied
		blockSize int
	}{
		{"offloaded by hash, then evicted from the GPU", []Event{stored(toks(0, 8), 0, 1, 2), offload(1, 2), removed(GPU, 1, 2)},
			2, 0.8 * 8, Applied{Events: 3, Stored: 4, Removed: 2}, bs},
		{"offloaded, a hash not held", []Event{stored(toks(0, 4), 0, 1), offload(1, 9)},
			1, 4, Applied{Events: 2, Stored: 2, Unresolved: 1}, bs},
		{"offloaded, then removed from both tiers", []Event{stored(toks(0, 8), 0, 1, 2), offload(1, 2), removed(GPU, 1), removed(CPU, 1)},
			0, 0, Applied{Events: 4, Stored: 4, Removed: 2}, bs},
		{"offloaded with a namespace not the block's", []Event{stored(toks(0, 4), 0, 1), {Kind: Stored, Hashes: []uint64{1}, Tokens: []uint32{}, BlockSize: 16, Medium: CPU, Salt: "s"}, removed(GPU, 1)},
			0, 0, Applied{Events: 3, Stored: 1, Unresolved: 1, Removed: 1}, bs},
		{"offloaded where hashes may name another block", append(unchain, stored(toks(0, 4), 0, 1), offload(1), removed(GPU, 1)),
			0, 0, Applied{Events: 5, Stored: 3, Unresolved: 1, Removed: 1}, bs},
		{"a CPU block of another size", []Event{stored(toks(0, 8), 0, 1, 2), sized(CPU, 8, 3)},
			2, 8, Applied{Events: 2, Stored: 2, Unresolved: 1}, bs},
		{"a GPU block of another size", []Event{stored(toks(0, 8), 0, 1, 2), sized(GPU, 8, 3)},
			0, 0, Applied{Events: 2, Stored: 3}, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newExact(t, Config{}, "w")
			a := apply(t, x, "w", 0, tt.events...)
			if a != tt.applied {
				t.Errorf("applied %+v, want %+v", a, tt.applied)
			}
			if m := x.Match("w", req, t0); m.Blocks != tt.blocks || m.Tokens != tt.tokens {
				t.Errorf("match %+v, want %d blocks, %v tokens", m, tt.blocks, tt.tokens)
			}
			if got := x.BlockSize("w"); got != tt.blockSize {
				t.Errorf("block size %d, want %d", got, tt.blockSize)
			}
		})
	}
}
