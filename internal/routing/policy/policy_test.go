package policy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestParsePolicy(t *testing.T) {
	tests := []struct {
		in      string
		want    Name
		wantErr bool
	}{
		{"least_outstanding", NameLeastOutstanding, false},
		{"weighted", NameWeighted, false},
		{"affinity", NameAffinity, false},
		{"", "", true},
		{"Affinity", "", true},
		{"round_robin", "", true},
		{" weighted", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParsePolicy(tt.in)
			if got != tt.want {
				t.Errorf("ParsePolicy(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if !tt.wantErr {
				if err != nil {
					t.Errorf("ParsePolicy(%q): %v", tt.in, err)
				}
				return
			}
			if !errors.Is(err, ErrUnknownPolicy) {
				t.Fatalf("ParsePolicy(%q) error = %v, want ErrUnknownPolicy", tt.in, err)
			}
			for _, part := range []string{strconv.Quote(tt.in), "least_outstanding", "weighted", "affinity"} {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("error %q does not mention %s", err, part)
				}
			}
		})
	}
}

func TestLeastOutstanding(t *testing.T) {
	tests := []struct {
		name  string
		cands []Candidate
		want  string // "" for -1
	}{
		{"empty", nil, ""},
		{"one", []Candidate{{ID: "a", Load: 9}}, "a"},
		{"minimum", []Candidate{{ID: "a", Load: 3}, {ID: "b", Load: 1}, {ID: "c", Load: 2}}, "b"},
		{"tie to smallest id", []Candidate{{ID: "c", Load: 1}, {ID: "b", Load: 1}, {ID: "d", Load: 1}}, "b"},
		{"tie to smallest id, first in list", []Candidate{{ID: "a", Load: 0}, {ID: "b", Load: 0}}, "a"},
		{"weight ignored", []Candidate{{ID: "a", Load: 2, Weight: 100}, {ID: "b", Load: 1, Weight: 1}}, "b"},
		{"tie to smallest Tie", []Candidate{{ID: "a", Load: 1, Tie: 9}, {ID: "b", Load: 1, Tie: 3}, {ID: "c", Load: 1, Tie: 5}}, "b"},
		{"Tie only among equals", []Candidate{{ID: "a", Load: 0, Tie: 9}, {ID: "b", Load: 1, Tie: 3}}, "a"},
		{"equal Tie to smallest id", []Candidate{{ID: "c", Load: 1, Tie: 3}, {ID: "b", Load: 1, Tie: 3}, {ID: "a", Load: 1, Tie: 4}}, "b"},
		// Design section 3: queue depths a=2, b=0, c=1 give b (r1); with two
		// requests in flight on b the loads are 2, 2, 1 and r2 goes to c.
		{"design section 3, r1", []Candidate{{ID: "a", Load: 2}, {ID: "b", Load: 0}, {ID: "c", Load: 1}}, "b"},
		{"design section 3, r2", []Candidate{{ID: "a", Load: 2}, {ID: "b", Load: 0 + 2}, {ID: "c", Load: 1}}, "c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			i := LeastOutstanding(tt.cands)
			got := ""
			if i >= 0 {
				got = tt.cands[i].ID
			}
			if got != tt.want {
				t.Errorf("LeastOutstanding = %d (%q), want %q", i, got, tt.want)
			}
		})
	}
}

// candidates returns n candidates named worker-0000, ... with the given
// load and weight functions of the index.
func candidates(n int, load, weight func(i int) int) []Candidate {
	out := make([]Candidate, n)
	for i := range out {
		out[i] = Candidate{ID: fmt.Sprintf("worker-%04d", i), Load: load(i), Weight: weight(i)}
	}
	return out
}

func BenchmarkLeastOutstanding(b *testing.B) {
	for _, n := range []int{4, 64, 1024} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			cands := candidates(n, func(i int) int { return (i * 7) % 5 }, func(int) int { return 1 })
			b.ReportAllocs()
			for b.Loop() {
				LeastOutstanding(cands)
			}
		})
	}
}
