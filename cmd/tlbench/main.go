// Command tlbench benchmarks the gateway on loopback, in one process: it
// starts reference engines with realistic costs and a gateway, drives
// workloads with concurrent keep-alive clients and prints markdown tables:
//
//  1. routing quality per policy (the gateway's least_outstanding, weighted
//     and affinity, and random and round-robin clients that bypass it):
//     prefix-cache hit rate, TTFT, latency, throughput and load balance, on
//     shared-prompt, all-distinct and mixed chat workloads;
//  2. overhead: latency at a fixed request rate and maximum throughput
//     straight to a zero-cost engine, through the gateway and through nginx;
//  3. scale: the route decision time at growing fleet sizes, and the
//     gateway's memory per open stream;
//  4. overload: goodput, p99 and the share of two keys at 2× and 5× the
//     fleet's capacity, with and without admission control.
//
// With -out it also writes the tables (results.md) and SVG plots (and PNGs
// when rsvg-convert is installed) into that directory. Every run is bounded
// in requests and time; -quick finishes in well under a minute.
//
//	go run ./cmd/tlbench -out docs/bench
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
)

func main() {
	if ran, err := runRole(); ran {
		if err != nil {
			fmt.Fprintln(os.Stderr, "tlbench:", err)
			os.Exit(1)
		}
		return
	}
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tlbench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tlbench:", err)
		os.Exit(1)
	}
}

// Experiments, as named by -only.
const (
	expRouting  = "routing"
	expOverhead = "overhead"
	expScale    = "scale"
	expMemory   = "memory"
	expOverload = "overload"
)

var experiments = []string{expRouting, expOverhead, expScale, expMemory, expOverload}

// settings is everything a run needs; preset gives the full and quick ones
// and flags override parts.
type settings struct {
	only    []string      // experiments to run, in order
	out     string        // directory for results.md and plots; "" writes none
	nginx   string        // nginx binary; "" looks it up on PATH
	timeout time.Duration // bounds the whole run
	seed    uint64
	model   string

	// Routing quality.
	engines                int
	requests, concurrency  int
	prefill, decode        time.Duration
	kvBlocks, maxRunning   int
	maxTokens              int
	systemPrompts          int
	systemBytes, userBytes int
	streamFraction         float64
	loadFactor             float64
	heartbeat              time.Duration
	workloads              []loadgen.Kind
	sweepPrompts           []int // shared prompt counts of the working-set sweep
	// rag runs on engines of kvBlocksLong blocks, multi-turn on engines of
	// kvBlocksTurns blocks with turnRequests turns in all.
	kvBlocksLong, kvBlocksTurns, turnRequests     int
	conversations, turnSystemBytes, turnUserBytes int
	answerBytes                                   int
	think                                         time.Duration // a multi-turn user's time between an answer and the next turn
	documents, documentBytes, ragSystemBytes      int
	cacheLoadWeight                               float64  // cache_aware_load_weight; 0: the gateway's default
	admission                                     bool     // admission control on in the routing runs' gateways
	routePolicies                                 []string // policies the routing runs compare

	// Overhead.
	rate            float64
	rateDuration    time.Duration
	rounds          int
	tputConcurrency int
	tputDuration    time.Duration
	overheadTokens  int

	// Scale.
	workers    []int
	pickBudget time.Duration
	pickMinOps int
	streams    []int
	memprofile string // heap profile of the held streams, if set
	cpuprofile string // CPU profile of the run, if set

	// Overload (overload.go).
	overloadEngines, overloadRunning, overloadTokens, overloadQueue int
	overloadDecode, overloadQueueTimeout, overloadSLO               time.Duration
	overloadDuration, overloadClientTimeout                         time.Duration
	overloadMultiples                                               []float64
}

// preset returns the full benchmark's configuration, or the quick one.
func preset(quick bool) settings {
	c := settings{
		only:    slices.Clone(experiments),
		timeout: 15 * time.Minute,
		seed:    1,
		model:   "bench",

		engines: 4, requests: 600, concurrency: 48,
		prefill: 75 * time.Microsecond, decode: 3 * time.Millisecond,
		kvBlocks: 160, maxRunning: 8, maxTokens: 24,
		systemPrompts: 4, systemBytes: 1536, userBytes: 160,
		streamFraction: 0.5, loadFactor: 1.25, heartbeat: time.Second,
		workloads: slices.Clone(loadgen.Kinds), sweepPrompts: []int{4, 8, 16, 32, 64},
		kvBlocksLong: 512, kvBlocksTurns: 1024, turnRequests: 1200, conversations: 64, turnSystemBytes: 256, turnUserBytes: 128, answerBytes: 96, think: 100 * time.Millisecond,
		documents: 40, documentBytes: 3072, ragSystemBytes: 256, routePolicies: slices.Clone(policies),

		rate: 1000, rateDuration: 3 * time.Second, rounds: 3,
		tputConcurrency: 32, tputDuration: 3 * time.Second, overheadTokens: 4,

		workers: []int{4, 64, 1024}, pickBudget: time.Second, pickMinOps: 2000,
		streams: []int{1000, 10000},

		overloadEngines: 2, overloadRunning: 4, overloadTokens: 16, overloadQueue: 16,
		overloadDecode: 8 * time.Millisecond, overloadQueueTimeout: 2 * time.Second, overloadSLO: time.Second,
		overloadDuration: 5 * time.Second, overloadClientTimeout: 10 * time.Second,
		overloadMultiples: []float64{2, 5},
	}
	if quick {
		c.timeout = 2 * time.Minute
		c.requests, c.concurrency, c.turnRequests = 160, 32, 320
		c.sweepPrompts = []int{16}
		c.rateDuration, c.rounds = time.Second, 1
		c.tputDuration = time.Second
		c.pickBudget, c.pickMinOps = 100*time.Millisecond, 500
		c.streams = []int{1000}
		c.overloadDuration, c.overloadClientTimeout = 2*time.Second, 5*time.Second
	}
	return c
}

// parseFlags reads the command line over the preset -quick selects.
func parseFlags(args []string, errOut io.Writer) (settings, error) {
	fs := flag.NewFlagSet("tlbench", flag.ContinueOnError)
	fs.SetOutput(errOut)
	quick := fs.Bool("quick", false, "a smaller, faster run (well under a minute) for a smoke test")
	out := fs.String("out", "", "write results.md and the plots (SVG, and PNG with rsvg-convert) into this directory")
	only := fs.String("only", "", "comma-separated experiments to run: "+strings.Join(experiments, ","))
	nginx := fs.String("nginx", "", "nginx binary for the overhead comparison (default: nginx on PATH; missing: skipped)")
	timeout := fs.Duration("timeout", 0, "bound on the whole run (default 15m, 2m with -quick)")
	requests := fs.Int("requests", 0, "requests per routing run (default 600, 160 with -quick)")
	concurrency := fs.Int("concurrency", 0, "concurrent clients of a routing run (default 48, 32 with -quick)")
	kvBlocks := fs.Int("kv-blocks", 0, "KV blocks of 16 tokens per routing engine (default 160)")
	kvBlocksLong := fs.Int("kv-blocks-long", 0, "KV blocks of 16 tokens per engine of the rag runs (default 512)")
	kvBlocksTurns := fs.Int("kv-blocks-turns", 0, "KV blocks of 16 tokens per engine of the multi-turn runs (default 1024)")
	turnRequests := fs.Int("turn-requests", 0, "turns per multi-turn run, all conversations together (default 1200, 320 with -quick)")
	rate := fs.Float64("rate", 0, "requests per second of the overhead latency runs (default 1000)")
	workers := fs.String("workers", "", "fleet sizes of the route decision timing (default 4,64,1024)")
	streams := fs.String("streams", "", "open-stream counts of the memory measurement (default 1000,10000; 1000 with -quick)")
	workloads := fs.String("workloads", "", "comma-separated routing workloads (default shared,distinct,mixed,multi-turn,rag)")
	pols := fs.String("policies", "", "comma-separated routing policies to compare (default all: "+strings.Join(policies, ",")+")")
	sweep := fs.String("sweep", "", "shared system prompt counts of the routing sweep (default 4,8,16,32,64; 16 with -quick)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (every party in the process) to this file")
	memprofile := fs.String("memprofile", "", "write a heap profile while the largest stream count is held open through the gateway")
	seed := fs.Uint64("seed", 1, "seed of the workloads and the random baseline")
	think := fs.Duration("think", -1, "a multi-turn user's think time between an answer and the next turn (default 100ms)")
	admission := fs.Bool("admission", false, "turn admission control on (limits derived from the engines' reports) in the routing runs' gateways")
	loadWeight := fs.Float64("cache-load-weight", 0, "cache_aware_load_weight of the cache_aware runs (default: the gateway's)")
	if err := fs.Parse(args); err != nil {
		return settings{}, err
	}
	if fs.NArg() > 0 {
		return settings{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	c := preset(*quick)
	c.out, c.nginx, c.seed, c.memprofile, c.cpuprofile = *out, *nginx, *seed, *memprofile, *cpuprofile
	if *loadWeight < 0 {
		return settings{}, fmt.Errorf("-cache-load-weight: must not be negative, got %v", *loadWeight)
	}
	c.cacheLoadWeight, c.admission = *loadWeight, *admission
	if *only != "" {
		c.only = nil
		for _, e := range strings.Split(*only, ",") {
			e = strings.TrimSpace(e)
			if !slices.Contains(experiments, e) {
				return settings{}, fmt.Errorf("-only: unknown experiment %q (want %s)", e, strings.Join(experiments, ", "))
			}
			if !slices.Contains(c.only, e) {
				c.only = append(c.only, e)
			}
		}
	}
	positive := []struct {
		name string
		v    *int
		dst  *int
	}{{"requests", requests, &c.requests}, {"concurrency", concurrency, &c.concurrency}, {"kv-blocks", kvBlocks, &c.kvBlocks}, {"kv-blocks-long", kvBlocksLong, &c.kvBlocksLong},
		{"kv-blocks-turns", kvBlocksTurns, &c.kvBlocksTurns}, {"turn-requests", turnRequests, &c.turnRequests}}
	for _, p := range positive {
		if *p.v < 0 {
			return settings{}, fmt.Errorf("-%s: must be positive, got %d", p.name, *p.v)
		}
		if *p.v > 0 {
			*p.dst = *p.v
		}
	}
	if *think >= 0 {
		c.think = *think
	} else if *think != -1 {
		return settings{}, fmt.Errorf("-think: must not be negative, got %v", *think)
	}
	if *timeout < 0 || *rate < 0 {
		return settings{}, errors.New("-timeout and -rate must not be negative")
	}
	if *timeout > 0 {
		c.timeout = *timeout
	}
	if *rate > 0 {
		c.rate = *rate
	}
	var err error
	if *workers != "" {
		if c.workers, err = parseInts(*workers); err != nil {
			return settings{}, fmt.Errorf("-workers: %w", err)
		}
	}
	if *workloads != "" {
		c.workloads = nil
		for _, w := range strings.Split(*workloads, ",") {
			k := loadgen.Kind(strings.TrimSpace(w))
			if !slices.Contains(loadgen.Kinds, k) {
				return settings{}, fmt.Errorf("-workloads: unknown workload %q", w)
			}
			c.workloads = append(c.workloads, k)
		}
	}
	if *pols != "" {
		c.routePolicies = nil
		for _, p := range strings.Split(*pols, ",") {
			p = strings.TrimSpace(p)
			if !slices.Contains(policies, p) {
				return settings{}, fmt.Errorf("-policies: unknown policy %q (want %s)", p, strings.Join(policies, ", "))
			}
			c.routePolicies = append(c.routePolicies, p)
		}
	}
	if *sweep != "" {
		if c.sweepPrompts, err = parseInts(*sweep); err != nil {
			return settings{}, fmt.Errorf("-sweep: %w", err)
		}
	}
	if *streams != "" {
		if c.streams, err = parseInts(*streams); err != nil {
			return settings{}, fmt.Errorf("-streams: %w", err)
		}
	}
	return c, nil
}

// parseInts reads a comma-separated list of positive integers.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("not a positive integer: %q", p)
		}
		out = append(out, n)
	}
	return out, nil
}

// run runs the configured experiments in order, printing each section to
// out as it completes; progress goes to logOut.
func run(ctx context.Context, c settings, out, logOut io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if c.cpuprofile != "" {
		f, err := os.Create(c.cpuprofile)
		if err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	started := time.Now()
	rep := &report{}
	rep.add(out, machineSection(ctx, c))
	var plots []plotFile
	for _, e := range c.only {
		fmt.Fprintf(logOut, "tlbench: %s...\n", e)
		var sec section
		var ps []plotFile
		var err error
		switch e {
		case expRouting:
			sec, ps, err = routingExperiment(ctx, c, logOut)
		case expOverhead:
			sec, ps, err = overheadExperiment(ctx, c, logOut)
		case expScale:
			sec, ps, err = scaleExperiment(ctx, c)
		case expMemory:
			sec, ps, err = memoryExperiment(ctx, c, logOut)
		case expOverload:
			sec, ps, err = overloadExperiment(ctx, c, logOut)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", e, err)
		}
		rep.add(out, sec)
		plots = append(plots, ps...)
	}
	fmt.Fprintf(logOut, "tlbench: done in %v\n", time.Since(started).Round(time.Millisecond))
	if c.out == "" {
		return nil
	}
	return rep.write(c.out, plots)
}
