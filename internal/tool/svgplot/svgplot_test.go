package svgplot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// element is the part of an SVG element the tests look at.
type element struct {
	name  string
	attrs map[string]string
	text  string
}

// parse decodes an SVG document, failing the test if it is not XML.
func parse(t *testing.T, doc []byte) []element {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var out []element
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, doc)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := element{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			out = append(out, e)
		case xml.CharData:
			if len(out) > 0 {
				out[len(out)-1].text += string(tok)
			}
		}
	}
}

func count(els []element, name string) int {
	n := 0
	for _, e := range els {
		if e.name == name {
			n++
		}
	}
	return n
}

func texts(els []element) []string {
	var out []string
	for _, e := range els {
		if e.name == "text" {
			out = append(out, strings.TrimSpace(e.text))
		}
	}
	return out
}

func TestWriteSVG(t *testing.T) {
	p := Plot{
		Title: "cost <vs> accuracy & more", XLabel: "cost", YLabel: "accuracy",
		Series: []Series{
			{Name: "cascade", Line: true, Points: []Point{{0.1, 0.54, "τ=-3"}, {0.29, 0.66, "τ=-2"}, {0.74, 0.865, "τ=-1"}}},
			{Name: "always large", Points: []Point{{1, 0.935, "large"}}},
			{Points: []Point{{0.5, 0.7, ""}}, NoMarkers: true},
		},
	}
	var buf bytes.Buffer
	if err := p.WriteSVG(&buf); err != nil {
		t.Fatal(err)
	}
	els := parse(t, buf.Bytes())
	if els[0].name != "svg" || els[0].attrs["width"] != "720" || els[0].attrs["height"] != "480" {
		t.Fatalf("root = %+v", els[0])
	}
	if got := count(els, "polyline"); got != 1 {
		t.Errorf("%d polylines, want 1 (only the cascade has a line)", got)
	}
	// Grid lines, plus one legend line for the one named series with a line.
	if got, grid := count(els, "line"), 6+6; got != grid+1 {
		t.Errorf("%d lines, want %d grid lines and 1 legend line", got, grid)
	}
	// 4 markers for the points with markers, 2 for the legend entries.
	if got := count(els, "circle"); got != 6 {
		t.Errorf("%d circles, want 6", got)
	}
	all := texts(els)
	for _, want := range []string{"cost <vs> accuracy & more", "cost", "accuracy", "τ=-3", "τ=-2", "τ=-1", "large", "cascade", "always large"} {
		if !slices.Contains(all, want) {
			t.Errorf("no text %q in %q", want, all)
		}
	}
	if !strings.Contains(buf.String(), "cost &lt;vs&gt; accuracy &amp; more") {
		t.Error("title not escaped")
	}
	// The axes cover the data with nice ticks: 0 to 1 on x, 0.5 to 1 on y.
	for _, want := range []string{"0.0", "0.2", "0.5", "0.9", "1.0"} {
		if !slices.Contains(all, want) {
			t.Errorf("no tick label %q in %q", want, all)
		}
	}
	// Every plotted coordinate stays inside the canvas.
	for _, e := range els {
		if e.name != "circle" {
			continue
		}
		for _, k := range []string{"cx", "cy"} {
			if v := e.attrs[k]; strings.HasPrefix(v, "-") {
				t.Errorf("circle %s = %s outside the canvas", k, v)
			}
		}
	}
}

func TestWriteSVGEdgeCases(t *testing.T) {
	one := Plot{Width: 300, Height: 200, Series: []Series{{Points: []Point{{5, 5, ""}}}}}
	var buf bytes.Buffer
	if err := one.WriteSVG(&buf); err != nil {
		t.Fatalf("a single point: %v", err)
	}
	els := parse(t, buf.Bytes())
	if count(els, "circle") != 1 || els[0].attrs["width"] != "300" {
		t.Errorf("single point plot: %s", buf.String())
	}

	for _, tc := range []struct {
		name string
		p    Plot
		want error
	}{
		{"no series", Plot{}, ErrNoData},
		{"empty series", Plot{Series: []Series{{Name: "x"}}}, ErrNoData},
		{"NaN", Plot{Series: []Series{{Points: []Point{{0, math.NaN(), ""}}}}}, ErrNonFinite},
		{"Inf", Plot{Series: []Series{{Points: []Point{{math.Inf(1), 0, ""}}}}}, ErrNonFinite},
	} {
		if err := tc.p.WriteSVG(io.Discard); !errors.Is(err, tc.want) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.want)
		}
	}
	tiny := Plot{Width: 50, Height: 50, Series: []Series{{Name: "s", Points: []Point{{0, 0, ""}}}}}
	if err := tiny.WriteSVG(io.Discard); err == nil {
		t.Error("a plot too small to draw in was written")
	}
}

func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		min, max float64
		want     []string
	}{
		{0.1, 1.1, []string{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0", "1.2"}},
		{0.54, 0.935, []string{"0.5", "0.6", "0.7", "0.8", "0.9", "1.0"}},
		{0, 100, []string{"0", "20", "40", "60", "80", "100"}},
		{-3, 0, []string{"-3", "-2", "-1", "0"}},
		{-0.3, 0.3, []string{"-0.4", "-0.2", "0.0", "0.2", "0.4"}},
		{1200, 9800, []string{"0", "2000", "4000", "6000", "8000", "10000"}},
		{5, 5, []string{"4.4", "4.6", "4.8", "5.0", "5.2", "5.4", "5.6"}},
		{0, 0, []string{"-1.0", "-0.5", "0.0", "0.5", "1.0"}},
		{3e-6, 7e-6, []string{"0.000003", "0.000004", "0.000005", "0.000006", "0.000007"}},
	} {
		a := ticks(tc.min, tc.max, targetTicks)
		var got []string
		for _, v := range a.values() {
			got = append(got, a.format(v))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("ticks(%v, %v) = %q, want %q", tc.min, tc.max, got, tc.want)
		}
		if a.lo > tc.min || a.hi < tc.max {
			t.Errorf("ticks(%v, %v) span [%v, %v] does not cover the data", tc.min, tc.max, a.lo, a.hi)
		}
	}
}

func TestLabelsDoNotOverlap(t *testing.T) {
	var l labeler
	// Four labels on nearly the same spot take four different positions.
	seen := map[[2]float64]bool{}
	for i := range 4 {
		x, y, _ := l.place(100+float64(i), 100, "τ=-0.625")
		if seen[[2]float64{x - float64(i), y}] {
			t.Fatalf("label %d reuses a taken position", i)
		}
		seen[[2]float64{x - float64(i), y}] = true
	}
	for i, a := range l.boxes {
		for _, b := range l.boxes[i+1:] {
			if a.overlaps(b) {
				t.Fatalf("boxes %+v and %+v overlap", a, b)
			}
		}
	}
	// A label far from the others keeps the default position.
	if x, y, anchor := l.place(400, 300, "far"); x != 406 || y != 294 || anchor != "start" {
		t.Errorf("lone label at (%v, %v) %s", x, y, anchor)
	}
}

func TestLabelsStayOnCanvas(t *testing.T) {
	l := labeler{width: 200, height: 100}
	// At the top right corner the default (above right) would leave the
	// canvas: the label goes below left.
	x, y, anchor := l.place(195, 3, "label")
	if anchor != "end" || y <= 3 || x >= 195 {
		t.Errorf("corner label at (%v, %v) %s", x, y, anchor)
	}
}
