package toymodel

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func generate(m *Model, prompt []uint32, seed uint64, p Params, n int) ([]uint32, []float64) {
	g := m.NewGenerator(prompt, seed, p)
	var toks []uint32
	var lps []float64
	for range n {
		c := g.Sample()
		g.Accept(c.Token)
		toks = append(toks, c.Token)
		lps = append(lps, c.Logprob)
	}
	return toks, lps
}

func TestDeterministic(t *testing.T) {
	tok := tokenizer.Default()
	prompt := tok.Encode("Once upon a time")
	p := Params{Temperature: 0.8, TopP: 0.95}
	a, _ := generate(New(tok, SeedOf("m"), 0.5), prompt, 7, p, 40)
	b, _ := generate(New(tok, SeedOf("m"), 0.5), prompt, 7, p, 40)
	if !slices.Equal(a, b) {
		t.Fatalf("same model, prompt and seed differ:\n%v\n%v", a, b)
	}
	c, _ := generate(New(tok, SeedOf("m"), 0.5), prompt, 8, p, 40)
	if slices.Equal(a, c) {
		t.Fatalf("seeds 7 and 8 gave the same 40 tokens")
	}
	d, _ := generate(New(tok, SeedOf("other"), 0.5), prompt, 7, p, 40)
	if slices.Equal(a, d) {
		t.Fatalf("models m and other gave the same 40 tokens")
	}
}

func TestDistNormalisedAndSorted(t *testing.T) {
	tok := tokenizer.Default()
	m := New(tok, SeedOf("m"), 0.5)
	for i := range 50 {
		g := m.NewGenerator(tok.Encode(fmt.Sprintf("prompt %d.", i)), 1, Params{Temperature: 1})
		for range 20 {
			d := g.Dist()
			var sum float64
			for k, c := range d.Cands {
				if c.Logprob > 0 {
					t.Fatalf("logprob %v > 0", c.Logprob)
				}
				if k > 0 && less(c, d.Cands[k-1]) {
					t.Fatalf("candidates not sorted at %d", k)
				}
				sum += math.Exp(c.Logprob)
			}
			if math.Abs(sum-1) > 1e-9 || len(d.Cands) < 2 || len(d.Cands) > MaxCandidates {
				t.Fatalf("%d candidates, probability sum %v", len(d.Cands), sum)
			}
			c := g.Sample()
			if got, ok := d.Find(c.Token); !ok || got != c {
				t.Fatalf("sampled %+v, not in the distribution", c)
			}
			g.Accept(c.Token)
		}
	}
}

func TestGreedyIgnoresSeed(t *testing.T) {
	tok := tokenizer.Default()
	m := New(tok, SeedOf("m"), 0.5)
	prompt := tok.Encode("The weather today")
	tests := []struct {
		name string
		p    Params
	}{
		{"temperature 0", Params{Temperature: 0}},
		{"top_k 1", Params{Temperature: 1, TopK: 1}},
		{"tiny top_p", Params{Temperature: 1.5, TopP: 1e-9}},
	}
	want, _ := generate(m, prompt, 1, Params{}, 30)
	g := m.NewGenerator(prompt, 1, Params{})
	for i := range want {
		if top := g.Dist().Cands[0].Token; top != want[i] {
			t.Fatalf("greedy token %d = %d, most likely is %d", i, want[i], top)
		}
		g.Accept(want[i])
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for seed := range uint64(5) {
				got, _ := generate(m, prompt, seed, tt.p, 30)
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d: %v, want greedy %v", seed, got, want)
				}
			}
		})
	}
}

// TestSamplingMatchesDistribution checks the sampled frequency of each of
// the three most likely tokens against its probability (within 5 sd).
func TestSamplingMatchesDistribution(t *testing.T) {
	tok := tokenizer.Default()
	m := New(tok, SeedOf("m"), 0.3)
	prompt := tok.Encode("A hard prompt")
	d := m.NewGenerator(prompt, 0, Params{}).Dist()
	const n = 20000
	counts := map[uint32]int{}
	for seed := range uint64(n) {
		g := m.NewGenerator(prompt, seed, Params{Temperature: 1})
		counts[g.Sample().Token]++
	}
	for _, c := range d.Cands[:3] {
		p := math.Exp(c.Logprob)
		sd := math.Sqrt(n * p * (1 - p))
		if got := float64(counts[c.Token]); math.Abs(got-n*p) > 5*sd {
			t.Fatalf("token %d sampled %v times, expected %.0f ± %.0f", c.Token, got, n*p, sd)
		}
	}
}

func TestResumeAfterSkip(t *testing.T) {
	tok := tokenizer.Default()
	m := New(tok, SeedOf("m"), 0.5)
	prompt := tok.Encode("system\nBe nice.\nuser\nHi\nassistant\n")
	p := Params{Temperature: 0.9, TopP: 0.9, TopK: 10, FrequencyPenalty: 0.5}
	want, _ := generate(m, prompt, 42, p, 25)

	first := m.NewGenerator(prompt, 42, p)
	c := first.Sample()
	if c.Token != want[0] || first.Draws() != DrawsPerToken {
		t.Fatalf("first token %d after %d draws", c.Token, first.Draws())
	}
	g := m.NewGenerator(prompt, 42, p)
	g.Skip(first.Draws())
	g.Accept(c.Token)
	got := []uint32{c.Token}
	for range 24 {
		c := g.Sample()
		g.Accept(c.Token)
		got = append(got, c.Token)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("resumed %v, want %v", got, want)
	}
}

func TestPenaltiesDiscourageRepeats(t *testing.T) {
	tok := tokenizer.Default()
	m := New(tok, SeedOf("m"), 0.9)
	prompt := tok.Encode("Repeat")
	distinct := func(p Params) int {
		toks, _ := generate(m, prompt, 3, p, 60)
		seen := map[uint32]bool{}
		for _, t := range toks {
			seen[t] = true
		}
		return len(seen)
	}
	plain, penalised := distinct(Params{}), distinct(Params{FrequencyPenalty: 2, PresencePenalty: 1})
	if penalised <= plain {
		t.Fatalf("distinct tokens: %d with penalties, %d without", penalised, plain)
	}
}

func meanLogprob(m *Model, prompt []uint32, seed uint64) float64 {
	_, lps := generate(m, prompt, seed, Params{Temperature: 1}, 32)
	var s float64
	for _, lp := range lps {
		s += lp
	}
	return s / float64(len(lps))
}

// TestConfidenceSpread checks the cascade-relevant shape: a small model's
// mean token logprob spreads over about -3..0 with many unsure prompts; a
// large model is sure on most prompts and never less certain than a small
// one.
func TestConfidenceSpread(t *testing.T) {
	tok := tokenizer.Default()
	small := New(tok, SeedOf("small"), 0.5)
	large := New(tok, SeedOf("large"), 0.9)
	const n = 200
	var smallUnsure, largeUnsure int
	lo, hi := 0.0, -10.0
	for i := range n {
		prompt := tok.Encode(fmt.Sprintf("user\nQuestion %d?\nassistant\n", i))
		if small.Certainty(prompt) > large.Certainty(prompt) {
			t.Fatalf("prompt %d: small certainty %v > large %v", i, small.Certainty(prompt), large.Certainty(prompt))
		}
		s, l := meanLogprob(small, prompt, uint64(i)), meanLogprob(large, prompt, uint64(i))
		lo, hi = min(lo, s), max(hi, s)
		if s < -1.2 {
			smallUnsure++
		}
		if l < -1.2 {
			largeUnsure++
		}
	}
	t.Logf("small: mean logprob in [%.2f, %.2f], %d/%d below -1.2; large: %d/%d", lo, hi, smallUnsure, n, largeUnsure, n)
	if lo > -2.5 || hi < -0.3 {
		t.Fatalf("small model's mean logprob spans [%.2f, %.2f], want about -3..0", lo, hi)
	}
	if smallUnsure < n/5 || smallUnsure > 4*n/5 {
		t.Fatalf("small model unsure on %d of %d prompts", smallUnsure, n)
	}
	if largeUnsure > n/10 {
		t.Fatalf("large model unsure on %d of %d prompts", largeUnsure, n)
	}
}

func BenchmarkSample(b *testing.B) {
	tok := tokenizer.Default()
	m := New(tok, SeedOf("m"), 0.5)
	g := m.NewGenerator(tok.Encode("Bench"), 1, Params{Temperature: 0.8, TopP: 0.9})
	for b.Loop() {
		c := g.Sample()
		g.Accept(c.Token)
	}
}
