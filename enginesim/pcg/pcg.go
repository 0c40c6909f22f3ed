// Package pcg is the PCG32 random number generator (O'Neill's
// pcg32_random_r: 64-bit LCG state, XSH RR output) with O(log n) jump-ahead.
//
// The reference engine samples every token from a PCG32 stream seeded by the
// request's seed, so a decode worker can continue the stream a prefill worker
// started by advancing it over the draws already consumed.
package pcg

import "math/bits"

const multiplier = 6364136223846793005

// PCG32 is one generator. The zero value is a valid (if dull) stream; use New.
type PCG32 struct {
	state uint64
	inc   uint64
}

// New returns the generator pcg32_srandom_r(seed, seq) returns: seed picks
// the starting point, seq picks one of 2^63 streams.
func New(seed, seq uint64) PCG32 {
	p := PCG32{inc: seq<<1 | 1}
	p.Uint32()
	p.state += seed
	p.Uint32()
	return p
}

// Uint32 returns the next 32-bit output (one draw).
func (p *PCG32) Uint32() uint32 {
	old := p.state
	p.state = old*multiplier + p.inc
	xorshifted := uint32(((old >> 18) ^ old) >> 27)
	rot := int(old >> 59)
	return bits.RotateLeft32(xorshifted, -rot)
}

// Float64 returns a uniform number in the open interval (0, 1) from exactly
// one draw.
func (p *PCG32) Float64() float64 {
	return (float64(p.Uint32()) + 0.5) / (1 << 32)
}

// Advance moves the stream delta draws forward in O(log delta) steps, as if
// Uint32 had been called delta times.
func (p *PCG32) Advance(delta uint64) {
	curMult, curPlus := uint64(multiplier), p.inc
	accMult, accPlus := uint64(1), uint64(0)
	for delta > 0 {
		if delta&1 == 1 {
			accMult *= curMult
			accPlus = accPlus*curMult + curPlus
		}
		curPlus = (curMult + 1) * curPlus
		curMult *= curMult
		delta >>= 1
	}
	p.state = accMult*p.state + accPlus
}
