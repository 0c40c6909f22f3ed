// Command cascadecurve sweeps the accept_if threshold of a small-then-large
// cascade over an evaluation set and prints, for each threshold, the
// fraction escalated, the cost relative to always asking the large model,
// and the accuracy; with -svg it also draws the cost/accuracy curve.
//
//	go run ./cmd/cascadecurve -samples testdata/cascade/cascade_sweep.json \
//	    -stat mean_logprob -taus -3,-2,-1 -small-cost 0.1 -svg out.svg
//
// Thresholds and the small call's cost default to those in the file.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/tlgate/tlgate/internal/routing/cascade"
	"github.com/tlgate/tlgate/internal/tool/svgplot"
)

// options are the command's parsed flags.
type options struct {
	samples   string
	stat      cascade.Stat
	taus      []float64 // nil: the file's
	smallCost float64
	costSet   bool // -small-cost given; else the file's
	svg       string
}

func main() {
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cascadecurve:", err)
		os.Exit(2)
	}
	if err := run(opts, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "cascadecurve:", err)
		os.Exit(1)
	}
}

// parseFlags reads the command line; usage and flag errors go to errOut.
func parseFlags(args []string, errOut io.Writer) (options, error) {
	fs := flag.NewFlagSet("cascadecurve", flag.ContinueOnError)
	fs.SetOutput(errOut)
	samples := fs.String("samples", "", "evaluation set JSON (required), e.g. testdata/cascade/cascade_sweep.json")
	stat := fs.String("stat", string(cascade.MeanLogprob), "statistic of the small model's logprobs: mean_logprob or min_logprob")
	taus := fs.String("taus", "", "comma-separated thresholds (default: the file's)")
	smallCost := fs.Float64("small-cost", 0, "cost of a small call relative to a large one (default: the file's)")
	svg := fs.String("svg", "", "write the cost/accuracy plot to this SVG file")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o := options{samples: *samples, svg: *svg, smallCost: *smallCost}
	if o.samples == "" {
		return options{}, errors.New("-samples is required")
	}
	var err error
	if o.stat, err = cascade.ParseStat(*stat); err != nil {
		return options{}, fmt.Errorf("-stat: %w", err)
	}
	if *taus != "" {
		if o.taus, err = parseTaus(*taus); err != nil {
			return options{}, fmt.Errorf("-taus: %w", err)
		}
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "small-cost" {
			o.costSet = true
		}
	})
	if o.costSet && !(o.smallCost >= 0) {
		return options{}, fmt.Errorf("-small-cost: must be >= 0, got %v", o.smallCost)
	}
	return o, nil
}

// parseTaus reads a comma-separated list of finite numbers.
func parseTaus(s string) ([]float64, error) {
	parts := strings.Split(s, ",")
	out := make([]float64, 0, len(parts))
	for _, p := range parts {
		p = strings.TrimSpace(p)
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("not a finite number: %q", p)
		}
		out = append(out, v)
	}
	return out, nil
}

// run computes the curve, prints the table to out and writes the SVG plot.
func run(o options, out io.Writer) error {
	sw, err := cascade.LoadSweep(o.samples)
	if err != nil {
		return err
	}
	taus := o.taus
	if taus == nil {
		taus = sw.Taus
	}
	if len(taus) == 0 {
		return errors.New("no thresholds: the file has none and -taus is not set")
	}
	cost := sw.SmallCost
	if o.costSet {
		cost = o.smallCost
	}
	curve := cascade.CascadeCurve(sw.Samples, o.stat, taus, cost)
	large := cascade.LargeAccuracy(sw.Samples)

	fmt.Fprintf(out, "%s: %d samples, accept when %s > tau, small cost %v\n", o.samples, len(sw.Samples), o.stat, cost)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tau\tescalated\tcost\taccuracy\t")
	for _, p := range curve {
		fmt.Fprintf(tw, "%s\t%.4f\t%.4f\t%.4f\t\n", strconv.FormatFloat(p.Tau, 'f', -1, 64), p.Escalated, p.Cost, p.Accuracy)
	}
	fmt.Fprintf(tw, "always-large\t%.4f\t%.4f\t%.4f\t\n", 1.0, 1.0, large)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}

	if o.svg == "" {
		return nil
	}
	return writePlot(o.svg, o.stat, cost, curve, large)
}

// writePlot draws the curve (cost on x, accuracy on y, each point labelled
// with its tau) and the always-large reference point.
func writePlot(path string, stat cascade.Stat, cost float64, curve []cascade.CurvePoint, large float64) error {
	pts := make([]svgplot.Point, len(curve))
	for i, p := range curve {
		pts[i] = svgplot.Point{X: p.Cost, Y: p.Accuracy, Label: "τ=" + strconv.FormatFloat(p.Tau, 'f', -1, 64)}
	}
	plot := svgplot.Plot{
		Title:  fmt.Sprintf("Cascade cost and accuracy (%s, small cost %v)", stat, cost),
		XLabel: "cost (always large = 1)",
		YLabel: "accuracy",
		Width:  960,
		Height: 600,
		Series: []svgplot.Series{
			{Name: "cascade (" + string(stat) + ")", Points: pts, Line: true},
			{Name: "always large", Points: []svgplot.Point{{X: 1, Y: large, Label: "always large"}}},
		},
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("svg: %w", err)
	}
	if err := plot.WriteSVG(f); err != nil {
		f.Close()
		return fmt.Errorf("svg: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("svg: %w", err)
	}
	return nil
}
