package tlbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
	"github.com/tlgate/tlgate/internal/tool/bench/nginxproxy"
	"github.com/tlgate/tlgate/internal/tool/bench/procs"
	"github.com/tlgate/tlgate/internal/tool/svgplot"
)

// Paths of the overhead comparison.
const (
	pathDirect  = "direct"
	pathGoProxy = "go-reverseproxy"
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
	requests   uint64 // answered at the fixed rate (ok or failed)
	// CPU over the fixed-rate runs: the path's own process (the proxy;
	// zero for direct), the engine's, and the load generator's.
	cpu, engineCPU, clientCPU time.Duration
	// roundCPU is the path's own CPU per request in each round, in µs (0:
	// none answered that round).
	roundCPU []float64
	// The gateway process's allocations (bytes and objects) and GC cycles
	// over the fixed-rate runs, from its own /metrics (gateway path only).
	allocBytes float64
	mallocs    float64
	gcs        float64
	hasAlloc   bool
}

// perRequest is d spread over the cell's requests, in µs.
func (c *overheadCell) perRequest(d time.Duration) string {
	if c.requests == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond)/float64(c.requests))
}

// overheadPath is one way to reach the engine.
type overheadPath struct {
	name, url string
	pid       int  // the proxy process measured (0: none)
	children  bool // count its child processes too (nginx's workers)
	metrics   string
}

// overheadFleet is the experiment's processes: the reference engine, the
// gateway binary, a bare Go reverse proxy and nginx, each its own process
// so the load generator (this process) is never counted against them.
type overheadFleet struct {
	dir                       string
	engine, gateway, goproxy  *procs.Proc
	nginx                     *nginxproxy.Proxy
	engineURL, gatewayURL, gp string
	nginxNote                 string
}

func (f *overheadFleet) close() {
	for _, p := range []*procs.Proc{f.goproxy, f.gateway, f.engine} {
		if p != nil {
			p.Stop(5 * time.Second)
		}
	}
	if f.nginx != nil {
		_ = f.nginx.Close()
	}
	_ = os.RemoveAll(f.dir)
}

// startOverheadFleet starts every process, waiting until the gateway
// routes to the engine.
func startOverheadFleet(ctx context.Context, c Config, bins binaries, logOut io.Writer) (_ *overheadFleet, err error) {
	dir, err := os.MkdirTemp("", "tlbench-procs-")
	if err != nil {
		return nil, err
	}
	f := &overheadFleet{dir: dir}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	gwBin, engBin := bins.gateway, bins.engine
	addrs, err := procs.FreeAddrs(4)
	if err != nil {
		return nil, err
	}
	gwAddr, regAddr, engAddr, gpAddr := addrs[0], addrs[1], addrs[2], addrs[3]
	// Production-like: JSON access logs written (to a file), metrics on.
	cfg := fmt.Sprintf(`[gateway]
listen = %q
registry_listen = %q
heartbeat_interval = %q
state_dir = %q
log_format = "json"
pprof = %t
`, gwAddr, regAddr, c.Heartbeat.String(), filepath.Join(dir, "state"), c.OverheadProfile)
	cfgPath := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	if f.gateway, err = procs.Start("gateway", dir, gwBin, []string{"-config", cfgPath}, nil); err != nil {
		return nil, err
	}
	f.gatewayURL = "http://" + gwAddr
	if err := f.gateway.WaitHTTP(ctx, f.gatewayURL+"/healthz", http.StatusOK, 30*time.Second); err != nil {
		return nil, err
	}
	if f.engine, err = procs.Start("engine", dir, engBin, []string{
		"-id", "zero", "-model", c.Model, "-http", engAddr, "-gateway", regAddr, "-timing", "flat",
		"-heartbeat-interval", c.Heartbeat.String(), "-log-level", "warn",
	}, nil); err != nil {
		return nil, err
	}
	f.engineURL = "http://" + engAddr
	if err := f.engine.WaitHTTP(ctx, f.engineURL+"/health", http.StatusOK, 30*time.Second); err != nil {
		return nil, err
	}
	if err := f.gateway.WaitHTTP(ctx, f.gatewayURL+"/readyz", http.StatusOK, 30*time.Second); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if f.goproxy, err = procs.Start("goproxy", dir, self, nil, []string{
		roleEnv + "=" + roleGoProxy, listenEnv + "=" + gpAddr, upstreamEnv + "=" + f.engineURL,
	}); err != nil {
		return nil, err
	}
	f.gp = "http://" + gpAddr
	if err := f.goproxy.WaitHTTP(ctx, f.gp+"/health", http.StatusOK, 30*time.Second); err != nil {
		return nil, err
	}
	px, err := nginxproxy.Start(ctx, nginxproxy.Options{Binary: c.Nginx, Upstreams: []string{engAddr}, Workers: runtime.NumCPU()})
	switch {
	case errors.Is(err, nginxproxy.ErrNotFound):
		f.nginxNote = "nginx is not installed: the nginx rows are skipped (install it with `apt-get install -y nginx`)."
		fmt.Fprintln(logOut, "tlbench:   "+f.nginxNote)
	case err != nil:
		return nil, err
	default:
		f.nginx = px
	}
	return f, nil
}

func (f *overheadFleet) paths() []overheadPath {
	ps := []overheadPath{
		{name: pathDirect, url: f.engineURL},
		{name: pathGoProxy, url: f.gp, pid: f.goproxy.Pid()},
		{name: pathGateway, url: f.gatewayURL, pid: f.gateway.Pid(), metrics: f.gatewayURL + "/metrics"},
	}
	if f.nginx != nil {
		ps = append(ps, overheadPath{name: pathNginx, url: f.nginx.URL(), pid: f.nginx.Pid(), children: true})
	}
	return ps
}

// usage is what one measurement window reads before and after.
type usage struct {
	cpu, engine, client time.Duration
	alloc, mallocs, gcs float64
	hasAlloc            bool
}

func (f *overheadFleet) usage(ctx context.Context, p overheadPath) (usage, error) {
	var u usage
	var err error
	if p.pid != 0 {
		if u.cpu, err = procs.CPU(p.pid, p.children); err != nil {
			return u, err
		}
	}
	if u.engine, err = procs.CPU(f.engine.Pid(), false); err != nil {
		return u, err
	}
	if u.client, err = procs.SelfCPU(); err != nil {
		return u, err
	}
	if p.metrics != "" {
		if b, err := fetch(ctx, p.metrics); err == nil {
			a, ok1 := procs.Counter(b, "go_memstats_alloc_bytes_total")
			g, ok2 := procs.Counter(b, "go_gc_duration_seconds_count")
			m, ok3 := procs.Counter(b, "go_memstats_mallocs_total")
			u.alloc, u.mallocs, u.gcs, u.hasAlloc = a, m, g, ok1 && ok2 && ok3
		}
	}
	return u, nil
}

// fetch GETs url and returns its body; an answer other than 200 OK is an
// error that quotes the start of the body.
func fetch(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, body)
	}
	return body, nil
}

// overheadExperiment measures latency at a fixed rate, CPU per request and
// the maximum throughput straight to a zero-cost engine, through a bare Go
// httputil.ReverseProxy, through the gateway binary and through nginx, in
// the same run, each proxy a process of its own.
func overheadExperiment(ctx context.Context, c Config, bins binaries, logOut io.Writer) (section, []plotFile, error) {
	f, err := startOverheadFleet(ctx, c, bins, logOut)
	if err != nil {
		return section{}, nil, err
	}
	defer f.close()
	paths := f.paths()

	client := loadgen.NewClient(256)
	defer client.CloseIdleConnections()
	var cells []*overheadCell
	for _, m := range overheadModes {
		reqs := []loadgen.Request{loadgen.Completion(c.Model, c.OverheadTokens, m.stream)}
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
		for range c.Rounds {
			for _, p := range paths {
				before, err := f.usage(ctx, p)
				if err != nil {
					return section{}, nil, err
				}
				res := loadgen.RunOpen(ctx, client, loadgen.Fixed(p.url), loadgen.Open{
					Rate: c.Rate, Duration: c.RateDuration, Requests: reqs, MaxInFlight: 512,
				})
				after, err := f.usage(ctx, p)
				if err != nil {
					return section{}, nil, err
				}
				cell := byPath[p.name]
				n, perReq := res.OK+res.Failed, 0.0
				if n > 0 {
					perReq = float64(after.cpu-before.cpu) / float64(time.Microsecond) / float64(n)
				}
				cell.roundCPU = append(cell.roundCPU, perReq)
				cell.requests += uint64(n)
				cell.cpu += after.cpu - before.cpu
				cell.engineCPU += after.engine - before.engine
				cell.clientCPU += after.client - before.client
				if before.hasAlloc && after.hasAlloc {
					cell.allocBytes += after.alloc - before.alloc
					cell.mallocs += after.mallocs - before.mallocs
					cell.gcs += after.gcs - before.gcs
					cell.hasAlloc = true
				}
				cell.samples = append(cell.samples, res.Latency...)
				cell.failed += res.Failed
				cell.dropped += res.Dropped
			}
		}
		if c.OverheadProfile {
			if err := f.profile(ctx, c, m.name, reqs, client, logOut); err != nil {
				return section{}, nil, err
			}
		}
		for _, p := range paths {
			res := loadgen.RunClosed(ctx, client, loadgen.Fixed(p.url), loadgen.Closed{
				Concurrency: c.TputConcurrency, Requests: reqs, Cycle: true, Duration: c.TputDuration,
			})
			cell := byPath[p.name]
			cell.rps = res.Throughput()
			cell.failed += res.Failed
			cell.lat = loadgen.Summarize(cell.samples)
			allocs := ""
			if cell.hasAlloc && cell.requests > 0 {
				allocs = fmt.Sprintf("  %.0f allocs/req", cell.mallocs/float64(cell.requests))
			}
			fmt.Fprintf(logOut, "tlbench:   %-12s %-15s p50 %5s µs  p99 %6s µs  max %7.0f req/s  CPU %s µs/req%s\n",
				m.name, p.name, us(cell.lat.P50), us(cell.lat.P99), cell.rps, cell.perRequest(cell.cpu), allocs)
		}
		if err := ctx.Err(); err != nil {
			return section{}, nil, err
		}
	}
	return overheadSection(c, cells, f.nginxNote), overheadPlots(cells), nil
}

// overheadProfileSeconds is the length of the CPU profile OverheadProfile
// takes of the gateway.
const overheadProfileSeconds = 10

// profile takes a CPU profile of the gateway over a fixed-rate run of
// reqs (mode names it) and keeps it in c.Out.
func (f *overheadFleet) profile(ctx context.Context, c Config, mode string, reqs []loadgen.Request, client *http.Client, logOut io.Writer) error {
	type got struct {
		data []byte
		err  error
	}
	allocsBefore, err := fetch(ctx, f.gatewayURL+"/debug/pprof/allocs")
	if err != nil {
		return fmt.Errorf("allocation profile: %w", err)
	}
	done := make(chan got, 1)
	go func() {
		b, err := fetchProfile(ctx, f.gatewayURL, overheadProfileSeconds)
		done <- got{b, err}
	}()
	loadgen.RunOpen(ctx, client, loadgen.Fixed(f.gatewayURL), loadgen.Open{
		Rate: c.Rate, Duration: overheadProfileSeconds*time.Second + profileSlack, Requests: reqs, MaxInFlight: 512,
	})
	g := <-done
	if g.err != nil {
		return g.err
	}
	allocsAfter, err := fetch(ctx, f.gatewayURL+"/debug/pprof/allocs")
	if err != nil {
		return fmt.Errorf("allocation profile: %w", err)
	}
	name := "overhead-" + mode + ".pprof"
	for _, p := range []struct {
		name string
		data []byte
	}{{name, g.data}, {"overhead-" + mode + "-allocs-before.pprof", allocsBefore}, {"overhead-" + mode + "-allocs-after.pprof", allocsAfter}} {
		if err := writeProfile(c.Out, p.name, p.data); err != nil {
			return err
		}
	}
	fmt.Fprintf(logOut, "tlbench:   %-12s gateway CPU profile over %ds at %.0f req/s: %s (its allocations: overhead-%s-allocs-after.pprof, diff_base -before)\n",
		mode, overheadProfileSeconds, c.Rate, filepath.Join(c.Out, name), mode)
	return nil
}

func findCell(cells []*overheadCell, mode, path string) *overheadCell {
	for _, c := range cells {
		if c.mode == mode && c.path == path {
			return c
		}
	}
	return nil
}

func overheadSection(c Config, cells []*overheadCell, nginxNote string) section {
	t := &table{header: []string{"mode", "path", "p50 µs", "p90 µs", "p99 µs", "added p50 µs", "added p99 µs", "max req/s",
		"proxy CPU µs/req", "engine CPU µs/req", "load generator CPU µs/req", "gateway KiB allocated/req (GC cycles)", "gateway allocs/req", "failed", "dropped"}}
	for _, cell := range cells {
		added50, added99 := "-", "-"
		if d := findCell(cells, cell.mode, pathDirect); d != nil && cell.path != pathDirect {
			added50, added99 = signedUS(cell.lat.P50-d.lat.P50), signedUS(cell.lat.P99-d.lat.P99)
		}
		proxyCPU, alloc, mallocs := "-", "-", "-"
		if cell.path != pathDirect {
			proxyCPU = cell.perRequest(cell.cpu)
		}
		if cell.hasAlloc && cell.requests > 0 {
			alloc = fmt.Sprintf("%s (%.0f)", f1(cell.allocBytes/float64(cell.requests)/1024), cell.gcs)
			mallocs = fmt.Sprintf("%.0f", cell.mallocs/float64(cell.requests))
		}
		t.add(cell.mode, cell.path, us(cell.lat.P50), us(cell.lat.P90), us(cell.lat.P99), added50, added99,
			fmt.Sprintf("%.0f", cell.rps), proxyCPU, cell.perRequest(cell.engineCPU), cell.perRequest(cell.clientCPU), alloc, mallocs,
			fmt.Sprint(cell.failed), fmt.Sprint(cell.dropped))
	}
	lead := fmt.Sprintf("Separate processes on loopback: one zero-cost reference engine (`cmd/enginesim`, flat timing with no prefill or decode time, %d tokens per answer), "+
		"the `gateway` binary (its default route policy, cache_aware; JSON access log written to a file, metrics on), a bare Go "+
		"`httputil.ReverseProxy` (FlushInterval -1, upstream keep-alive: the floor of a Go HTTP proxy on this machine), "+
		"and nginx (%d worker processes, upstream keep-alive, proxy_buffering off); the load generator is tlbench's own process. "+
		"Latency to the last byte at an open-loop %.0f requests/s for %v per path, %d interleaved rounds pooled; "+
		"added = the path's percentile minus the direct one. CPU per request is user+system time from /proc over those "+
		"fixed-rate runs, divided by the requests answered: the proxy's process (nginx with its workers), the engine's and "+
		"the load generator's. Max req/s: %d closed-loop keep-alive clients for %v.",
		c.OverheadTokens, runtime.NumCPU(), c.Rate, c.RateDuration, c.Rounds, c.TputConcurrency, c.TputDuration)
	var notes []string
	if nginxNote != "" {
		notes = append(notes, nginxNote)
	}
	for _, m := range overheadModes {
		d, g, n, gp := findCell(cells, m.name, pathDirect), findCell(cells, m.name, pathGateway), findCell(cells, m.name, pathNginx), findCell(cells, m.name, pathGoProxy)
		if d == nil || g == nil {
			continue
		}
		g50, g99 := g.lat.P50-d.lat.P50, g.lat.P99-d.lat.P99
		if n != nil {
			n50 := n.lat.P50 - d.lat.P50
			notes = append(notes, fmt.Sprintf("Target (%s): gateway added p50 within 2× nginx's: %s µs vs %s µs (%s) — %s.",
				m.name, signedUS(g50), signedUS(n50), ratio(g50, n50), metOrMissed(g50 <= 2*n50)))
		}
		notes = append(notes, fmt.Sprintf("Target (%s): gateway added p99 under 1 ms at %.0f requests/s: %s µs — %s.",
			m.name, c.Rate, signedUS(g99), metOrMissed(g99 < time.Millisecond)))
		if gp != nil && gp.requests > 0 && g.requests > 0 {
			gcpu := float64(g.cpu) / float64(g.requests)
			fcpu := float64(gp.cpu) / float64(gp.requests)
			line := fmt.Sprintf("CPU per request (%s): gateway %s µs, Go ReverseProxy floor %s µs (%s)", m.name,
				g.perRequest(g.cpu), gp.perRequest(gp.cpu), cpuRatio(gcpu, fcpu))
			if n != nil && n.requests > 0 {
				line += fmt.Sprintf(", nginx %s µs", n.perRequest(n.cpu))
			}
			if rs := pairedRatios(g.roundCPU, gp.roundCPU); len(rs) > 1 {
				s := spreadOf(rs)
				line += fmt.Sprintf("; round by round (the two measured one after the other), gateway over floor %.2f× (%.2f×–%.2f×), the median of %d rounds",
					s.med, s.lo, s.hi, len(rs))
			}
			notes = append(notes, line+".")
		}
	}
	return section{title: "Gateway overhead", lead: lead, tables: []*table{t}, notes: notes}
}

// pairedRatios is a[i]/b[i] for the rounds both measured.
func pairedRatios(a, b []float64) []float64 {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if a[i] > 0 && b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	return rs
}

func cpuRatio(a, b float64) string {
	if b <= 0 {
		return "floor not measurable"
	}
	return fmt.Sprintf("%.2f× the floor", a/b)
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
