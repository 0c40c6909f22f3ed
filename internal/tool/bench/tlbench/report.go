package tlbench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/tlgate/tlgate/internal/tool/bench/nginxproxy"
	"github.com/tlgate/tlgate/internal/tool/svgplot"
)

// table is a markdown table.
type table struct {
	header []string
	rows   [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) markdown(w io.Writer) {
	line := func(cells []string) {
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	line(t.header)
	sep := make([]string, len(t.header))
	for i := range sep {
		sep[i] = "---"
		if i > 0 {
			sep[i] = "--:"
		}
	}
	line(sep)
	for _, r := range t.rows {
		line(r)
	}
}

// section is one part of the report: a heading, a lead paragraph, tables
// and notes (bullets).
type section struct {
	title  string
	lead   string
	tables []*table
	notes  []string
}

func (s section) markdown(w io.Writer) {
	fmt.Fprintf(w, "## %s\n\n", s.title)
	if s.lead != "" {
		fmt.Fprintf(w, "%s\n\n", s.lead)
	}
	for _, t := range s.tables {
		t.markdown(w)
		fmt.Fprintln(w)
	}
	for _, n := range s.notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
	if len(s.notes) > 0 {
		fmt.Fprintln(w)
	}
}

// report collects the sections as they are printed.
type report struct{ buf bytes.Buffer }

// add prints s to out and keeps it for results.md.
func (r *report) add(out io.Writer, s section) {
	s.markdown(&r.buf)
	s.markdown(out)
}

// plotFile is a plot to write as dir/name.svg (and .png).
type plotFile struct {
	name string
	plot svgplot.Plot
}

// write writes results.md and every plot into dir, and PNGs of the plots
// when rsvg-convert is installed.
func (r *report) write(dir string, plots []plotFile) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("out: %w", err)
	}
	var md bytes.Buffer
	fmt.Fprintf(&md, "# tlbench results\n\n")
	md.Write(r.buf.Bytes())
	for _, p := range plots {
		fmt.Fprintf(&md, "![%s](%s.svg)\n\n", p.plot.Title, p.name)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), md.Bytes(), 0o644); err != nil {
		return fmt.Errorf("out: %w", err)
	}
	rsvg, rsvgErr := exec.LookPath("rsvg-convert")
	for _, p := range plots {
		svg := filepath.Join(dir, p.name+".svg")
		if err := writeSVG(svg, p.plot); err != nil {
			return err
		}
		if rsvgErr == nil {
			png := filepath.Join(dir, p.name+".png")
			if out, err := exec.Command(rsvg, "-o", png, svg).CombinedOutput(); err != nil {
				return fmt.Errorf("rsvg-convert %s: %w: %s", svg, err, out)
			}
		}
	}
	return nil
}

func writeSVG(path string, p svgplot.Plot) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("svg: %w", err)
	}
	if err := p.WriteSVG(f); err != nil {
		f.Close()
		return fmt.Errorf("svg %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("svg: %w", err)
	}
	return nil
}

// machineSection describes where and when the run happened.
func machineSection(ctx context.Context, c Config) section {
	t := &table{header: []string{"what", "value"}}
	t.add("date", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	t.add("CPU", cpuModel())
	t.add("logical CPUs (nproc)", fmt.Sprint(runtime.NumCPU()))
	t.add("GOMAXPROCS", fmt.Sprint(runtime.GOMAXPROCS(0)))
	t.add("Go", runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH)
	v, err := nginxproxy.Version(ctx, c.Nginx)
	if err != nil {
		v = "not installed: the nginx column is skipped"
	}
	t.add("nginx", v)
	return section{
		title: "Machine",
		lead: "Everything runs on this one machine, on loopback, so every party competes for the same CPUs. The overhead " +
			"experiment runs the engine, the gateway binary, a bare Go reverse proxy and nginx as processes of their own, " +
			"apart from the load generator; the routing, scale and memory experiments run engines and gateway in tlbench's process.",
		tables: []*table{t},
	}
}

// cpuModel is the first "model name" of /proc/cpuinfo, or "unknown".
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// Formatting helpers for the tables.

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }

func us(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond)) }

func signedUS(d time.Duration) string {
	return fmt.Sprintf("%+.0f", float64(d)/float64(time.Microsecond))
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func f1(f float64) string { return fmt.Sprintf("%.1f", f) }

func f0(f float64) string { return fmt.Sprintf("%.0f", f) }

func f2(f float64) string { return fmt.Sprintf("%.2f", f) }
