package prefixindex

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

func TestPrefixIndexRecordPeer(t *testing.T) {
	// 1000 blocks × 16 tokens × 4 bytes / 64 = 1000 chunks a share.
	newIndex := func() *Index {
		x := New(Config{ChunkBytes: 64, BytesPerToken: 4})
		x.Observe(fw("a", 1000))
		x.Observe(fw("b", 1000))
		return x
	}
	own := text("own", 640)   // 10 chunks
	peer := text("peer", 640) // 10 chunks
	tests := []struct {
		name  string
		run   func(x *Index) error
		check func(t *testing.T, x *Index)
	}{
		{"a peer's prompt is found as the gateway's", func(x *Index) error {
			return x.RecordPeer("m", "a", x.Hashes(nil, peer))
		}, func(t *testing.T, x *Index) {
			if got := hitsOf(x.Lookup("m", peer+text("q", 100))); got["a"] != 10 || len(got) != 1 {
				t.Fatalf("hits %v, want a:10", got)
			}
			if st, _ := x.Stats("a"); st.Chunks != 20 || st.PeerChunks != 10 {
				t.Fatalf("stats %+v, want 10 own and 10 of peers", st)
			}
		}},
		{"unknown worker", func(x *Index) error {
			return x.RecordPeer("m", "zz", x.Hashes(nil, peer))
		}, func(t *testing.T, x *Index) {
			if x.Len("m") != 10 {
				t.Fatalf("len %d, want the own 10 chunks only", x.Len("m"))
			}
		}},
		{"worker of another model", func(x *Index) error {
			return x.RecordPeer("other", "a", x.Hashes(nil, peer))
		}, func(t *testing.T, x *Index) {
			if x.Len("other") != 0 || x.Len("m") != 10 {
				t.Fatalf("len other %d m %d, want 0 and 10", x.Len("other"), x.Len("m"))
			}
		}},
		{"a flood of peer chunks never evicts the gateway's own", func(x *Index) error {
			for i := range 50 {
				if err := x.RecordPeer("m", "a", x.Hashes(nil, text(string(rune('A'+i)), 64*100))); err != nil {
					return err
				}
			}
			return nil
		}, func(t *testing.T, x *Index) {
			if got := hitsOf(x.Lookup("m", own)); got["a"] != 10 {
				t.Fatalf("own prompt hits %v, want a:10", got)
			}
			if st, _ := x.Stats("a"); st.PeerChunks != 1000 || st.Chunks != 1010 {
				t.Fatalf("stats %+v, want the peers' share full at 1000 and the own 10", st)
			}
		}},
		{"the gateway's record moves a peer's chunk to its own share", func(x *Index) error {
			if err := x.RecordPeer("m", "b", x.Hashes(nil, peer)); err != nil {
				return err
			}
			x.Record(x.Lookup("m", peer), "b")
			return nil
		}, func(t *testing.T, x *Index) {
			if st, _ := x.Stats("b"); st.Chunks != 10 || st.PeerChunks != 0 {
				t.Fatalf("stats %+v, want 10 chunks of its own", st)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newIndex()
			x.Record(x.Lookup("m", own), "a")
			err := tt.run(x)
			switch tt.name {
			case "unknown worker":
				if !errors.Is(err, ErrUnknownWorker) {
					t.Fatalf("err %v, want ErrUnknownWorker", err)
				}
			case "worker of another model":
				if !errors.Is(err, ErrOtherModel) {
					t.Fatalf("err %v, want ErrOtherModel", err)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
			}
			tt.check(t, x)
		})
	}
}

func TestPrefixIndexExport(t *testing.T) {
	x := New(Config{ChunkBytes: 64, BytesPerToken: 4})
	x.Observe(fw("a", 1000))
	x.Observe(fw("b", 1000))
	p1, p2 := text("one", 640), text("two", 320)
	x.Record(x.Lookup("m", p1), "a")
	if err := x.RecordPeer("m", "b", x.Hashes(nil, p2)); err != nil {
		t.Fatal(err)
	}
	y := New(Config{ChunkBytes: 64, BytesPerToken: 4})
	y.Observe(fw("a", 1000))
	y.Observe(fw("b", 1000))
	got := map[string]int{}
	x.Export(1<<20, func(m, id string, hs []uint64) {
		got[id] = len(hs)
		if err := y.RecordPeer(m, id, hs); err != nil {
			t.Fatal(err)
		}
	})
	if got["a"] != 10 || got["b"] != 5 {
		t.Fatalf("exported %v, want a:10 b:5", got)
	}
	if h := hitsOf(y.Lookup("m", p1)); h["a"] != 10 {
		t.Fatalf("imported hits %v, want a:10", h)
	}
	if h := hitsOf(y.Lookup("m", p2)); h["b"] != 5 {
		t.Fatalf("imported hits %v, want b:5", h)
	}
	// The limit keeps the most recent chunks: the prompt's first ones.
	z := New(Config{ChunkBytes: 64, BytesPerToken: 4})
	z.Observe(fw("a", 1000))
	x.Export(4, func(m, id string, hs []uint64) {
		if id == "a" {
			_ = z.RecordPeer(m, id, hs)
		}
	})
	if h := hitsOf(z.Lookup("m", p1)); h["a"] != 4 {
		t.Fatalf("limited export hits %v, want a:4", h)
	}
}

// BenchmarkRecordPeer records a peer's 3,000-byte prompt (47 chunks of
// 64 bytes) on a worker: "held" when the gateway sent the worker the same
// prompt itself (the common case of prompts that every replica routes to
// the one worker holding them), "extends" when the peer's prompt continues
// the one held by 10 chunks, "new" when nothing of it is held.
func BenchmarkRecordPeer(b *testing.B) {
	docs := make([]string, 40)
	for i := range docs {
		docs[i] = text(fmt.Sprint("doc", i), 3000)
	}
	for _, bc := range []struct {
		name string
		peer func(i int) string
	}{
		{"held", func(i int) string { return docs[i%len(docs)] }},
		{"extends", func(i int) string { return docs[i%len(docs)] + text(fmt.Sprint("q", i%len(docs)), 640) }},
		{"new", func(i int) string { return text(fmt.Sprint("new", i%400), 3000) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			x := New(Config{ChunkBytes: 64, BytesPerToken: 4})
			x.Observe(fw("a", 100000))
			for _, d := range docs {
				x.Record(x.Lookup("m", d), "a")
			}
			hashes := make([][]uint64, 400)
			for i := range hashes {
				hashes[i] = x.Hashes(nil, bc.peer(i))
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if err := x.RecordPeer("m", "a", hashes[i%len(hashes)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// recordPeerEveryChunk is RecordPeer touching every chunk of the prompt,
// without stopping at the deepest the gateway holds (ImportPeer of the
// prompt's share).
func recordPeerEveryChunk(x *Index, modelID, id string, hashes []uint64) {
	_ = x.ImportPeer(modelID, id, hashes[:min(len(hashes), x.RequestShare(id))])
}

// shares lists each worker's own and peers' chunks, most recent first.
func shares(x *Index) map[string][2][]uint64 {
	out := map[string][2][]uint64{}
	for id, w := range x.workers {
		var s [2][]uint64
		for k, head := range []*node{&w.lru, &w.plru} {
			for n := head.next; n != head; n = n.next {
				s[k] = append(s[k], n.e.hash)
			}
		}
		out[id] = s
	}
	return out
}

// TestRecordPeerStopsWhereTheGatewayHolds: random own and peer records of
// prompts that share prefixes, on workers whose capacity changes, leave
// RecordPeer's index exactly as touching every chunk does, and the
// gateway's own share closed under prefixes after every step.
func TestRecordPeerStopsWhereTheGatewayHolds(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		// Prompts made of a few 64-byte blocks: many share a prefix.
		blocks := make([]string, 6)
		for i := range blocks {
			blocks[i] = text(fmt.Sprint("b", i), 64)
		}
		prompt := func() string {
			var b strings.Builder
			for range 1 + rng.IntN(12) {
				b.WriteString(blocks[rng.IntN(len(blocks))])
			}
			return b.String()
		}
		fast, full := New(Config{ChunkBytes: 64, BytesPerToken: 4}), New(Config{ChunkBytes: 64, BytesPerToken: 4})
		ids := []string{"a", "b"}
		var recorded [][]uint64
		for step := range 400 {
			id := ids[rng.IntN(len(ids))]
			switch op := rng.IntN(10); {
			case op == 0:
				// 8 to 32 chunks a share: evictions are frequent.
				blocksKV := 8 + rng.IntN(25)
				fast.Observe(fw(id, blocksKV))
				full.Observe(fw(id, blocksKV))
				continue
			case step < 2:
				fast.Observe(fw(id, 32))
				full.Observe(fw(id, 32))
				continue
			case op < 5:
				h := fast.Hashes(nil, prompt())
				recorded = append(recorded, h)
				errA, errB := fast.RecordHashes("m", id, h), full.RecordHashes("m", id, h)
				if (errA == nil) != (errB == nil) {
					t.Fatalf("seed %d step %d: own record %v against %v", seed, step, errA, errB)
				}
			default:
				h := fast.Hashes(nil, prompt())
				recorded = append(recorded, h)
				if err := fast.RecordPeer("m", id, h); err != nil {
					if _, known := full.workers[id]; known {
						t.Fatalf("seed %d step %d: %v", seed, step, err)
					}
					continue
				}
				recordPeerEveryChunk(full, "m", id, h)
			}
			if a, b := shares(fast), shares(full); !reflect.DeepEqual(a, b) {
				t.Fatalf("seed %d step %d: shares differ:\n stops: %v\n every chunk: %v", seed, step, a, b)
			}
			for _, w := range fast.workers {
				own := map[uint64]bool{}
				for n := w.lru.next; n != &w.lru; n = n.next {
					own[n.e.hash] = true
				}
				for _, h := range recorded {
					for i := 1; i < len(h); i++ {
						if own[h[i]] && !own[h[i-1]] {
							t.Fatalf("seed %d step %d: %s holds chunk %d of a prompt without chunk %d", seed, step, w.id, i, i-1)
						}
					}
				}
			}
		}
	}
}

// TestPeerRecordsKeepOwnRecency: a peer's record of a prompt the gateway
// holds itself leaves that prompt's recency in the gateway's own share as
// it was. Own prompts A then B fill a worker's share; a peer records A;
// the gateway's C then pushes out its least recent prompt, A (a peer that
// refreshed A would have B pushed out instead).
func TestPeerRecordsKeepOwnRecency(t *testing.T) {
	x := New(Config{ChunkBytes: 64, BytesPerToken: 4, MaxRequestShare: 1})
	x.Observe(fw("a", 2)) // 2 chunks a share
	a, b, c := text("A", 64), text("B", 64), text("C", 64)
	x.Record(x.Lookup("m", a), "a")
	x.Record(x.Lookup("m", b), "a")
	if err := x.RecordPeer("m", "a", x.Hashes(nil, a)); err != nil {
		t.Fatal(err)
	}
	if err := x.ImportPeer("m", "a", x.Hashes(nil, a)); err != nil {
		t.Fatal(err)
	}
	x.Record(x.Lookup("m", c), "a")
	for _, p := range []struct {
		name, prompt string
		held         int
	}{{"A", a, 0}, {"B", b, 1}, {"C", c, 1}} {
		if got := hitsOf(x.Lookup("m", p.prompt))["a"]; got != p.held {
			t.Errorf("prompt %s: %d chunks held, want %d", p.name, got, p.held)
		}
	}
}

// TestImportPeerTakesEveryChunk: a peer's exported list (many prompts,
// more chunks than one prompt's share, ending with a prompt the gateway
// holds itself) is imported whole into a warm index, with its recency.
func TestImportPeerTakesEveryChunk(t *testing.T) {
	x := New(Config{ChunkBytes: 64, BytesPerToken: 4})
	x.Observe(fw("a", 1000)) // 1000 chunks a share, 500 a prompt
	own := x.Hashes(nil, text("own", 640))
	if err := x.RecordHashes("m", "a", own); err != nil {
		t.Fatal(err)
	}
	var exported []uint64
	for i := range 60 {
		exported = append(exported, x.Hashes(nil, text(fmt.Sprint("peer", i), 640))...)
	}
	exported = append(exported, own...) // the peer sent the same prompt: its least recent
	if err := x.ImportPeer("m", "a", exported); err != nil {
		t.Fatal(err)
	}
	if st, _ := x.Stats("a"); st.PeerChunks != 600 || st.Chunks != 610 {
		t.Fatalf("stats %+v, want the peer's 600 chunks beside the own 10", st)
	}
	var got []uint64
	x.Export(1<<20, func(_, _ string, hs []uint64) { got = append(got, hs...) })
	if want := append(append([]uint64(nil), own...), exported[:600]...); !reflect.DeepEqual(got, want) {
		t.Fatalf("the import did not keep the export's recency")
	}
	// Past the capacity, the least recent go.
	if err := x.ImportPeer("m", "a", append(x.Hashes(nil, text("more", 64*1000)), exported...)); err != nil {
		t.Fatal(err)
	}
	if st, _ := x.Stats("a"); st.PeerChunks != 1000 || st.Chunks != 1010 {
		t.Fatalf("stats %+v, want the peers' share full and the own 10", st)
	}
}
