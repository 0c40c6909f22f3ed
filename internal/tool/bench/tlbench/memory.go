package tlbench

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
	"github.com/tlgate/tlgate/internal/tool/svgplot"
)

// memoryRow is the memory held by n open streams.
type memoryRow struct {
	streams   int    // streams measured
	requested int    // streams asked for (more than measured when the limits forbid)
	reduced   string // why fewer streams were measured, if so
	// direct and viaGW are the process's HeapInuse+StackInuse growth with
	// the streams open straight to the engines (client and engine side)
	// and through the gateway (client, gateway and engine side).
	direct, viaGW           memSample
	openDirect, openGateway time.Duration // time to open all streams
}

type memSample struct {
	bytes      int64 // HeapInuse + StackInuse
	stack      int64 // StackInuse alone
	goroutines int
}

// gatewayPerStream is the gateway's own bytes per stream: the growth
// through the gateway minus the growth without it.
func (r memoryRow) gatewayPerStream() float64 {
	return float64(r.viaGW.bytes-r.direct.bytes) / float64(r.streams)
}

// gatewayStackPerStream is the goroutine-stack part of gatewayPerStream.
func (r memoryRow) gatewayStackPerStream() float64 {
	return float64(r.viaGW.stack-r.direct.stack) / float64(r.streams)
}

// memoryEngines is how many engines hold the streams.
const memoryEngines = 2

// Descriptors per stream through the gateway, and those kept spare for
// everything else.
const (
	descriptorsPerStream = 4
	spareDescriptors     = 1024
)

// memoryExperiment measures the gateway's memory per open stream.
func memoryExperiment(ctx context.Context, c Config, logOut io.Writer) (section, []plotFile, error) {
	var rows []memoryRow
	for _, n := range c.Streams {
		row, err := memoryRun(ctx, c, n)
		if err != nil {
			return section{}, nil, fmt.Errorf("%d streams: %w", n, err)
		}
		if row.reduced != "" {
			fmt.Fprintf(logOut, "tlbench:   %d streams requested, %d measured: %s\n", n, row.streams, row.reduced)
		}
		fmt.Fprintf(logOut, "tlbench:   %d streams: gateway %.1f KiB per stream\n", row.streams, row.gatewayPerStream()/1024)
		rows = append(rows, row)
	}
	return memorySection(rows), memoryPlots(rows), nil
}

// raiseNoFile lifts RLIMIT_NOFILE to at least want if it can (the hard
// limit too, which needs CAP_SYS_RESOURCE) and returns the soft limit now
// and why it is short of want, if it is.
func raiseNoFile(want uint64) (uint64, string) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, "getrlimit: " + err.Error()
	}
	if l.Cur >= want {
		return l.Cur, ""
	}
	nl := syscall.Rlimit{Cur: want, Max: max(l.Max, want)}
	err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &nl)
	if err == nil {
		return want, ""
	}
	why := fmt.Sprintf("raising the hard limit %d was refused (%v)", l.Max, err)
	nl = syscall.Rlimit{Cur: l.Max, Max: l.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &nl); err != nil {
		return l.Cur, why
	}
	return l.Max, why
}

// memoryRun opens n streams straight to engines whose streams stall after
// the first token, then n through the gateway, measuring each.
func memoryRun(ctx context.Context, c Config, n int) (memoryRow, error) {
	row := memoryRow{streams: n, requested: n}
	// Through the gateway every stream holds four descriptors in this one
	// process: the client's and the gateway's ends of the client
	// connection, and the gateway's and the engine's ends of the upstream
	// one. When the limit cannot be raised that far, measure the most
	// streams it allows (in steps of 500).
	need := uint64(descriptorsPerStream*n + spareDescriptors)
	if got, why := raiseNoFile(need); got < need {
		feasible := (int(got) - spareDescriptors) / descriptorsPerStream / 500 * 500
		if feasible < 1 {
			return row, fmt.Errorf("RLIMIT_NOFILE %d leaves no room for streams", got)
		}
		row.streams = feasible
		row.reduced = fmt.Sprintf("%d streams need %d file descriptors in this process; RLIMIT_NOFILE is %d: %s",
			n, need, got, why)
		n = feasible
	}
	engines := make([]enginesim.Config, memoryEngines)
	per := (n + memoryEngines - 1) / memoryEngines
	for i := range engines {
		engines[i] = enginesim.Config{
			ID: fmt.Sprintf("stall-%d", i), Model: c.Model,
			// The first token comes at once; the next after an hour: the
			// stream stays open with nothing to relay.
			DecodePerToken: time.Hour,
			MaxRunning:     per + 16, KVBlocks: per + 64,
			HeartbeatInterval: c.Heartbeat,
		}
	}
	cl, err := startCluster(ctx, &gatewayConfig{policy: config.PolicyLeastOutstanding, heartbeat: c.Heartbeat, idleTimeout: 2 * time.Hour}, engines)
	if err != nil {
		return row, err
	}
	defer cl.close()
	req := loadgen.Completion(c.Model, 2, true)
	if row.direct, row.openDirect, err = holdAndMeasure(ctx, loadgen.RoundRobin(cl.engineURLs()), req, n, ""); err != nil {
		return row, fmt.Errorf("direct: %w", err)
	}
	profile := ""
	if row.requested == slices.Max(c.Streams) {
		profile = c.MemProfile
	}
	if row.viaGW, row.openGateway, err = holdAndMeasure(ctx, loadgen.Fixed(cl.url()), req, n, profile); err != nil {
		return row, fmt.Errorf("gateway: %w", err)
	}
	return row, nil
}

// holdAndMeasure opens n streams with a fresh client, measures the growth
// of HeapInuse+StackInuse and of goroutines (after a GC), closes them and
// waits until their goroutines are gone. With profile set it writes a heap
// profile there while the streams are open.
func holdAndMeasure(ctx context.Context, p loadgen.Picker, req loadgen.Request, n int, profile string) (memSample, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	client := loadgen.NewClient(0)
	defer client.CloseIdleConnections()
	base, g0 := inUse()
	start := time.Now()
	s, err := loadgen.Hold(ctx, client, p, req, n, 64)
	if err != nil {
		return memSample{}, 0, err
	}
	took := time.Since(start)
	held, g1 := inUse()
	var perr error
	if profile != "" {
		perr = writeHeapProfile(profile)
	}
	s.Close()
	client.CloseIdleConnections()
	// The servers' handlers end asynchronously once the clients are gone.
	for deadline := time.Now().Add(30 * time.Second); runtime.NumGoroutine() > g0+16 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	return memSample{bytes: held.total() - base.total(), stack: int64(held.StackInuse) - int64(base.StackInuse), goroutines: g1 - g0}, took, perr
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("memprofile: %w", err)
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("memprofile: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("memprofile: %w", err)
	}
	return nil
}

// memStats are the figures read after a full collection.
type memStats struct{ HeapInuse, StackInuse uint64 }

func (m memStats) total() int64 { return int64(m.HeapInuse + m.StackInuse) }

// inUse returns the memory in use after a full collection, and the number
// of goroutines.
func inUse() (memStats, int) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memStats{HeapInuse: m.HeapInuse, StackInuse: m.StackInuse}, runtime.NumGoroutine()
}

func memorySection(rows []memoryRow) section {
	t := &table{header: []string{"open streams", "gateway KiB per stream", "of which goroutine stacks", "through the gateway KiB per stream (whole process)",
		"straight to engines KiB per stream (client + engine)", "gateway goroutines per stream", "time to open (direct / gateway)"}}
	var notes []string
	for _, r := range rows {
		label := strconv.Itoa(r.streams)
		if r.reduced != "" {
			label = fmt.Sprintf("%d (of %d asked)", r.streams, r.requested)
			notes = append(notes, fmt.Sprintf("%d streams were asked for and %d measured: %s.", r.requested, r.streams, r.reduced))
		}
		t.add(label, f1(r.gatewayPerStream()/1024), f1(r.gatewayStackPerStream()/1024), f1(float64(r.viaGW.bytes)/float64(r.streams)/1024),
			f1(float64(r.direct.bytes)/float64(r.streams)/1024),
			f1(float64(r.viaGW.goroutines-r.direct.goroutines)/float64(r.streams)),
			r.openDirect.Round(time.Millisecond).String()+" / "+r.openGateway.Round(time.Millisecond).String())
		notes = append(notes, fmt.Sprintf("Target: under 50 KiB per open stream at %d streams: %.1f KiB — %s.",
			r.streams, r.gatewayPerStream()/1024, metOrMissed(r.gatewayPerStream() < 50*1024)))
	}
	lead := fmt.Sprintf("Streamed completions held open: %d reference engines (%s) emit the first token at once and the next after an hour, "+
		"so every stream is open end to end with nothing to relay. runtime.MemStats HeapInuse+StackInuse (after GC) grows by Δ while "+
		"the streams are open; the streams are opened once straight to the engines and once through the gateway, and the gateway's "+
		"own share is (Δgateway − Δdirect) / streams. All three parties share one process, hence the subtraction.", memoryEngines, flatModel(0, time.Hour))
	return section{title: "Gateway memory per open stream", lead: lead, tables: []*table{t}, notes: notes}
}

func memoryPlots(rows []memoryRow) []plotFile {
	gw := svgplot.Series{Name: "gateway", Line: true}
	whole := svgplot.Series{Name: "whole process", Line: true}
	direct := svgplot.Series{Name: "client + engine", Line: true}
	target := svgplot.Series{Name: "target 50 KiB", Line: true, NoMarkers: true}
	for _, r := range rows {
		x := float64(r.streams)
		gw.Points = append(gw.Points, svgplot.Point{X: x, Y: r.gatewayPerStream() / 1024, Label: fmt.Sprintf("%.1f", r.gatewayPerStream()/1024)})
		whole.Points = append(whole.Points, svgplot.Point{X: x, Y: float64(r.viaGW.bytes) / float64(r.streams) / 1024})
		direct.Points = append(direct.Points, svgplot.Point{X: x, Y: float64(r.direct.bytes) / float64(r.streams) / 1024})
	}
	if len(gw.Points) == 0 {
		return nil
	}
	target.Points = []svgplot.Point{{X: gw.Points[0].X, Y: 50}, {X: gw.Points[len(gw.Points)-1].X, Y: 50}}
	return []plotFile{{name: "memory", plot: svgplot.Plot{
		Title: "Memory per open stream", XLabel: "open streams", YLabel: "KiB per stream (HeapInuse+StackInuse)",
		Width: 960, Height: 600, Series: []svgplot.Series{gw, whole, direct, target},
	}}}
}
