package cascade

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sweepPath = "../../../testdata/cascade/cascade_sweep.json"

type oracle struct {
	SmallCost float64                 `json:"small_cost"`
	Curves    map[string][]CurvePoint `json:"curves"`
}

func round6(x float64) float64 { return math.Round(x*1e6) / 1e6 }

func TestCascadeCurveMatchesFixture(t *testing.T) {
	sw, err := LoadSweep(sweepPath)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("../../../testdata/cascade/cascade_oracle.json")
	if err != nil {
		t.Fatal(err)
	}
	var want oracle
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if len(sw.Samples) != 200 || len(sw.Taus) != 13 || sw.SmallCost != want.SmallCost {
		t.Fatalf("fixture: %d samples, %d taus, small_cost %v (oracle %v)", len(sw.Samples), len(sw.Taus), sw.SmallCost, want.SmallCost)
	}
	for _, stat := range []Stat{MeanLogprob, MinLogprob} {
		t.Run(string(stat), func(t *testing.T) {
			exp := want.Curves[string(stat)]
			got := CascadeCurve(sw.Samples, stat, sw.Taus, sw.SmallCost)
			if len(got) != 13 || len(exp) != 13 {
				t.Fatalf("got %d points, oracle %d, want 13", len(got), len(exp))
			}
			for i := range exp {
				g, e := got[i], exp[i]
				for _, f := range []struct {
					name      string
					got, want float64
				}{
					{"tau", g.Tau, e.Tau},
					{"escalated", round6(g.Escalated), e.Escalated},
					{"cost", round6(g.Cost), e.Cost},
					{"accuracy", round6(g.Accuracy), e.Accuracy},
				} {
					if math.Abs(f.got-f.want) > 1e-9 {
						t.Errorf("tau %v: %s = %v, oracle %v", e.Tau, f.name, f.got, f.want)
					}
				}
			}
		})
	}
	// The design document's table (section 2.6) and the always-large reference.
	if got := LargeAccuracy(sw.Samples); got != 0.935 {
		t.Errorf("LargeAccuracy = %v, want 0.935", got)
	}
}

func TestCascadeCurveSemantics(t *testing.T) {
	samples := []Sample{
		{ID: "sure-right", SmallLogprobs: []float64{-0.1, -0.1}, SmallCorrect: true, LargeCorrect: true},
		{ID: "on-the-line", SmallLogprobs: []float64{-1, -1}, SmallCorrect: true, LargeCorrect: false},
		{ID: "unsure-wrong", SmallLogprobs: []float64{-3}, SmallCorrect: false, LargeCorrect: true},
		{ID: "empty", SmallLogprobs: nil, SmallCorrect: true, LargeCorrect: false},
	}
	got := CascadeCurve(samples, MeanLogprob, []float64{-1, -5, 0}, 0.25)
	want := []CurvePoint{
		// -1: accept only sure-right (on-the-line is not > -1); escalate 3.
		{Tau: -1, Escalated: 0.75, Cost: 1, Accuracy: 0.5},
		// -5: accept all but the empty answer, which is escalated anyway.
		{Tau: -5, Escalated: 0.25, Cost: 0.5, Accuracy: 0.5},
		{Tau: 0, Escalated: 1, Cost: 1.25, Accuracy: 0.5},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d points", len(got))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("point %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if CascadeCurve(nil, MeanLogprob, []float64{0}, 0.1) != nil {
		t.Error("CascadeCurve with no samples is not nil")
	}
	if LargeAccuracy(nil) != 0 {
		t.Error("LargeAccuracy(nil) != 0")
	}
}

func TestParseSweep(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		wantErr    string
	}{
		{"ok", `{"small_cost":0.1,"taus":[-1],"samples":[{"id":"a","small_logprobs":[-1],"small_correct":true,"large_correct":false}]}`, ""},
		{"unknown field", `{"small_cost":0.1,"samples":[{"id":"a","smal_logprobs":[]}]}`, `unknown field "smal_logprobs"`},
		{"no samples", `{"small_cost":0.1,"samples":[]}`, "samples: at least one required"},
		{"negative cost", `{"small_cost":-1,"samples":[{"id":"a"}]}`, "small_cost: must be >= 0, got -1"},
		{"trailing", `{"small_cost":0.1,"samples":[{"id":"a"}]} {}`, "trailing data"},
		{"not JSON", `nope`, "parse sweep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sw, err := ParseSweep(strings.NewReader(tc.body))
			if tc.wantErr == "" {
				if err != nil || len(sw.Samples) != 1 || sw.Samples[0].ID != "a" || !sw.Samples[0].SmallCorrect {
					t.Fatalf("ParseSweep = %+v, %v", sw, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ParseSweep error = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
	_, err := LoadSweep(filepath.Join(t.TempDir(), "missing.json"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("LoadSweep of a missing file: %v", err)
	}
}

func BenchmarkCascadeCurve(b *testing.B) {
	sw, err := LoadSweep(sweepPath)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		CascadeCurve(sw.Samples, MeanLogprob, sw.Taus, sw.SmallCost)
	}
}

func BenchmarkParseAcceptIf(b *testing.B) {
	for b.Loop() {
		if _, err := ParseAcceptIf("mean_logprob >= -1.25"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLogprobsOf(b *testing.B) {
	body := []byte(`{"choices":[{"logprobs":{"content":[` + strings.Repeat(`{"token":"a","logprob":-0.5,"bytes":[97],"top_logprobs":[]},`, 255) + `{"token":"a","logprob":-0.5}]}}]}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := LogprobsOf(body); err != nil {
			b.Fatal(err)
		}
	}
}
