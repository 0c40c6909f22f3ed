package prefixindex

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

func fw(id string, blocks int) fleet.Worker {
	return fleet.Worker{ID: id, Model: "m", KVTotalBlocks: blocks, KVBlockTokens: 16, StartedAt: t0}
}

// text returns n bytes of text distinct for every seed.
func text(seed string, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%s-%d ", seed, i)
	}
	return b.String()[:n]
}

func hitsOf(q *Query) map[string]int {
	out := map[string]int{}
	for _, h := range q.Hits() {
		if _, dup := out[h.ID]; dup {
			panic("worker listed twice: " + h.ID)
		}
		out[h.ID] = h.Chunks
	}
	return out
}

func TestPrefixIndexLongestMatch(t *testing.T) {
	x := New(Config{ChunkBytes: 64, BytesPerToken: 4})
	for _, id := range []string{"a", "b", "c"} {
		x.Observe(fw(id, 1000))
	}
	sys := text("system", 640) // 10 chunks
	conv := sys + text("turn1", 320)
	x.Record(x.Lookup("m", sys+text("q-a", 100)), "a") // 11 chunks, 10 shared
	x.Record(x.Lookup("m", conv), "b")                 // 15 chunks
	x.Record(x.Lookup("m", text("other", 640)), "c")   // nothing shared

	tests := []struct {
		name   string
		model  string
		prompt string
		want   map[string]int
	}{
		{"system prompt with a new question", "m", sys + text("q-new", 200), map[string]int{"a": 10, "b": 10}},
		{"the conversation's next turn", "m", conv + text("turn2", 300), map[string]int{"a": 10, "b": 15}},
		{"a prompt seen whole", "m", conv, map[string]int{"a": 10, "b": 15}},
		{"shorter than a chunk", "m", sys[:63], map[string]int{}},
		{"first chunk differs", "m", "X" + sys[1:], map[string]int{}},
		{"differs in the middle of chunk 4", "m", sys[:4*64+10] + "X" + sys[4*64+11:], map[string]int{"a": 4, "b": 4}},
		{"another model", "n", conv, map[string]int{}},
		{"empty", "m", "", map[string]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := hitsOf(x.Lookup(tt.model, tt.prompt))
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("hits %v, want %v", got, tt.want)
			}
		})
	}
	t.Run("hashes chain the prefix", func(t *testing.T) {
		h1 := x.Hashes(nil, sys)
		h2 := x.Hashes(nil, conv)
		if len(h1) != 10 || len(h2) != 15 {
			t.Fatalf("chunks %d and %d, want 10 and 15", len(h1), len(h2))
		}
		for i := range h1 {
			if h1[i] != h2[i] {
				t.Fatalf("chunk %d: a prompt's prefix hashes differently", i)
			}
		}
		// The same chunk text after a different prefix is another chunk.
		a := x.Hashes(nil, strings.Repeat("y", 64)+strings.Repeat("z", 64))
		b := x.Hashes(nil, strings.Repeat("w", 64)+strings.Repeat("z", 64))
		if a[1] == b[1] {
			t.Fatal("equal chunks after different prefixes share a hash")
		}
	})
	t.Run("unknown worker and other model ignored by Record", func(t *testing.T) {
		before := x.Len("m")
		x.Record(x.Lookup("m", text("ghost", 640)), "nobody")
		x.Record(x.Lookup("n", text("ghost", 640)), "a")
		if x.Len("m") != before || x.Len("n") != 0 {
			t.Fatalf("chunks %d (was %d), model n %d", x.Len("m"), before, x.Len("n"))
		}
	})
}

func TestPrefixIndexBoundedPerWorker(t *testing.T) {
	x := New(Config{ChunkBytes: 64, BytesPerToken: 4, MaxRequestShare: 1})
	// 10 blocks × 16 tokens × 4 bytes / 64 = 10 chunks.
	x.Observe(fw("small", 10))
	x.Observe(fw("big", 1000))
	if got := x.Capacity(&fleet.Worker{KVTotalBlocks: 10, KVBlockTokens: 16}); got != 10 {
		t.Fatalf("capacity %d chunks, want 10", got)
	}
	if got := x.Capacity(&fleet.Worker{KVTotalBlocks: 10}); got != 10 {
		t.Fatalf("capacity without kv_block_tokens %d chunks, want 10 (16 tokens a block)", got)
	}
	if got := x.Capacity(&fleet.Worker{KVTotalBlocks: 1 << 31, KVBlockTokens: 1 << 31}); got != MaxCapacityChunks {
		t.Fatalf("capacity of an absurd KV report %d chunks, want the cap %d", got, MaxCapacityChunks)
	}
	if got := x.Capacity(&fleet.Worker{}); got != DefaultCapacityTokens*4/64 {
		t.Fatalf("capacity without KV figures %d chunks, want %d", got, DefaultCapacityTokens*4/64)
	}
	p1, p2 := text("one", 6*64), text("two", 6*64)
	x.Record(x.Lookup("m", p1), "small")
	x.Record(x.Lookup("m", p1), "big")
	x.Record(x.Lookup("m", p2), "small") // 12 > 10: p1's deepest two chunks go first
	s, _ := x.Stats("small")
	if s.Chunks != 10 || s.Capacity != 10 {
		t.Fatalf("small: %+v, want 10 chunks of 10", s)
	}
	if got := hitsOf(x.Lookup("m", p1)); got["small"] != 4 || got["big"] != 6 {
		t.Fatalf("p1 hits %v, want small 4 (its least recent chunks evicted) and big 6", got)
	}
	if got := hitsOf(x.Lookup("m", p2)); got["small"] != 6 {
		t.Fatalf("p2 hits %v, want small 6", got)
	}
	// A prompt longer than the capacity keeps its leading chunks.
	long := text("long", 30*64)
	x.Record(x.Lookup("m", long), "small")
	if got := hitsOf(x.Lookup("m", long)); got["small"] != 10 {
		t.Fatalf("long prompt: small holds %d leading chunks, want 10", got["small"])
	}
	// A shrinking capacity evicts at once.
	x.Observe(fleet.Worker{ID: "big", Model: "m", KVTotalBlocks: 1000, KVBlockTokens: 16, StartedAt: t0})
	if s, _ := x.Stats("big"); s.Chunks != 6 {
		t.Fatalf("big: %+v, want 6 chunks", s)
	}

	t.Run("memory per chunk", func(t *testing.T) {
		// One worker at capacity with distinct prompts: no sharing, so
		// every pair costs its own entry. The measured bytes per chunk stay
		// under the BytesPerChunk estimate Stats reports.
		const capacity = 20000
		y := New(Config{ChunkBytes: 64, BytesPerToken: 4})
		y.Observe(fleet.Worker{ID: "w", Model: "m", KVTotalBlocks: capacity, KVBlockTokens: 16})
		prompts := make([]string, 64)
		for i := range prompts {
			prompts[i] = text(fmt.Sprintf("p%d", i), 64*64)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := 0; ; i++ {
			p := prompts[i%len(prompts)]
			y.Record(y.Lookup("m", fmt.Sprintf("%06d", i)+p[6:]), "w")
			if s, _ := y.Stats("w"); s.Chunks >= capacity {
				break
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		s, _ := y.Stats("w")
		per := float64(after.HeapAlloc-before.HeapAlloc) / float64(s.Chunks)
		t.Logf("%d chunks held: %.0f bytes per chunk measured, %d estimated", s.Chunks, per, BytesPerChunk)
		if s.Chunks != capacity {
			t.Fatalf("chunks %d, want %d", s.Chunks, capacity)
		}
		if per > 1.5*BytesPerChunk {
			t.Fatalf("%.0f bytes per chunk, estimate %d is far off", per, BytesPerChunk)
		}
		runtime.KeepAlive(y)
	})
}

func TestPrefixIndexForgetsRestartedWorker(t *testing.T) {
	p := text("sys", 640)
	tests := []struct {
		name   string
		change func(w fleet.Worker) fleet.Worker
		forget bool
	}{
		{"same process, new heartbeat", func(w fleet.Worker) fleet.Worker {
			w.QueueDepth, w.Running, w.LastHeartbeat = 3, 5, t0.Add(time.Second)
			return w
		}, false},
		{"idle: every block free (cached blocks count as free)", func(w fleet.Worker) fleet.Worker {
			w.KVFreeBlocks = w.KVTotalBlocks
			return w
		}, false},
		{"restarted: started_at changed", func(w fleet.Worker) fleet.Worker {
			w.StartedAt = w.StartedAt.Add(time.Minute)
			return w
		}, true},
		{"KV rebuilt: kv_total_blocks changed", func(w fleet.Worker) fleet.Worker {
			w.KVTotalBlocks = 2000
			return w
		}, true},
		{"KV gone: kv_total_blocks 0", func(w fleet.Worker) fleet.Worker {
			w.KVTotalBlocks = 0
			return w
		}, true},
		{"serves another model", func(w fleet.Worker) fleet.Worker {
			w.Model = "n"
			return w
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := New(Config{ChunkBytes: 64, BytesPerToken: 4})
			a, b := fw("a", 1000), fw("b", 1000)
			x.Observe(a)
			x.Observe(b)
			x.Record(x.Lookup("m", p), "a")
			x.Record(x.Lookup("m", p), "b")
			x.Observe(tt.change(a))
			got := hitsOf(x.Lookup("m", p))
			if _, held := got["a"]; held == tt.forget {
				t.Fatalf("hits %v: worker a held %v, want %v", got, held, !tt.forget)
			}
			if got["b"] != 10 {
				t.Fatalf("hits %v: worker b lost its entries", got)
			}
			if s, _ := x.Stats("a"); tt.forget && s.Chunks != 0 {
				t.Fatalf("a still counts %d chunks", s.Chunks)
			}
		})
	}
	t.Run("evicted", func(t *testing.T) {
		x := New(Config{ChunkBytes: 64, BytesPerToken: 4})
		x.Observe(fw("a", 1000))
		x.Observe(fw("b", 1000))
		x.Record(x.Lookup("m", p), "a")
		x.Forget("a")
		x.Forget("a") // twice is harmless
		if got := hitsOf(x.Lookup("m", p)); len(got) != 0 || x.Len("m") != 0 {
			t.Fatalf("hits %v, %d chunks after the only holder left", got, x.Len("m"))
		}
		if _, ok := x.Stats("a"); ok {
			t.Fatal("evicted worker still has stats")
		}
		// Its slot is reused by the next worker, which starts empty.
		x.Observe(fw("c", 1000))
		if got := hitsOf(x.Lookup("m", p)); len(got) != 0 {
			t.Fatalf("new worker inherited %v", got)
		}
	})
	t.Run("retain", func(t *testing.T) {
		x := New(Config{ChunkBytes: 64, BytesPerToken: 4})
		for _, id := range []string{"a", "b", "c"} {
			x.Observe(fw(id, 1000))
			x.Record(x.Lookup("m", p), id)
		}
		x.Retain(func(id string) bool { return id == "b" })
		if got := hitsOf(x.Lookup("m", p)); fmt.Sprint(got) != "map[b:10]" {
			t.Fatalf("hits %v, want only b", got)
		}
	})
}

func TestPrefixIndexManyWorkers(t *testing.T) {
	// Slots past the first machine word, freed and reused.
	x := New(Config{ChunkBytes: 64, BytesPerToken: 4})
	p := text("shared", 64*8)
	for i := range 150 {
		id := fmt.Sprintf("w%03d", i)
		x.Observe(fw(id, 100))
		x.Record(x.Lookup("m", p[:64*(1+i%8)]), id)
	}
	got := hitsOf(x.Lookup("m", p))
	if len(got) != 150 {
		t.Fatalf("%d workers hit, want 150", len(got))
	}
	for i := range 150 {
		if c := got[fmt.Sprintf("w%03d", i)]; c != 1+i%8 {
			t.Fatalf("w%03d: %d chunks, want %d", i, c, 1+i%8)
		}
	}
	for i := 0; i < 150; i += 2 {
		x.Forget(fmt.Sprintf("w%03d", i))
	}
	x.Observe(fw("new", 100))
	x.Record(x.Lookup("m", p), "new")
	got = hitsOf(x.Lookup("m", p))
	if len(got) != 76 || got["new"] != 8 || got["w001"] != 2 {
		t.Fatalf("%d hits (new %d, w001 %d), want 76, 8, 2", len(got), got["new"], got["w001"])
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{ChunkBytes: 64, BytesPerToken: 4, MaxRequestShare: 0.5}, ""},
		{Config{ChunkBytes: 64, BytesPerToken: 4, MaxRequestShare: 1}, ""},
		{Config{ChunkBytes: 0, BytesPerToken: 4, MaxRequestShare: 1}, "chunk bytes"},
		{Config{ChunkBytes: 64, BytesPerToken: 0, MaxRequestShare: 1}, "bytes per token"},
		{Config{ChunkBytes: 64, BytesPerToken: 4}, "max request share"},
		{Config{ChunkBytes: 64, BytesPerToken: 4, MaxRequestShare: 1.5}, "max request share"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want %q", tt.cfg, err, tt.want)
		}
	}
	if c := New(Config{}).Config(); c.ChunkBytes != DefaultChunkBytes || c.BytesPerToken != DefaultBytesPerToken || c.MaxRequestShare != DefaultMaxRequestShare {
		t.Fatalf("defaults %+v", c)
	}
}

// BenchmarkLookup is one lookup and record of a 2,000-token prompt
// (8,000 bytes) whose first 6,000 bytes 64 workers share.
func BenchmarkLookup(b *testing.B) {
	x := New(Config{ChunkBytes: 64, BytesPerToken: 4})
	shared := text("shared", 6000)
	for i := range 64 {
		id := fmt.Sprintf("w%02d", i)
		x.Observe(fw(id, 100000))
		x.Record(x.Lookup("m", shared), id)
	}
	prompts := make([]string, 16)
	for i := range prompts {
		prompts[i] = shared + text(fmt.Sprint("q", i), 2000)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		q := x.Lookup("m", prompts[i%len(prompts)])
		x.Record(q, "w07")
		i++
	}
}

// BenchmarkHashes cuts and hashes an 8,000-byte prompt.
func BenchmarkHashes(b *testing.B) {
	x := New(Config{ChunkBytes: 64, BytesPerToken: 4})
	p := text("p", 8000)
	var dst []uint64
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		dst = x.Hashes(dst[:0], p)
	}
}

// One prompt takes at most MaxRequestShare of a worker's share, in its
// leading chunks, in the worker's own share and in its peers' alike: a
// long prompt recorded after a short one leaves the short one's prefix
// where it was.
func TestRecordCapsOnePromptsShare(t *testing.T) {
	for _, peer := range []bool{false, true} {
		t.Run(fmt.Sprintf("peer=%v", peer), func(t *testing.T) {
			x := New(Config{ChunkBytes: 64, BytesPerToken: 4, MaxRequestShare: 0.5})
			x.Observe(fw("a", 10)) // 10 chunks
			record := func(prompt string) {
				t.Helper()
				hs := x.Hashes(nil, prompt)
				var err error
				if peer {
					err = x.RecordPeer("m", "a", hs)
				} else {
					err = x.RecordHashes("m", "a", hs)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			victim, long := text("victim", 4*64), text("long", 40*64)
			record(victim)
			record(long)
			if s, _ := x.Stats("a"); s.Chunks != 9 {
				t.Fatalf("a holds %d chunks, want 4 + 5 (half of 10 for the long prompt)", s.Chunks)
			}
			if got := hitsOf(x.Lookup("m", victim)); got["a"] != 4 {
				t.Fatalf("victim hits %v, want a 4: the long prompt pushed it out", got)
			}
			if got := hitsOf(x.Lookup("m", long)); got["a"] != 5 {
				t.Fatalf("long prompt hits %v, want its 5 leading chunks", got)
			}
		})
	}
	x := New(Config{ChunkBytes: 64, BytesPerToken: 4, MaxRequestShare: 1})
	x.Observe(fw("a", 10))
	hs := x.Hashes(nil, text("p", 3*64))
	if err := x.RecordHashes("m", "nobody", hs); !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("unknown worker: %v", err)
	}
	if err := x.RecordHashes("n", "a", hs); !errors.Is(err, ErrOtherModel) {
		t.Fatalf("other model: %v", err)
	}
	if x.Len("m") != 0 || x.Len("n") != 0 {
		t.Fatal("a refused record left chunks")
	}
}
