// Package toymodel is the reference engine's deterministic toy language
// model and its sampler.
//
// The next-token distribution is a pure function of the model's weights seed,
// its confidence, the prompt and the last three tokens: a short list of
// candidate tokens (words of the tokenizer's vocabulary drawn Zipf-like, plus
// punctuation) with Gumbel logits scaled by a sharpness. The sharpness comes
// from the prompt's ease (a hash of the prompt, the same for every model) and
// the model's confidence, so a low-confidence ("small") model is unsure on
// many prompts and sure on some, and a high-confidence ("large") model is
// sure on most: its mean token logprob spreads over about -3..0.
//
// Sampling draws exactly DrawsPerToken outputs of a PCG32 stream per token,
// whatever the parameters, so a stream can be resumed elsewhere by advancing
// it over the draws consumed.
package toymodel

import (
	"hash/fnv"
	"math"

	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

const (
	// MaxCandidates bounds the tokens with non-zero probability at a step.
	MaxCandidates = 24
	// DrawsPerToken is the number of PCG32 outputs each sampled token consumes.
	DrawsPerToken = 1
	// DefaultConfidence is the confidence of a model configured with 0.
	DefaultConfidence = 0.5
	// streamSeq selects the PCG32 stream; the request seed picks the start.
	streamSeq = 0x746c67617465 // "tlgate"

	minSharpness = 0.15
	maxSharpness = 14.0
)

// Model is one set of toy weights; safe for concurrent use.
type Model struct {
	tok        *tokenizer.Tokenizer
	seed       uint64
	confidence float64

	words, capSpace, capBare []uint32
	comma, period, newline   uint32
	// zipf maps 2^tableBits equal steps of a uniform number to word
	// indices, log-uniformly: word i is drawn with probability about 1/(i+1).
	zipf [1 << tableBits]uint16
}

// SeedOf derives a weights seed from a model id, so every process serving the
// same model id has the same weights.
func SeedOf(model string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(model))
	return h.Sum64()
}

// New returns the model with weights seed and confidence in [0, 1]
// (0 selects DefaultConfidence; 1 is always sure).
func New(tok *tokenizer.Tokenizer, seed uint64, confidence float64) *Model {
	if confidence <= 0 {
		confidence = DefaultConfidence
	}
	m := &Model{
		tok:        tok,
		seed:       seed,
		confidence: min(confidence, 1),
		words:      tok.SpaceWords(),
		capSpace:   tok.CapSpaceWords(),
		capBare:    tok.CapWords(),
	}
	m.comma, _ = tok.ID(",")
	m.period, _ = tok.ID(".")
	m.newline, _ = tok.ID("\n")
	logWords := math.Log(float64(len(m.words)))
	for i := range m.zipf {
		u := (float64(i) + 0.5) / (1 << tableBits)
		m.zipf[i] = uint16(max(0, min(int(math.Exp(u*logWords))-1, len(m.words)-1)))
	}
	return m
}

// Tokenizer returns the model's tokenizer.
func (m *Model) Tokenizer() *tokenizer.Tokenizer { return m.tok }

// Confidence returns the model's confidence.
func (m *Model) Confidence() float64 { return m.confidence }

// Ease returns how easy prompt is, uniform in [0, 1) over prompts and the
// same for every model.
func Ease(prompt []uint32) float64 {
	return unit(hashTokens(prompt))
}

// Certainty returns the model's certainty on prompt in [0, 1]: ease raised to
// (1-c)/c, so confidence 0.5 spreads uniformly and 0.9 is mostly near 1.
func (m *Model) Certainty(prompt []uint32) float64 {
	return m.certainty(Ease(prompt))
}

func (m *Model) certainty(ease float64) float64 {
	if m.confidence >= 1 {
		return 1
	}
	return math.Pow(ease, (1-m.confidence)/m.confidence)
}

// Candidate is a token with its logprob under the model (before temperature,
// penalties, top-k or top-p).
type Candidate struct {
	Token   uint32
	Logprob float64
}

// Dist is a next-token distribution: Cands sorted by Logprob, highest first
// (ties by token id), with probabilities summing to 1.
type Dist struct {
	Cands []Candidate
	buf   [MaxCandidates]Candidate
}

// Find returns the candidate for token, if it has non-zero probability.
func (d *Dist) Find(token uint32) (Candidate, bool) {
	for _, c := range d.Cands {
		if c.Token == token {
			return c, true
		}
	}
	return Candidate{}, false
}

// context classes of the previous token.
const (
	classWord = iota
	classPunct
	classSentenceEnd
	classLineStart
)

func (m *Model) class(tok uint32) int {
	p := m.tok.Piece(tok)
	if p == "" {
		return classWord
	}
	switch p[len(p)-1] {
	case '\n':
		return classLineStart
	case '.', '!', '?':
		return classSentenceEnd
	case ',', ';', ':', '-', '(', '"':
		return classPunct
	}
	return classWord
}

// next fills d with the distribution after the context key and last token.
func (m *Model) next(d *Dist, key uint64, prev uint32, sharpness float64) {
	class := m.class(prev)
	d.Cands = d.buf[:0]
	for j := range MaxCandidates {
		h := mix(key + uint64(j+1)*0x9e3779b97f4a7c15)
		tok := m.pick(h, class)
		if _, dup := d.Find(tok); dup {
			continue
		}
		g := gumbel[mix(h^0x5851f42d4c957f2d)>>(64-tableBits)]
		d.Cands = append(d.Cands, Candidate{Token: tok, Logprob: sharpness * g})
	}
	sortCands(d.Cands)
	top := d.Cands[0].Logprob
	var sum float64
	for _, c := range d.Cands {
		sum += math.Exp(c.Logprob - top)
	}
	lse := top + math.Log(sum)
	for i := range d.Cands {
		d.Cands[i].Logprob -= lse
	}
}

// pick chooses one candidate token from hash h given the previous token's
// class: words drawn Zipf-like (frequent words more often), some commas and
// periods, capitalised words to start sentences and lines.
func (m *Model) pick(h uint64, class int) uint32 {
	r := h & 0xff
	words := m.words
	switch class {
	case classSentenceEnd:
		if r < 24 {
			return m.newline
		}
		words = m.capSpace
	case classLineStart:
		words = m.capBare
	case classWord:
		if r < 18 {
			return m.comma
		}
		if r < 34 {
			return m.period
		}
	}
	return words[m.zipf[(h>>8)&(1<<tableBits-1)]]
}

func (m *Model) sharpness(certainty float64) float64 {
	return minSharpness * math.Pow(maxSharpness/minSharpness, certainty)
}

// sortCands sorts by Logprob descending, ties by Token ascending (insertion
// sort: at most MaxCandidates elements).
func sortCands(c []Candidate) {
	for i := 1; i < len(c); i++ {
		for j := i; j > 0 && less(c[j], c[j-1]); j-- {
			c[j], c[j-1] = c[j-1], c[j]
		}
	}
}

func less(a, b Candidate) bool {
	if a.Logprob != b.Logprob {
		return a.Logprob > b.Logprob
	}
	return a.Token < b.Token
}

// mix is the splitmix64 finaliser.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func hashTokens(ids []uint32) uint64 {
	h := uint64(0x6a09e667f3bcc908)
	for _, id := range ids {
		h = mix(h ^ uint64(id))
	}
	return mix(h ^ uint64(len(ids)))
}

// unit maps the top 53 bits of x to [0, 1).
func unit(x uint64) float64 { return float64(x>>11) / (1 << 53) }

// tableBits sizes the quantile tables that replace per-token logarithms.
const tableBits = 12

// gumbel holds the standard Gumbel distribution's quantiles at the midpoints
// of 2^tableBits equal steps.
var gumbel = func() (g [1 << tableBits]float64) {
	for i := range g {
		u := (float64(i) + 0.5) / (1 << tableBits)
		g[i] = -math.Log(-math.Log(u))
	}
	return g
}()
