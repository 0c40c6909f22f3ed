package cascade

import (
	"errors"
	"math"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestParseAcceptIf(t *testing.T) {
	valid := []struct {
		in   string
		want Accept
	}{
		{"mean_logprob > -1.2", Accept{MeanLogprob, Greater, -1.2}},
		{"mean_logprob>-1.2", Accept{MeanLogprob, Greater, -1.2}},
		{"  mean_logprob\t>=\n-1.2  ", Accept{MeanLogprob, GreaterOrEqual, -1.2}},
		{"min_logprob >= -3", Accept{MinLogprob, GreaterOrEqual, -3}},
		{"min_logprob>0", Accept{MinLogprob, Greater, 0}},
		{"min_logprob > +.5", Accept{MinLogprob, Greater, 0.5}},
		{"mean_logprob > -2.5e-1", Accept{MeanLogprob, Greater, -0.25}},
		{"mean_logprob > 1E2", Accept{MeanLogprob, Greater, 100}},
		{"mean_logprob > 3.", Accept{MeanLogprob, Greater, 3}},
	}
	for _, tc := range valid {
		t.Run("valid/"+tc.in, func(t *testing.T) {
			got, err := ParseAcceptIf(tc.in)
			if err != nil {
				t.Fatalf("ParseAcceptIf(%q): %v", tc.in, err)
			}
			if got != tc.want {
				t.Fatalf("ParseAcceptIf(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			back, err := ParseAcceptIf(got.String())
			if err != nil || back != got {
				t.Fatalf("round trip of %q via %q = %+v, %v", tc.in, got.String(), back, err)
			}
		})
	}

	invalid := []struct {
		in, want string
	}{
		{"", `empty rule at column 1 (want e.g. "mean_logprob > -1.2")`},
		{"   \t", `empty rule at column 1 (want e.g. "mean_logprob > -1.2")`},
		{"avg_logprob > -1", `unknown statistic "avg_logprob" at column 1 (want mean_logprob or min_logprob)`},
		{"  mean-logprob > -1", `unknown statistic "mean-logprob" at column 3 (want mean_logprob or min_logprob)`},
		{"> -1", `expected a statistic, got "> -1" at column 1 (want mean_logprob or min_logprob)`},
		{"mean_logprob => -1.2", `unknown operator "=>" at column 14 (want > or >=)`},
		{"mean_logprob < -1.2", `unknown operator "<" at column 14 (want > or >=)`},
		{"mean_logprob == -1.2", `unknown operator "==" at column 14 (want > or >=)`},
		{"mean_logprob>>-1.2", `unknown operator ">>" at column 13 (want > or >=)`},
		{"mean_logprob -1.2", `expected an operator, got "-1.2" at column 14 (want > or >=)`},
		{"mean_logprob", `missing operator at column 13 (want > or >=)`},
		{"mean_logprob >", `missing number after ">" at column 15 (want a decimal number such as -1.25)`},
		{"mean_logprob >=   ", `missing number after ">=" at column 19 (want a decimal number such as -1.25)`},
		{"mean_logprob > abc", `not a number: "abc" at column 16 (want a decimal number such as -1.25)`},
		{"mean_logprob > -1.2abc", `not a number: "-1.2abc" at column 16 (want a decimal number such as -1.25)`},
		{"mean_logprob > 1_000", `not a number: "1_000" at column 16 (want a decimal number such as -1.25)`},
		{"mean_logprob > 0x1p-2", `not a number: "0x1p-2" at column 16 (want a decimal number such as -1.25)`},
		{"mean_logprob > .", `not a number: "." at column 16 (want a decimal number such as -1.25)`},
		{"mean_logprob > 1e", `not a number: "1e" at column 16 (want a decimal number such as -1.25)`},
		{"mean_logprob > NaN", `threshold must be finite, got "NaN" at column 16`},
		{"mean_logprob > -Inf", `threshold must be finite, got "-Inf" at column 16`},
		{"mean_logprob > infinity", `threshold must be finite, got "infinity" at column 16`},
		{"mean_logprob > 1e999", `threshold must be finite, got "1e999" at column 16`},
		{"mean_logprob > -1.2 and more", `unexpected trailing text "and more" at column 21`},
		{"mean_logprob > -1 -2", `unexpected trailing text "-2" at column 19`},
		{"mean_logprob > ¹", `not a number: "¹" at column 16 (want a decimal number such as -1.25)`},
		{"é mean_logprob", `unknown statistic "é" at column 1 (want mean_logprob or min_logprob)`},
		{"mean_logprob > 1 é", `unexpected trailing text "é" at column 18`},
		{"mean_logprob > 1 ×", `unexpected trailing text "×" at column 18`},
	}
	for _, tc := range invalid {
		t.Run("invalid/"+tc.in, func(t *testing.T) {
			_, err := ParseAcceptIf(tc.in)
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("ParseAcceptIf(%q) error = %v, want *SyntaxError", tc.in, err)
			}
			if !errors.Is(err, ErrInvalidAcceptIf) {
				t.Fatalf("error %v does not wrap ErrInvalidAcceptIf", err)
			}
			if se.Detail() != tc.want {
				t.Fatalf("ParseAcceptIf(%q) detail\n got %s\nwant %s", tc.in, se.Detail(), tc.want)
			}
		})
	}

	holds := []struct {
		rule     string
		logprobs []float64
		want     bool
	}{
		{"mean_logprob > -1", []float64{-0.5, -1.5}, false}, // mean exactly -1: boundary
		{"mean_logprob >= -1", []float64{-0.5, -1.5}, true},
		{"mean_logprob > -1", []float64{-0.5, -1.4}, true},
		{"mean_logprob >= -1", []float64{-0.6, -1.5}, false},
		{"min_logprob > -1.5", []float64{-0.5, -1.5}, false}, // min exactly -1.5
		{"min_logprob >= -1.5", []float64{-0.5, -1.5}, true},
		{"min_logprob > -2", []float64{-0.1, -3, -0.1}, false},
		{"mean_logprob > -2", []float64{-0.1, -3, -0.1}, true},
		{"mean_logprob > -100", nil, false}, // no tokens: never accepted
		{"mean_logprob >= -100", []float64{}, false},
		{"min_logprob >= -100", []float64{}, false},
		{"mean_logprob > -100", []float64{math.NaN()}, false},
	}
	for _, tc := range holds {
		a, err := ParseAcceptIf(tc.rule)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.Holds(tc.logprobs); got != tc.want {
			t.Errorf("%q.Holds(%v) = %v, want %v", tc.rule, tc.logprobs, got, tc.want)
		}
	}
	if (Accept{}).Holds([]float64{0}) {
		t.Error("the zero Accept holds; an unknown statistic must never accept")
	}
	if (Accept{Stat: MeanLogprob, Op: "<", Threshold: 0}).Holds([]float64{-1}) {
		t.Error("an unknown operator holds")
	}
}

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Stat
		wantErr bool
	}{
		{"mean_logprob", MeanLogprob, false},
		{"min_logprob", MinLogprob, false},
		{"max_logprob", "", true},
		{"", "", true},
	} {
		got, err := ParseStat(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseStat(%q) = %q, %v", tc.in, got, err)
		}
		if tc.wantErr && !errors.Is(err, ErrUnknownStat) {
			t.Errorf("ParseStat(%q) error %v does not wrap ErrUnknownStat", tc.in, err)
		}
	}
}

func FuzzParseAcceptIf(f *testing.F) {
	for _, s := range []string{
		"mean_logprob > -1.2", "min_logprob>=0", "mean_logprob>-1.2", " min_logprob >= 1e-300 ",
		"mean_logprob => 1", "", "mean_logprob > NaN", "mean_logprob > -0", "min_logprob > 4.9e-324",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAcceptIf(s)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || se.Column < 1 {
				t.Fatalf("ParseAcceptIf(%q): error %v is not a *SyntaxError with a column", s, err)
			}
			return
		}
		if math.IsNaN(a.Threshold) || math.IsInf(a.Threshold, 0) {
			t.Fatalf("ParseAcceptIf(%q) accepted a non-finite threshold %v", s, a.Threshold)
		}
		back, err := ParseAcceptIf(a.String())
		if err != nil {
			t.Fatalf("String() %q of %q does not parse: %v", a.String(), s, err)
		}
		if back != a || back.String() != a.String() {
			t.Fatalf("round trip %q -> %+v -> %q -> %+v", s, a, a.String(), back)
		}
	})
}
