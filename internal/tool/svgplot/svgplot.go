// Package svgplot draws small line and scatter plots as standalone SVG
// documents, with nice axis ticks, a grid, a legend and optional point
// labels. It has no dependencies beyond the standard library and is meant
// for reports of commands and benchmarks, not for interactive charts.
package svgplot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"unicode/utf8"
)

// Point is one data point; Label, when set, is written next to it.
type Point struct {
	X, Y  float64
	Label string
}

// Series is a named set of points drawn in one color: joined by a line in
// the given order when Line is set, and marked with a dot each unless
// NoMarkers is set.
type Series struct {
	Name      string
	Points    []Point
	Line      bool
	NoMarkers bool
}

// Plot is a whole chart. Width and Height are in pixels (0 means 720 by
// 480). The axes span the data, widened to nice tick values.
type Plot struct {
	Title, XLabel, YLabel string
	Width, Height         int
	Series                []Series
}

var (
	// ErrNoData means the plot has no point to draw.
	ErrNoData = errors.New("svgplot: no data points")
	// ErrNonFinite means a point has a NaN or infinite coordinate.
	ErrNonFinite = errors.New("svgplot: non-finite coordinate")
)

// palette is a colorblind-friendly set of series colors (Okabe and Ito).
var palette = [...]string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"}

// layout constants in pixels.
const (
	marginLeft   = 72
	marginTop    = 40
	marginBottom = 56
	marginRight  = 24
	legendWidth  = 170
	targetTicks  = 6
)

// WriteSVG renders the plot as an SVG document to w.
func (p *Plot) WriteSVG(w io.Writer) error {
	xmin, xmax, ymin, ymax, err := p.bounds()
	if err != nil {
		return err
	}
	width, height := p.Width, p.Height
	if width <= 0 {
		width = 720
	}
	if height <= 0 {
		height = 480
	}
	right := marginRight
	if p.hasLegend() {
		right += legendWidth
	}
	x0, x1 := float64(marginLeft), float64(width-right)
	y0, y1 := float64(height-marginBottom), float64(marginTop) // y grows downwards
	if x1-x0 < 10 || y0-y1 < 10 {
		return fmt.Errorf("svgplot: %dx%d is too small to draw in", width, height)
	}

	xt := ticks(xmin, xmax, targetTicks)
	yt := ticks(ymin, ymax, targetTicks)
	xlo, xhi := xt.lo, xt.hi
	ylo, yhi := yt.lo, yt.hi
	sx := func(x float64) float64 { return x0 + (x-xlo)/(xhi-xlo)*(x1-x0) }
	sy := func(y float64) float64 { return y0 - (y-ylo)/(yhi-ylo)*(y0-y1) }

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%d" height="%d" fill="white"/>`+"\n", width, height)
	if p.Title != "" {
		text(&b, float64(width)/2, 22, "middle", `font-size="15" font-weight="bold"`, p.Title)
	}

	// Grid, ticks and tick labels.
	b.WriteString(`<g stroke="#e5e5e5" stroke-width="1">` + "\n")
	for _, v := range xt.values() {
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", f(sx(v)), f(y0), f(sx(v)), f(y1))
	}
	for _, v := range yt.values() {
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", f(x0), f(sy(v)), f(x1), f(sy(v)))
	}
	b.WriteString("</g>\n")
	fmt.Fprintf(&b, `<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#333"/>`+"\n", f(x0), f(y1), f(x1-x0), f(y0-y1))
	for _, v := range xt.values() {
		text(&b, sx(v), y0+16, "middle", "", xt.format(v))
	}
	for _, v := range yt.values() {
		text(&b, x0-6, sy(v)+4, "end", "", yt.format(v))
	}
	if p.XLabel != "" {
		text(&b, (x0+x1)/2, float64(height)-14, "middle", "", p.XLabel)
	}
	if p.YLabel != "" {
		fmt.Fprintf(&b, `<text x="0" y="0" text-anchor="middle" transform="translate(18 %s) rotate(-90)">%s</text>`+"\n", f((y0+y1)/2), esc(p.YLabel))
	}

	// Series.
	placed := labeler{width: float64(width), height: float64(height)}
	for i, s := range p.Series {
		color := palette[i%len(palette)]
		fmt.Fprintf(&b, `<g class="series" data-name="%s">`+"\n", esc(s.Name))
		if s.Line && len(s.Points) > 1 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="`, color)
			for k, pt := range s.Points {
				if k > 0 {
					b.WriteByte(' ')
				}
				fmt.Fprintf(&b, "%s,%s", f(sx(pt.X)), f(sy(pt.Y)))
			}
			b.WriteString(`"/>` + "\n")
		}
		for _, pt := range s.Points {
			if !s.NoMarkers {
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3.5" fill="%s"/>`+"\n", f(sx(pt.X)), f(sy(pt.Y)), color)
			}
			if pt.Label != "" {
				lx, ly, anchor := placed.place(sx(pt.X), sy(pt.Y), pt.Label)
				text(&b, lx, ly, anchor, `font-size="10" fill="#333"`, pt.Label)
			}
		}
		b.WriteString("</g>\n")
	}

	// Legend.
	if p.hasLegend() {
		lx := float64(width - right + 16)
		ly := float64(marginTop) + 8
		for i, s := range p.Series {
			if s.Name == "" {
				continue
			}
			color := palette[i%len(palette)]
			if s.Line {
				fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"/>`+"\n", f(lx), f(ly), f(lx+18), f(ly), color)
			}
			if !s.NoMarkers || !s.Line {
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3.5" fill="%s"/>`+"\n", f(lx+9), f(ly), color)
			}
			text(&b, lx+24, ly+4, "start", "", s.Name)
			ly += 18
		}
	}
	b.WriteString("</svg>\n")
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("svgplot: write: %w", err)
	}
	return nil
}

// labeler places point labels greedily: each label takes the first of
// the positions around its point, nearest first, whose (estimated) box
// stays on the canvas and overlaps no label placed before it; when none is
// free, the first position.
type labeler struct {
	width, height float64 // canvas; zero means unbounded
	boxes         []box
}

type box struct{ x0, y0, x1, y1 float64 }

func (b box) overlaps(o box) bool {
	return b.x0 < o.x1 && o.x0 < b.x1 && b.y0 < o.y1 && o.y0 < b.y1
}

// Label metrics at font-size 10: an average glyph width and a line height.
const (
	labelGlyph  = 5.6
	labelHeight = 11
	labelRings  = 4
)

// place returns the text position and anchor for a label at point (x, y).
func (l *labeler) place(x, y float64, label string) (tx, ty float64, anchor string) {
	w := labelGlyph * float64(utf8.RuneCountInString(label))
	type cand struct {
		dx, dy float64
		anchor string
	}
	var cands []cand
	for r := range labelRings {
		up, down := -6-12*float64(r), 14+12*float64(r)
		cands = append(cands, cand{6, up, "start"}, cand{6, down, "start"}, cand{-6, up, "end"}, cand{-6, down, "end"})
	}
	boxOf := func(c cand) box {
		bx := box{x0: x + c.dx, y0: y + c.dy - labelHeight + 2, y1: y + c.dy + 2}
		if c.anchor == "end" {
			bx.x0 -= w
		}
		bx.x1 = bx.x0 + w
		return bx
	}
	onCanvas := func(b box) bool {
		return l.width == 0 || (b.x0 >= 0 && b.y0 >= 0 && b.x1 <= l.width && b.y1 <= l.height)
	}
	chosen := cands[0]
	for _, c := range cands {
		bx := boxOf(c)
		free := onCanvas(bx)
		for _, o := range l.boxes {
			if !free {
				break
			}
			free = !bx.overlaps(o)
		}
		if free {
			chosen = c
			break
		}
	}
	l.boxes = append(l.boxes, boxOf(chosen))
	return x + chosen.dx, y + chosen.dy, chosen.anchor
}

func (p *Plot) hasLegend() bool {
	for _, s := range p.Series {
		if s.Name != "" {
			return true
		}
	}
	return false
}

// bounds returns the data's extent, checking every coordinate.
func (p *Plot) bounds() (xmin, xmax, ymin, ymax float64, err error) {
	xmin, ymin = math.Inf(1), math.Inf(1)
	xmax, ymax = math.Inf(-1), math.Inf(-1)
	n := 0
	for _, s := range p.Series {
		for k, pt := range s.Points {
			if !finite(pt.X) || !finite(pt.Y) {
				return 0, 0, 0, 0, fmt.Errorf("%w: series %q point %d is (%v, %v)", ErrNonFinite, s.Name, k, pt.X, pt.Y)
			}
			xmin, xmax = math.Min(xmin, pt.X), math.Max(xmax, pt.X)
			ymin, ymax = math.Min(ymin, pt.Y), math.Max(ymax, pt.Y)
			n++
		}
	}
	if n == 0 {
		return 0, 0, 0, 0, ErrNoData
	}
	return xmin, xmax, ymin, ymax, nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// axis is a run of evenly spaced nice tick values from lo to hi.
type axis struct {
	lo, hi, step float64
	decimals     int
}

// ticks chooses about n nice tick values (steps of 1, 2 or 5 times a power
// of ten) covering [min, max]. An empty range is widened around its value.
func ticks(min, max float64, n int) axis {
	if max < min {
		min, max = max, min
	}
	if max == min {
		pad := math.Abs(min) * 0.1
		if pad == 0 {
			pad = 1
		}
		min, max = min-pad, max+pad
	}
	step := niceStep((max - min) / float64(n-1))
	a := axis{lo: math.Floor(min/step) * step, hi: math.Ceil(max/step) * step, step: step}
	if d := -int(math.Floor(math.Log10(step))); d > 0 {
		a.decimals = d
	}
	return a
}

// niceStep rounds a raw step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	exp := math.Floor(math.Log10(raw))
	base := math.Pow(10, exp)
	switch frac := raw / base; {
	case frac <= 1:
		return base
	case frac <= 2:
		return 2 * base
	case frac <= 5:
		return 5 * base
	}
	return 10 * base
}

// values lists the ticks from lo to hi.
func (a axis) values() []float64 {
	n := int(math.Round((a.hi - a.lo) / a.step))
	out := make([]float64, 0, n+1)
	for i := 0; i <= n; i++ {
		out = append(out, a.lo+float64(i)*a.step)
	}
	return out
}

// format renders a tick value with as many decimals as the step needs.
func (a axis) format(v float64) string {
	s := strconv.FormatFloat(v, 'f', a.decimals, 64)
	if s == "-0" || (len(s) > 1 && s[0] == '-' && isZero(s[1:])) {
		s = s[1:]
	}
	return s
}

func isZero(s string) bool {
	for _, c := range s {
		if c != '0' && c != '.' {
			return false
		}
	}
	return true
}

// f formats a pixel coordinate.
func f(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func esc(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s)) // writes to a bytes.Buffer cannot fail
	return b.String()
}

func text(b *bytes.Buffer, x, y float64, anchor, attrs, s string) {
	if attrs != "" {
		attrs = " " + attrs
	}
	fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="%s"%s>%s</text>`+"\n", f(x), f(y), anchor, attrs, esc(s))
}
