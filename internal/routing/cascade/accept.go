// Package cascade holds the pure logic of model cascades: the accept_if rule
// that decides whether a step's answer is kept, the extraction of token
// logprobs from engine responses, and the cost/accuracy curve of a threshold
// sweep over an evaluation set.
package cascade

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Stat is the statistic of a step's token logprobs that accept_if compares.
type Stat string

// The statistics accept_if knows.
const (
	// MeanLogprob is the arithmetic mean of the token logprobs.
	MeanLogprob Stat = "mean_logprob"
	// MinLogprob is the smallest token logprob.
	MinLogprob Stat = "min_logprob"
)

// Op is the comparison of an accept_if rule.
type Op string

// The operators accept_if knows.
const (
	// Greater accepts when the statistic is strictly above the threshold.
	Greater Op = ">"
	// GreaterOrEqual accepts when the statistic is at or above the threshold.
	GreaterOrEqual Op = ">="
)

var (
	// ErrInvalidAcceptIf is wrapped by every *SyntaxError of ParseAcceptIf.
	ErrInvalidAcceptIf = errors.New("cascade: invalid accept_if")
	// ErrUnknownStat is returned by ParseStat for a name it does not know.
	ErrUnknownStat = errors.New("cascade: unknown statistic")
)

// ParseStat returns the statistic named s ("mean_logprob" or "min_logprob").
func ParseStat(s string) (Stat, error) {
	switch Stat(s) {
	case MeanLogprob, MinLogprob:
		return Stat(s), nil
	}
	return "", fmt.Errorf("%w %q (want %q or %q)", ErrUnknownStat, s, MeanLogprob, MinLogprob)
}

// Of computes the statistic over logprobs. ok is false when logprobs is
// empty (an answer with no tokens has no statistic) or s is not a known Stat.
func (s Stat) Of(logprobs []float64) (v float64, ok bool) {
	if len(logprobs) == 0 {
		return 0, false
	}
	switch s {
	case MeanLogprob:
		sum := 0.0
		for _, l := range logprobs {
			sum += l
		}
		return sum / float64(len(logprobs)), true
	case MinLogprob:
		m := logprobs[0]
		for _, l := range logprobs[1:] {
			m = math.Min(m, l)
		}
		return m, true
	}
	return 0, false
}

// Accept is a parsed accept_if rule: keep a step's answer when
// Stat(logprobs) Op Threshold.
type Accept struct {
	Stat      Stat
	Op        Op
	Threshold float64
}

// Holds reports whether the rule accepts an answer with these token
// logprobs. An answer with no tokens is never accepted; a NaN statistic
// (a NaN logprob) never passes either.
func (a Accept) Holds(logprobs []float64) bool {
	v, ok := a.Stat.Of(logprobs)
	if !ok {
		return false
	}
	switch a.Op {
	case Greater:
		return v > a.Threshold
	case GreaterOrEqual:
		return v >= a.Threshold
	}
	return false
}

// String renders the rule in the accept_if grammar; ParseAcceptIf reads it
// back to the same rule.
func (a Accept) String() string {
	return string(a.Stat) + " " + string(a.Op) + " " + strconv.FormatFloat(a.Threshold, 'g', -1, 64)
}

// SyntaxError describes why an accept_if string does not parse. Column is
// 1-based and counts characters (runes) of the input.
type SyntaxError struct {
	Input  string
	Column int
	Msg    string
	Hint   string // what was expected; may be empty
}

// Error returns the message with the package prefix and the input.
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("cascade: accept_if %q: %s", e.Input, e.Detail())
}

// Detail returns the message and the column without prefix, for callers
// that name the field themselves (routes[1].cascade[0].accept_if: ...).
func (e *SyntaxError) Detail() string {
	if e.Hint == "" {
		return fmt.Sprintf("%s at column %d", e.Msg, e.Column)
	}
	return fmt.Sprintf("%s at column %d (%s)", e.Msg, e.Column, e.Hint)
}

// Unwrap lets errors.Is(err, ErrInvalidAcceptIf) match.
func (e *SyntaxError) Unwrap() error { return ErrInvalidAcceptIf }

// ParseAcceptIf parses `<mean_logprob|min_logprob> <>|>=> <number>` with any
// white space around the parts, including none ("mean_logprob>-1.2"). The
// number is decimal (optional sign, digits with an optional fraction, an
// optional exponent) and must be finite. Errors are *SyntaxError values
// naming what is wrong and at which column.
func ParseAcceptIf(s string) (Accept, error) {
	p := parser{in: s}
	fail := func(at int, hint, format string, args ...any) (Accept, error) {
		return Accept{}, &SyntaxError{Input: s, Column: utf8.RuneCountInString(s[:at]) + 1, Msg: fmt.Sprintf(format, args...), Hint: hint}
	}
	const (
		wantStat = "want mean_logprob or min_logprob"
		wantOp   = "want > or >="
		wantNum  = "want a decimal number such as -1.25"
	)
	p.skipSpace()
	if p.eof() {
		return fail(0, `want e.g. "mean_logprob > -1.2"`, "empty rule")
	}

	start := p.pos
	name := p.take(isStatChar)
	if name == "" {
		return fail(start, wantStat, "expected a statistic, got %q", p.rest())
	}
	stat, err := ParseStat(name)
	if err != nil {
		return fail(start, wantStat, "unknown statistic %q", name)
	}

	p.skipSpace()
	start = p.pos
	opText := p.take(isOpChar)
	var op Op
	switch Op(opText) {
	case Greater, GreaterOrEqual:
		op = Op(opText)
	case "":
		if p.eof() {
			return fail(start, wantOp, "missing operator")
		}
		return fail(start, wantOp, "expected an operator, got %q", p.word())
	default:
		return fail(start, wantOp, "unknown operator %q", opText)
	}

	p.skipSpace()
	start = p.pos
	if p.eof() {
		return fail(start, wantNum, "missing number after %q", op)
	}
	num := p.word()
	if !isDecimal(num) {
		if isNonFinite(num) {
			return fail(start, "", "threshold must be finite, got %q", num)
		}
		return fail(start, wantNum, "not a number: %q", num)
	}
	p.pos += len(num)
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return fail(start, "", "threshold must be finite, got %q", num)
	}

	p.skipSpace()
	if !p.eof() {
		return fail(p.pos, "", "unexpected trailing text %q", p.rest())
	}
	return Accept{Stat: stat, Op: op, Threshold: v}, nil
}

// parser is a cursor over an accept_if string.
type parser struct {
	in  string
	pos int
}

func (p *parser) eof() bool { return p.pos >= len(p.in) }

func (p *parser) rest() string { return p.in[p.pos:] }

func (p *parser) skipSpace() {
	for !p.eof() {
		r, n := utf8.DecodeRuneInString(p.in[p.pos:])
		if !isSpace(r) {
			return
		}
		p.pos += n
	}
}

// take consumes the longest run of runes satisfying ok and returns it.
func (p *parser) take(ok func(rune) bool) string {
	start := p.pos
	for !p.eof() {
		r, n := utf8.DecodeRuneInString(p.in[p.pos:])
		if !ok(r) {
			break
		}
		p.pos += n
	}
	return p.in[start:p.pos]
}

// word returns, without consuming it, the run of non-space runes at the cursor.
func (p *parser) word() string {
	end := p.pos
	for end < len(p.in) {
		r, n := utf8.DecodeRuneInString(p.in[end:])
		if isSpace(r) {
			break
		}
		end += n
	}
	return p.in[p.pos:end]
}

func isSpace(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\r', '\v', '\f':
		return true
	}
	return false
}

// isStatChar accepts the runes of a statistic's name: anything up to white
// space or an operator, so "mean-logprob" is reported whole.
func isStatChar(r rune) bool { return !isSpace(r) && !isOpChar(r) }

func isOpChar(r rune) bool {
	switch r {
	case '<', '>', '=', '!':
		return true
	}
	return false
}

// isDecimal reports whether s is [+-]?(d+(.d*)?|.d+)([eE][+-]?d+)?.
func isDecimal(s string) bool {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	mant := digits()
	if i < len(s) && s[i] == '.' {
		i++
		mant += digits()
	}
	if mant == 0 {
		return false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}

// isNonFinite reports whether s spells NaN or an infinity.
func isNonFinite(s string) bool {
	s = strings.TrimLeft(s, "+-")
	switch strings.ToLower(s) {
	case "nan", "inf", "infinity":
		return true
	}
	return false
}
