package toymodel

import (
	"math"

	"github.com/tlgate/tlgate/enginesim/pcg"
)

// Params are the sampling parameters of one request.
type Params struct {
	// Temperature 0 is greedy (the most likely token after penalties).
	Temperature float64
	// TopP keeps the smallest set of most likely tokens whose probability
	// reaches it; 0 or 1 is off.
	TopP float64
	// TopK keeps the K most likely tokens; 0 is off.
	TopK int
	// PresencePenalty and FrequencyPenalty lower the logits of tokens
	// already generated (once, and per occurrence), as in OpenAI's API.
	PresencePenalty, FrequencyPenalty float64
}

// Generator is the state of one sequence: the context and the seed's PCG32
// stream. Not safe for concurrent use.
type Generator struct {
	m          *Model
	sharpness  float64
	promptHash uint64
	last       [3]uint32
	rng        pcg.PCG32
	draws      uint64
	p          Params
	counts     map[uint32]int
	dist       Dist
	valid      bool
	order      [MaxCandidates]int
	weight     [MaxCandidates]float64
}

// NewGenerator starts a sequence after prompt, sampling from the PCG32
// stream of seed.
func (m *Model) NewGenerator(prompt []uint32, seed uint64, p Params) *Generator {
	g := &Generator{
		m:          m,
		promptHash: hashTokens(prompt),
		rng:        pcg.New(seed, streamSeq),
		p:          p,
	}
	g.sharpness = m.sharpness(m.certainty(unit(g.promptHash)))
	for i := range g.last {
		if k := len(prompt) - len(g.last) + i; k >= 0 {
			g.last[i] = prompt[k]
		} else {
			g.last[i] = math.MaxUint32
		}
	}
	if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		g.counts = make(map[uint32]int)
	}
	return g
}

// Dist returns the distribution of the next token; valid until Accept.
func (g *Generator) Dist() *Dist {
	if !g.valid {
		key := g.m.seed ^ g.promptHash
		for _, t := range g.last {
			key = mix(key ^ uint64(t))
		}
		g.m.next(&g.dist, key, g.last[len(g.last)-1], g.sharpness)
		g.valid = true
	}
	return &g.dist
}

// Sample draws DrawsPerToken outputs and picks the next token from Dist
// under the sampling parameters. It does not Accept the token.
func (g *Generator) Sample() Candidate {
	d := g.Dist()
	u := g.rng.Float64()
	g.draws += DrawsPerToken
	n := len(d.Cands)
	for i := range n {
		g.order[i] = i
		g.weight[i] = d.Cands[i].Logprob
		if g.counts != nil {
			if c := g.counts[d.Cands[i].Token]; c > 0 {
				g.weight[i] -= g.p.PresencePenalty + g.p.FrequencyPenalty*float64(c)
			}
		}
	}
	order := g.order[:n]
	if g.counts != nil {
		g.sortOrder(order)
	}
	if g.p.Temperature <= 0 {
		return d.Cands[order[0]]
	}
	if g.p.TopK > 0 && g.p.TopK < len(order) {
		order = order[:g.p.TopK]
	}
	top := g.weight[order[0]] / g.p.Temperature
	var sum float64
	for _, i := range order {
		g.weight[i] = math.Exp(g.weight[i]/g.p.Temperature - top)
		sum += g.weight[i]
	}
	if g.p.TopP > 0 && g.p.TopP < 1 {
		var cum float64
		for k, i := range order {
			cum += g.weight[i] / sum
			if cum >= g.p.TopP {
				order = order[:k+1]
				break
			}
		}
		sum = 0
		for _, i := range order {
			sum += g.weight[i]
		}
	}
	target := u * sum
	for _, i := range order {
		target -= g.weight[i]
		if target < 0 {
			return d.Cands[i]
		}
	}
	return d.Cands[order[len(order)-1]]
}

// sortOrder sorts candidate indices by penalised weight descending, ties by
// token id.
func (g *Generator) sortOrder(order []int) {
	c := g.dist.Cands
	before := func(a, b int) bool {
		if g.weight[a] != g.weight[b] {
			return g.weight[a] > g.weight[b]
		}
		return c[a].Token < c[b].Token
	}
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && before(order[j], order[j-1]); j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
}

// Accept appends tok to the context.
func (g *Generator) Accept(tok uint32) {
	copy(g.last[:], g.last[1:])
	g.last[len(g.last)-1] = tok
	if g.counts != nil {
		g.counts[tok]++
	}
	g.valid = false
}

// Skip advances the stream over draws outputs consumed elsewhere (a prefill
// worker's first token).
func (g *Generator) Skip(draws uint64) {
	g.rng.Advance(draws)
	g.draws += draws
}

// Draws returns the stream outputs consumed so far (including skipped ones).
func (g *Generator) Draws() uint64 { return g.draws }
