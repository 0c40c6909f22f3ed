package cascade

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Sample is one prompt of an evaluation set: the small model's token
// logprobs on it and whether each model answered it correctly.
type Sample struct {
	ID            string    `json:"id"`
	SmallLogprobs []float64 `json:"small_logprobs"`
	SmallCorrect  bool      `json:"small_correct"`
	LargeCorrect  bool      `json:"large_correct"`
}

// CurvePoint is the outcome of one threshold over an evaluation set:
// the fraction escalated to the large model, the cost relative to always
// asking the large model, and the fraction answered correctly.
type CurvePoint struct {
	Tau       float64 `json:"tau"`
	Escalated float64 `json:"escalated"`
	Cost      float64 `json:"cost"`
	Accuracy  float64 `json:"accuracy"`
}

// CascadeCurve sweeps the two-step cascade "small, then large" over samples
// for each threshold tau, accepting the small answer when stat > tau (the
// rule `<stat> > <tau>`; an answer with no tokens is always escalated).
// Accepted prompts keep the small answer, escalated ones take the large
// one. Cost is smallCost + escalated: every prompt pays the small call,
// escalated ones also the large (cost 1). With no samples it returns nil.
func CascadeCurve(samples []Sample, stat Stat, taus []float64, smallCost float64) []CurvePoint {
	if len(samples) == 0 {
		return nil
	}
	type scored struct {
		v             float64
		ok            bool
		small, larger bool
	}
	scores := make([]scored, len(samples))
	for i, s := range samples {
		v, ok := stat.Of(s.SmallLogprobs)
		scores[i] = scored{v: v, ok: ok, small: s.SmallCorrect, larger: s.LargeCorrect}
	}
	n := float64(len(samples))
	out := make([]CurvePoint, 0, len(taus))
	for _, tau := range taus {
		escalated, correct := 0, 0
		for _, s := range scores {
			if s.ok && s.v > tau {
				if s.small {
					correct++
				}
				continue
			}
			escalated++
			if s.larger {
				correct++
			}
		}
		e := float64(escalated) / n
		out = append(out, CurvePoint{Tau: tau, Escalated: e, Cost: smallCost + e, Accuracy: float64(correct) / n})
	}
	return out
}

// LargeAccuracy is the accuracy of always asking the large model (cost 1),
// the reference point of a cascade curve. With no samples it is 0.
func LargeAccuracy(samples []Sample) float64 {
	if len(samples) == 0 {
		return 0
	}
	c := 0
	for _, s := range samples {
		if s.LargeCorrect {
			c++
		}
	}
	return float64(c) / float64(len(samples))
}

// Sweep is an evaluation set file (testdata/cascade/cascade_sweep.json):
// the samples, the small call's relative cost and the thresholds to sweep.
type Sweep struct {
	Description string    `json:"description,omitempty"`
	SmallCost   float64   `json:"small_cost"`
	Taus        []float64 `json:"taus"`
	Samples     []Sample  `json:"samples"`
}

// ErrInvalidSweep wraps every semantic error of ParseSweep.
var ErrInvalidSweep = errors.New("cascade: invalid sweep")

// LoadSweep reads and parses the sweep file at path.
func LoadSweep(path string) (*Sweep, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cascade: load sweep: %w", err)
	}
	defer f.Close()
	sw, err := ParseSweep(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sw, nil
}

// ParseSweep decodes a sweep from r. Unknown fields are rejected; there
// must be at least one sample and small_cost must be >= 0 (JSON numbers are
// finite). Taus may be empty: callers then bring their own.
func ParseSweep(r io.Reader) (*Sweep, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var sw Sweep
	if err := dec.Decode(&sw); err != nil {
		return nil, fmt.Errorf("cascade: parse sweep: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the JSON object", ErrInvalidSweep)
	}
	if len(sw.Samples) == 0 {
		return nil, fmt.Errorf("%w: samples: at least one required", ErrInvalidSweep)
	}
	if sw.SmallCost < 0 {
		return nil, fmt.Errorf("%w: small_cost: must be >= 0, got %v", ErrInvalidSweep, sw.SmallCost)
	}
	return &sw, nil
}
