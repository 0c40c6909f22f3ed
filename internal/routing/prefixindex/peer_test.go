package prefixindex

import (
	"errors"
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
