package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// picks runs n picks and returns the ids picked.
func picks(s *SWRR, cands []Candidate, n int) []string {
	out := make([]string, n)
	for i := range out {
		j := s.Pick(cands)
		if j < 0 {
			out[i] = ""
			continue
		}
		out[i] = cands[j].ID
	}
	return out
}

// TestWeightedByCapacity is design section 2.2: capacities 1 (small) and 3
// (big) give big, big, small, big, twice, whatever the order of the
// candidates.
func TestWeightedByCapacity(t *testing.T) {
	want := strings.Fields("big big small big big big small big")
	orders := [][]Candidate{
		{{ID: "small", Weight: 1}, {ID: "big", Weight: 3}},
		{{ID: "big", Weight: 3}, {ID: "small", Weight: 1}},
	}
	for _, cands := range orders {
		var s SWRR
		if got := picks(&s, cands, len(want)); !slices.Equal(got, want) {
			t.Errorf("candidates %v: picks %v, want %v", cands, got, want)
		}
	}
}

func TestSWRRSequences(t *testing.T) {
	tests := []struct {
		name  string
		cands []Candidate
		want  string
	}{
		// The sequence nginx documents for weights 5, 1, 1.
		{"nginx 5,1,1", []Candidate{{ID: "a", Weight: 5}, {ID: "b", Weight: 1}, {ID: "c", Weight: 1}}, "a a b a c a a a a b a c a a"},
		{"equal weights rotate by id", []Candidate{{ID: "c", Weight: 2}, {ID: "a", Weight: 2}, {ID: "b", Weight: 2}}, "a b c a b c"},
		{"weight <= 0 counts as 1", []Candidate{{ID: "x", Weight: 0}, {ID: "y", Weight: -5}}, "x y x y"},
		{"one candidate", []Candidate{{ID: "only", Weight: 7}}, "only only only"},
		{"repeated id counts once", []Candidate{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}, {ID: "a", Weight: 50}}, "a b a b"},
		{"empty", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := strings.Fields(tt.want)
			n := max(len(want), 3)
			var s SWRR
			got := picks(&s, tt.cands, n)
			if len(want) == 0 {
				want = []string{"", "", ""}
			}
			if !slices.Equal(got, want) {
				t.Errorf("picks %v, want %v", got, want)
			}
		})
	}
}

// TestSWRRProportional checks the defining property: over every cycle of
// total-weight picks each candidate is picked exactly its weight times, and
// no candidate is picked more than its share allows in a row.
func TestSWRRProportional(t *testing.T) {
	weightSets := [][]int{
		{1, 3},
		{4, 4, 4, 4},
		{512, 2048, 1024},
		{1, 1, 1, 10},
		{7, 3, 2, 9, 1},
	}
	for _, ws := range weightSets {
		t.Run(fmt.Sprint(ws), func(t *testing.T) {
			cands := make([]Candidate, len(ws))
			total := 0
			for i, w := range ws {
				cands[i] = Candidate{ID: "w" + strconv.Itoa(i), Weight: w}
				total += w
			}
			var s SWRR
			for cycle := range 3 {
				count := make([]int, len(ws))
				for range total {
					count[s.Pick(cands)]++
				}
				if !slices.Equal(count, ws) {
					t.Fatalf("cycle %d: counts %v, want the weights %v", cycle, count, ws)
				}
			}
		})
	}
}

// TestSWRRAbsentMembers checks that a member left out of a few picks keeps
// its counter and that one left out for long is forgotten.
func TestSWRRAbsentMembers(t *testing.T) {
	both := []Candidate{{ID: "big", Weight: 3}, {ID: "small", Weight: 1}}
	onlyBig := both[:1]

	var s SWRR
	picks(&s, both, 1) // big: big=-1, small=1
	if got := picks(&s, onlyBig, 2); !slices.Equal(got, []string{"big", "big"}) {
		t.Fatalf("picks without small = %v", got)
	}
	if c := s.byID["small"].current; c != 1 {
		t.Fatalf("small's counter changed while it was left out: %d, want 1", c)
	}
	// Back: big=-1+3=2, small=1+1=2, tie to big; then small=3 wins.
	if got := picks(&s, both, 2); !slices.Equal(got, []string{"big", "small"}) {
		t.Fatalf("picks after small returned = %v, want [big small]", got)
	}

	picks(&s, onlyBig, 2*forgetAfter)
	if _, ok := s.byID["small"]; ok {
		t.Fatalf("small still remembered after %d picks without it", 2*forgetAfter)
	}
	if len(s.byID) != 1 {
		t.Fatalf("%d members remembered, want 1", len(s.byID))
	}
	// Returning, small starts from zero: big=0+3, small=0+1 → big.
	s.byID["big"].current = 0
	if got := picks(&s, both, 4); !slices.Equal(got, []string{"big", "big", "small", "big"}) {
		t.Fatalf("picks after small was forgotten = %v", got)
	}
}

// TestSWRRChangingOrder checks that the per-index hints never confuse two
// members when the candidates are reordered, shrunk or grown.
func TestSWRRChangingOrder(t *testing.T) {
	base := []Candidate{{ID: "a", Weight: 1}, {ID: "b", Weight: 2}, {ID: "c", Weight: 3}}
	var s, ref SWRR
	for step := range 200 {
		cands := slices.Clone(base)
		switch step % 4 {
		case 1:
			slices.Reverse(cands)
		case 2:
			cands = cands[1:]
		case 3:
			cands = append(cands, Candidate{ID: "d", Weight: 1})
		}
		got := s.Pick(cands)
		// ref sees the same candidates, always in a fresh order, so its hints
		// never match; the two must agree.
		rot := append(slices.Clone(cands[1:]), cands[0])
		ref.hints = nil
		want := ref.Pick(rot)
		if cands[got].ID != rot[want].ID {
			t.Fatalf("step %d: picked %s, want %s", step, cands[got].ID, rot[want].ID)
		}
	}
}

func BenchmarkSWRRPick(b *testing.B) {
	for _, n := range []int{4, 64, 1024} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			cands := candidates(n, func(int) int { return 0 }, func(i int) int { return 1024 * (1 + i%4) })
			var s SWRR
			s.Pick(cands)
			b.ReportAllocs()
			for b.Loop() {
				s.Pick(cands)
			}
		})
	}
}
