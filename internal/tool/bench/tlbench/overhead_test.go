package tlbench

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestPairedRatios(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b []float64
		want []float64
	}{
		{"each round", []float64{110, 120, 99}, []float64{100, 100, 90}, []float64{1.1, 1.2, 1.1}},
		{"a round either missed is left out", []float64{110, 0, 120}, []float64{100, 100, 0}, []float64{1.1}},
		{"only the rounds both ran", []float64{110, 120}, []float64{100}, []float64{1.1}},
		{"none", nil, []float64{100}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			near := func(x, y float64) bool { return math.Abs(x-y) < 1e-9 }
			if got := pairedRatios(tc.a, tc.b); !slices.EqualFunc(got, tc.want, near) {
				t.Fatalf("pairedRatios(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
		})
	}
}

// TestOverheadRoundByRound checks that the CPU note gives the median and
// range of the rounds' paired ratios beside the pooled one, and leaves
// them out for a single round.
func TestOverheadRoundByRound(t *testing.T) {
	cells := func(g, gp []float64) []*overheadCell {
		var cs []*overheadCell
		for _, m := range overheadModes {
			cs = append(cs,
				&overheadCell{mode: m.name, path: pathDirect, requests: 100},
				&overheadCell{mode: m.name, path: pathGoProxy, requests: 100, cpu: 50_000_000, roundCPU: gp},
				&overheadCell{mode: m.name, path: pathGateway, requests: 100, cpu: 55_000_000, roundCPU: g})
		}
		return cs
	}
	c := Config{Rounds: 3}
	notes := overheadSection(c, cells([]float64{600, 440, 500}, []float64{500, 400, 500}), "").notes
	want := "round by round (the two measured one after the other), gateway over floor 1.10× (1.00×–1.20×), the median of 3 rounds"
	if !slices.ContainsFunc(notes, func(n string) bool {
		return strings.Contains(n, "CPU per request (streamed)") && strings.Contains(n, want)
	}) {
		t.Errorf("notes lack %q:\n%s", want, strings.Join(notes, "\n"))
	}
	for _, n := range overheadSection(c, cells([]float64{600}, []float64{500}), "").notes {
		if strings.Contains(n, "round by round") {
			t.Errorf("one round, yet: %s", n)
		}
	}
}
