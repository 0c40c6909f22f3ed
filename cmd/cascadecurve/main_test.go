package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/routing/cascade"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

const fixture = "../../testdata/cascade/cascade_sweep.json"

func TestRunOnFixture(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/cascade/cascade_oracle.json")
	if err != nil {
		t.Fatal(err)
	}
	var oracle struct {
		Curves map[string][]cascade.CurvePoint `json:"curves"`
	}
	if err := json.Unmarshal(raw, &oracle); err != nil {
		t.Fatal(err)
	}
	for _, stat := range []string{"mean_logprob", "min_logprob"} {
		t.Run(stat, func(t *testing.T) {
			svg := filepath.Join(t.TempDir(), "out.svg")
			o, err := parseFlags([]string{"-samples", fixture, "-stat", stat, "-svg", svg}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := run(o, &out); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
			exp := oracle.Curves[stat]
			// A header line, the column names, 13 thresholds, always-large.
			if len(lines) != 2+len(exp)+1 {
				t.Fatalf("got %d lines:\n%s", len(lines), out.String())
			}
			if !strings.Contains(lines[0], "200 samples") || !strings.Contains(lines[0], stat+" > tau") || !strings.Contains(lines[0], "small cost 0.1") {
				t.Errorf("header %q", lines[0])
			}
			if f := strings.Fields(lines[1]); strings.Join(f, " ") != "tau escalated cost accuracy" {
				t.Errorf("columns %q", lines[1])
			}
			for i, p := range exp {
				want := fmt.Sprintf("%v %.4f %.4f %.4f", p.Tau, p.Escalated, p.Cost, p.Accuracy)
				if got := strings.Join(strings.Fields(lines[2+i]), " "); got != want {
					t.Errorf("row %d = %q, want %q", i, got, want)
				}
			}
			if got := strings.Join(strings.Fields(lines[len(lines)-1]), " "); got != "always-large 1.0000 1.0000 0.9350" {
				t.Errorf("reference row = %q", got)
			}

			doc, err := os.ReadFile(svg)
			if err != nil {
				t.Fatal(err)
			}
			labels := svgTexts(t, doc)
			for _, want := range []string{"τ=-3", "τ=-0.875", "τ=0", "always large", "accuracy", "cost (always large = 1)"} {
				if !labels[want] {
					t.Errorf("SVG has no text %q", want)
				}
			}
		})
	}
}

// svgTexts parses doc as XML (failing the test if it is not) and returns
// the set of its trimmed text contents.
func svgTexts(t *testing.T, doc []byte) map[string]bool {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	out := map[string]bool{}
	root := ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
		case xml.CharData:
			if s := strings.TrimSpace(string(tok)); s != "" {
				out[s] = true
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return out
}

func TestRunOverrides(t *testing.T) {
	o, err := parseFlags([]string{"-samples", fixture, "-taus", "-3, -1,0", "-small-cost", "0.25"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(o, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	want := []string{"-3 0.0000 0.2500 0.5400", "-1 0.6400 0.8900 0.8650", "0 1.0000 1.2500 0.9350"}
	if len(lines) != 6 {
		t.Fatalf("output:\n%s", out.String())
	}
	for i, w := range want {
		if got := strings.Join(strings.Fields(lines[2+i]), " "); got != w {
			t.Errorf("row %d = %q, want %q", i, got, w)
		}
	}

	// A small cost of 0 given explicitly is used, not replaced by the file's.
	o, err = parseFlags([]string{"-samples", fixture, "-taus", "-3", "-small-cost", "0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(o, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "small cost 0\n") {
		t.Errorf("explicit -small-cost 0 ignored:\n%s", out.String())
	}
}

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "-samples is required"},
		{[]string{"-samples", "x", "-stat", "max_logprob"}, `-stat: cascade: unknown statistic "max_logprob"`},
		{[]string{"-samples", "x", "-taus", "-1,abc"}, `-taus: not a finite number: "abc"`},
		{[]string{"-samples", "x", "-taus", "NaN"}, `-taus: not a finite number: "NaN"`},
		{[]string{"-samples", "x", "-taus", "-1,"}, `-taus: not a finite number: ""`},
		{[]string{"-samples", "x", "-small-cost", "-0.1"}, "-small-cost: must be >= 0, got -0.1"},
		{[]string{"-samples", "x", "extra"}, `unexpected arguments ["extra"]`},
		{[]string{"-nope"}, "flag provided but not defined: -nope"},
	} {
		_, err := parseFlags(tc.args, io.Discard)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) error = %v, want %q", tc.args, err, tc.want)
		}
	}
	if _, err := parseFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}

	o, err := parseFlags([]string{"-samples", filepath.Join(t.TempDir(), "missing.json")}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := run(o, io.Discard); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run on a missing file: %v", err)
	}
	noTaus := filepath.Join(t.TempDir(), "no-taus.json")
	if err := os.WriteFile(noTaus, []byte(`{"small_cost":0.1,"samples":[{"id":"a","small_logprobs":[-1]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	o.samples = noTaus
	if err := run(o, io.Discard); err == nil || !strings.Contains(err.Error(), "no thresholds") {
		t.Errorf("run without thresholds: %v", err)
	}
}
