package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/bench/loadgen"
	"github.com/tlgate/tlgate/internal/bench/nginxproxy"
	"github.com/tlgate/tlgate/internal/config"
	"github.com/tlgate/tlgate/internal/svgplot"
)

// Paths of the overhead comparison.
const (
	pathDirect  = "direct"
	pathGateway = "gateway"
	pathNginx   = "nginx"
)

// overheadMode is streamed or not.
type overheadMode struct {
	name   string
	stream bool
}

var overheadModes = []overheadMode{{"non-streamed", false}, {"streamed", true}}

// overheadCell is one (mode, path) measurement.
type overheadCell struct {
	mode, path string
	samples    []time.Duration // latency to the last byte, at the fixed rate
	lat        loadgen.Summary
	rps        float64 // closed-loop maximum
	failed     int
	dropped    int
	// Whole-process allocation and collections over the fixed-rate runs.
	allocBytes, requests uint64
	gcs                  uint32
	gcPause              time.Duration
}

// allocPerRequest is the bytes the whole process allocated per request.
func (c *overheadCell) allocPerRequest() float64 {
	if c.requests == 0 {
		return 0
	}
	return float64(c.allocBytes) / float64(c.requests)
}

// overheadExperiment measures latency at a fixed rate and the maximum
// throughput straight to a zero-cost engine, through the gateway, and
// through nginx, in the same run.
func overheadExperiment(ctx context.Context, c settings, logOut io.Writer) (section, []plotFile, error) {
	eng := enginesim.Config{ID: "zero", Model: c.model, HeartbeatInterval: c.heartbeat} // zero costs
	cl, err := startCluster(ctx, &gatewayConfig{policy: config.PolicyLeastOutstanding, heartbeat: c.heartbeat}, []enginesim.Config{eng})
	if err != nil {
		return section{}, nil, err
	}
	defer cl.close()
	paths := []struct{ name, url string }{{pathDirect, cl.engineURLs()[0]}, {pathGateway, cl.url()}}
	var nginxNote string
	px, err := nginxproxy.Start(ctx, nginxproxy.Options{Binary: c.nginx, Upstreams: cl.engineAddrs(), Workers: runtime.NumCPU()})
	switch {
	case errors.Is(err, nginxproxy.ErrNotFound):
		nginxNote = "nginx is not installed: the nginx rows are skipped (install it with `apt-get install -y nginx`)."
		fmt.Fprintln(logOut, "tlbench:   "+nginxNote)
	case err != nil:
		return section{}, nil, err
	default:
		defer px.Close()
		paths = append(paths, struct{ name, url string }{pathNginx, px.URL()})
	}

	client := loadgen.NewClient(256)
	defer client.CloseIdleConnections()
	var cells []*overheadCell
	for _, m := range overheadModes {
		reqs := []loadgen.Request{loadgen.Completion(c.model, c.overheadTokens, m.stream)}
		byPath := map[string]*overheadCell{}
		for _, p := range paths {
			cell := &overheadCell{mode: m.name, path: p.name}
			byPath[p.name] = cell
			cells = append(cells, cell)
			// Warm the keep-alive pools of the client and the proxies.
			loadgen.RunClosed(ctx, client, loadgen.Fixed(p.url), loadgen.Closed{Concurrency: 16, Requests: reqs, Cycle: true, Duration: 200 * time.Millisecond})
		}
		// Latency at the fixed rate: rounds interleave the paths, so that
		// noise from the shared machine spreads over all of them.
		for range c.rounds {
			for _, p := range paths {
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				res := loadgen.RunOpen(ctx, client, loadgen.Fixed(p.url), loadgen.Open{
					Rate: c.rate, Duration: c.rateDuration, Requests: reqs, MaxInFlight: 512,
				})
				runtime.ReadMemStats(&after)
				cell := byPath[p.name]
				cell.allocBytes += after.TotalAlloc - before.TotalAlloc
				cell.requests += uint64(res.OK + res.Failed)
				cell.gcs += after.NumGC - before.NumGC
				cell.gcPause += time.Duration(after.PauseTotalNs - before.PauseTotalNs)
				cell.samples = append(cell.samples, res.Latency...)
				cell.failed += res.Failed
				cell.dropped += res.Dropped
			}
		}
		for _, p := range paths {
			res := loadgen.RunClosed(ctx, client, loadgen.Fixed(p.url), loadgen.Closed{
				Concurrency: c.tputConcurrency, Requests: reqs, Cycle: true, Duration: c.tputDuration,
			})
			cell := byPath[p.name]
			cell.rps = res.Throughput()
			cell.failed += res.Failed
			cell.lat = loadgen.Summarize(cell.samples)
			fmt.Fprintf(logOut, "tlbench:   %-12s %-7s p50 %5s µs  p99 %6s µs  max %7.0f req/s\n", m.name, p.name, us(cell.lat.P50), us(cell.lat.P99), cell.rps)
		}
		if err := ctx.Err(); err != nil {
			return section{}, nil, err
		}
	}
	return overheadSection(c, cells, nginxNote), overheadPlots(cells), nil
}

func findCell(cells []*overheadCell, mode, path string) *overheadCell {
	for _, c := range cells {
		if c.mode == mode && c.path == path {
			return c
		}
	}
	return nil
}

func overheadSection(c settings, cells []*overheadCell, nginxNote string) section {
	t := &table{header: []string{"mode", "path", "p50 µs", "p90 µs", "p99 µs", "added p50 µs", "added p99 µs", "max req/s",
		"process KiB allocated per request", "GC cycles (pause ms)", "failed", "dropped"}}
	for _, cell := range cells {
		added50, added99 := "-", "-"
		if d := findCell(cells, cell.mode, pathDirect); d != nil && cell.path != pathDirect {
			added50, added99 = signedUS(cell.lat.P50-d.lat.P50), signedUS(cell.lat.P99-d.lat.P99)
		}
		t.add(cell.mode, cell.path, us(cell.lat.P50), us(cell.lat.P90), us(cell.lat.P99), added50, added99,
			fmt.Sprintf("%.0f", cell.rps), f1(cell.allocPerRequest()/1024),
			fmt.Sprintf("%d (%s)", cell.gcs, ms(cell.gcPause)), fmt.Sprint(cell.failed), fmt.Sprint(cell.dropped))
	}
	lead := fmt.Sprintf("One zero-cost engine (no prefill or decode delay; %d tokens per answer from the toy model) reached straight, "+
		"through the gateway (least_outstanding, access log encoded, metrics on) and through nginx (a plain reverse proxy: "+
		"%d worker processes, upstream keep-alive, proxy_buffering off). Latency to the last byte at an open-loop %.0f requests/s "+
		"for %v per path, %d interleaved rounds pooled; added = the path's percentile minus the direct one. "+
		"Max req/s: %d closed-loop keep-alive clients for %v. The allocation and GC columns are the whole process's (client, engine, and the gateway "+
		"when on the path) over the fixed-rate runs; nginx allocates outside the Go heap.",
		c.overheadTokens, runtime.NumCPU(), c.rate, c.rateDuration, c.rounds, c.tputConcurrency, c.tputDuration)
	var notes []string
	if nginxNote != "" {
		notes = append(notes, nginxNote)
	}
	for _, m := range overheadModes {
		d, g, n := findCell(cells, m.name, pathDirect), findCell(cells, m.name, pathGateway), findCell(cells, m.name, pathNginx)
		if d == nil || g == nil {
			continue
		}
		g50, g99 := g.lat.P50-d.lat.P50, g.lat.P99-d.lat.P99
		if n != nil {
			n50 := n.lat.P50 - d.lat.P50
			ok := g50 <= 2*n50
			notes = append(notes, fmt.Sprintf("Target (%s): gateway added p50 within 2× nginx's: %s µs vs %s µs (%s) — %s.",
				m.name, signedUS(g50), signedUS(n50), ratio(g50, n50), metOrMissed(ok)))
		}
		notes = append(notes, fmt.Sprintf("Target (%s): gateway added p99 under 1 ms at %.0f requests/s: %s µs — %s.",
			m.name, c.rate, signedUS(g99), metOrMissed(g99 < time.Millisecond)))
	}
	return section{title: "Gateway overhead", lead: lead, tables: []*table{t}, notes: notes}
}

func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "nginx adds nothing measurable"
	}
	return fmt.Sprintf("%.2f×", float64(a)/float64(b))
}

func metOrMissed(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// overheadPlots draws each path's latency percentiles, per mode.
func overheadPlots(cells []*overheadCell) []plotFile {
	percentiles := []float64{50, 75, 90, 95, 99}
	var series []svgplot.Series
	for _, cell := range cells {
		if len(cell.samples) == 0 {
			continue
		}
		sorted := slices.Clone(cell.samples)
		slices.Sort(sorted)
		s := svgplot.Series{Name: cell.path + ", " + cell.mode, Line: true}
		for _, p := range percentiles {
			s.Points = append(s.Points, svgplot.Point{X: p, Y: float64(loadgen.Percentile(sorted, p)) / 1e3})
		}
		series = append(series, s)
	}
	if len(series) == 0 {
		return nil
	}
	return []plotFile{{name: "overhead", plot: svgplot.Plot{
		Title: "Overhead: latency percentiles at a fixed request rate", XLabel: "percentile", YLabel: "latency to last byte (µs)",
		Width: 960, Height: 600, Series: series,
	}}}
}
