package pcg

import (
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// TestKnownSequence checks the outputs of the reference pcg32-demo
// (pcg32_srandom_r(&rng, 42, 54)).
func TestKnownSequence(t *testing.T) {
	want := []uint32{0xa15c02b7, 0x7b47f409, 0xba1d3330, 0x83d2f293, 0xbfa4784b, 0xcbed606e}
	p := New(42, 54)
	for i, w := range want {
		if got := p.Uint32(); got != w {
			t.Fatalf("output %d = %#x, want %#x", i, got, w)
		}
	}
}

func TestAdvanceEqualsStepping(t *testing.T) {
	for _, n := range []uint64{0, 1, 2, 3, 17, 64, 1000, 4097} {
		stepped := New(7, 11)
		for range n {
			stepped.Uint32()
		}
		jumped := New(7, 11)
		jumped.Advance(n)
		if stepped != jumped {
			t.Fatalf("Advance(%d) = %+v, stepping gives %+v", n, jumped, stepped)
		}
		if a, b := stepped.Uint32(), jumped.Uint32(); a != b {
			t.Fatalf("after %d: next %#x vs %#x", n, a, b)
		}
	}
}

func TestFloat64OpenInterval(t *testing.T) {
	p := New(1, 2)
	for range 10000 {
		if f := p.Float64(); f <= 0 || f >= 1 {
			t.Fatalf("Float64 = %v, want in (0,1)", f)
		}
	}
	lo := PCG32{}
	if f := (&lo).Float64(); f <= 0 {
		t.Fatalf("Float64 of zero output = %v", f)
	}
}
