// Package tlbench is tlgate's benchmark: it starts reference engines with
// realistic costs and gateways on loopback, drives workloads with
// concurrent keep-alive clients and reports markdown tables:
//
//  1. routing quality per policy (the gateway's least_outstanding, weighted,
//     affinity and cache_aware, and random and round-robin clients that
//     bypass it): prefix-cache hit rate, TTFT, latency, throughput and load
//     balance, on shared-prompt, all-distinct, mixed chat, multi-turn and
//     RAG workloads;
//  2. overhead: latency at a fixed request rate and maximum throughput
//     straight to a zero-cost engine, through the gateway and through nginx;
//  3. scale: the route decision time at growing fleet sizes, and the
//     gateway's memory per open stream;
//  4. overload: goodput, p99 and the share of two keys at 2× and 5× the
//     fleet's capacity, with and without admission control.
//
// With Config.Out set it also writes the tables (results.md) and SVG plots
// (and PNGs when rsvg-convert is installed) into that directory. Every run
// is bounded in requests and time. cmd/tlbench fills a Config from its
// flags and calls Run.
package tlbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
)

// The experiments, as Config.Only names them.
const (
	ExpRouting  = "routing"
	ExpOverhead = "overhead"
	ExpScale    = "scale"
	ExpMemory   = "memory"
	ExpOverload = "overload"
)

// Experiments are all the experiments, in the order a full run runs them.
var Experiments = []string{ExpRouting, ExpOverhead, ExpScale, ExpMemory, ExpOverload}

// Config is everything a run needs; Preset gives the full and quick ones
// and cmd/tlbench's flags override parts.
type Config struct {
	Only    []string      // experiments to run, in order
	Out     string        // directory for results.md and plots; "" writes none
	Nginx   string        // nginx binary; "" looks it up on PATH
	Timeout time.Duration // bounds the whole run
	Seed    uint64
	Model   string

	// Routing quality.
	Engines                int
	Requests, Concurrency  int
	Prefill, Decode        time.Duration
	KVBlocks, MaxRunning   int
	MaxTokens              int
	SystemPrompts          int
	SystemBytes, UserBytes int
	StreamFraction         float64
	LoadFactor             float64
	Heartbeat              time.Duration
	Workloads              []loadgen.Kind
	SweepPrompts           []int // shared prompt counts of the working-set sweep
	// rag runs on engines of KVBlocksLong blocks, multi-turn on engines of
	// KVBlocksTurns blocks with TurnRequests turns in all.
	KVBlocksLong, KVBlocksTurns, TurnRequests     int
	Conversations, TurnSystemBytes, TurnUserBytes int
	AnswerBytes                                   int
	Think                                         time.Duration // a multi-turn user's time between an answer and the next turn
	Documents, DocumentBytes, RAGSystemBytes      int
	CacheLoadWeight                               float64  // cache_aware_load_weight; 0: the gateway's default
	Admission                                     bool     // admission control on in the routing runs' gateways
	RoutePolicies                                 []string // policies the routing runs compare

	// Overhead.
	Rate            float64
	RateDuration    time.Duration
	Rounds          int
	TputConcurrency int
	TputDuration    time.Duration
	OverheadTokens  int

	// Scale.
	Workers    []int
	PickBudget time.Duration
	PickMinOps int
	Streams    []int
	MemProfile string // heap profile of the held streams, if set
	CPUProfile string // CPU profile of the run, if set

	// Overload (overload.go).
	OverloadEngines, OverloadRunning, OverloadTokens, OverloadQueue int
	OverloadDecode, OverloadQueueTimeout, OverloadSLO               time.Duration
	OverloadDuration, OverloadClientTimeout                         time.Duration
	OverloadMultiples                                               []float64
}

// Preset returns the full benchmark's configuration, or the quick one.
func Preset(quick bool) Config {
	c := Config{
		Only:    slices.Clone(Experiments),
		Timeout: 15 * time.Minute,
		Seed:    1,
		Model:   "bench",

		Engines: 4, Requests: 600, Concurrency: 48,
		Prefill: 75 * time.Microsecond, Decode: 3 * time.Millisecond,
		KVBlocks: 160, MaxRunning: 8, MaxTokens: 24,
		SystemPrompts: 4, SystemBytes: 1536, UserBytes: 160,
		StreamFraction: 0.5, LoadFactor: 1.25, Heartbeat: time.Second,
		Workloads: slices.Clone(loadgen.Kinds), SweepPrompts: []int{4, 8, 16, 32, 64},
		KVBlocksLong: 512, KVBlocksTurns: 1024, TurnRequests: 1200, Conversations: 64, TurnSystemBytes: 256, TurnUserBytes: 128, AnswerBytes: 96, Think: 100 * time.Millisecond,
		Documents: 40, DocumentBytes: 3072, RAGSystemBytes: 256, RoutePolicies: slices.Clone(Policies),

		Rate: 1000, RateDuration: 3 * time.Second, Rounds: 3,
		TputConcurrency: 32, TputDuration: 3 * time.Second, OverheadTokens: 4,

		Workers: []int{4, 64, 1024}, PickBudget: time.Second, PickMinOps: 2000,
		Streams: []int{1000, 10000},

		OverloadEngines: 2, OverloadRunning: 4, OverloadTokens: 16, OverloadQueue: 16,
		OverloadDecode: 8 * time.Millisecond, OverloadQueueTimeout: 2 * time.Second, OverloadSLO: time.Second,
		OverloadDuration: 5 * time.Second, OverloadClientTimeout: 10 * time.Second,
		OverloadMultiples: []float64{2, 5},
	}
	if quick {
		c.Timeout = 2 * time.Minute
		c.Requests, c.Concurrency, c.TurnRequests = 160, 32, 320
		c.SweepPrompts = []int{16}
		c.RateDuration, c.Rounds = time.Second, 1
		c.TputDuration = time.Second
		c.PickBudget, c.PickMinOps = 100*time.Millisecond, 500
		c.Streams = []int{1000}
		c.OverloadDuration, c.OverloadClientTimeout = 2*time.Second, 5*time.Second
	}
	return c
}

// parseFlags reads the command line over the preset -quick selects.
func parseFlags(args []string, errOut io.Writer) (Config, error) {
	fs := flag.NewFlagSet("tlbench", flag.ContinueOnError)
	fs.SetOutput(errOut)
	quick := fs.Bool("quick", false, "a smaller, faster run (well under a minute) for a smoke test")
	out := fs.String("out", "", "write results.md and the plots (SVG, and PNG with rsvg-convert) into this directory")
	only := fs.String("only", "", "comma-separated experiments to run: "+strings.Join(Experiments, ","))
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
	pols := fs.String("policies", "", "comma-separated routing policies to compare (default all: "+strings.Join(Policies, ",")+")")
	sweep := fs.String("sweep", "", "shared system prompt counts of the routing sweep (default 4,8,16,32,64; 16 with -quick)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (every party in the process) to this file")
	memprofile := fs.String("memprofile", "", "write a heap profile while the largest stream count is held open through the gateway")
	seed := fs.Uint64("seed", 1, "seed of the workloads and the random baseline")
	think := fs.Duration("think", -1, "a multi-turn user's think time between an answer and the next turn (default 100ms)")
	admission := fs.Bool("admission", false, "turn admission control on (limits derived from the engines' reports) in the routing runs' gateways")
	loadWeight := fs.Float64("cache-load-weight", 0, "cache_aware_load_weight of the cache_aware runs (default: the gateway's)")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	c := Preset(*quick)
	c.Out, c.Nginx, c.Seed, c.MemProfile, c.CPUProfile = *out, *nginx, *seed, *memprofile, *cpuprofile
	if *loadWeight < 0 {
		return Config{}, fmt.Errorf("-cache-load-weight: must not be negative, got %v", *loadWeight)
	}
	c.CacheLoadWeight, c.Admission = *loadWeight, *admission
	if *only != "" {
		c.Only = nil
		for _, e := range strings.Split(*only, ",") {
			e = strings.TrimSpace(e)
			if !slices.Contains(Experiments, e) {
				return Config{}, fmt.Errorf("-only: unknown experiment %q (want %s)", e, strings.Join(Experiments, ", "))
			}
			if !slices.Contains(c.Only, e) {
				c.Only = append(c.Only, e)
			}
		}
	}
	positive := []struct {
		name string
		v    *int
		dst  *int
	}{{"requests", requests, &c.Requests}, {"concurrency", concurrency, &c.Concurrency}, {"kv-blocks", kvBlocks, &c.KVBlocks}, {"kv-blocks-long", kvBlocksLong, &c.KVBlocksLong},
		{"kv-blocks-turns", kvBlocksTurns, &c.KVBlocksTurns}, {"turn-requests", turnRequests, &c.TurnRequests}}
	for _, p := range positive {
		if *p.v < 0 {
			return Config{}, fmt.Errorf("-%s: must be positive, got %d", p.name, *p.v)
		}
		if *p.v > 0 {
			*p.dst = *p.v
		}
	}
	if *think >= 0 {
		c.Think = *think
	} else if *think != -1 {
		return Config{}, fmt.Errorf("-think: must not be negative, got %v", *think)
	}
	if *timeout < 0 || *rate < 0 {
		return Config{}, errors.New("-timeout and -rate must not be negative")
	}
	if *timeout > 0 {
		c.Timeout = *timeout
	}
	if *rate > 0 {
		c.Rate = *rate
	}
	var err error
	if *workers != "" {
		if c.Workers, err = parseInts(*workers); err != nil {
			return Config{}, fmt.Errorf("-workers: %w", err)
		}
	}
	if *workloads != "" {
		c.Workloads = nil
		for _, w := range strings.Split(*workloads, ",") {
			k := loadgen.Kind(strings.TrimSpace(w))
			if !slices.Contains(loadgen.Kinds, k) {
				return Config{}, fmt.Errorf("-workloads: unknown workload %q", w)
			}
			c.Workloads = append(c.Workloads, k)
		}
	}
	if *pols != "" {
		c.RoutePolicies = nil
		for _, p := range strings.Split(*pols, ",") {
			p = strings.TrimSpace(p)
			if !slices.Contains(Policies, p) {
				return Config{}, fmt.Errorf("-policies: unknown policy %q (want %s)", p, strings.Join(Policies, ", "))
			}
			c.RoutePolicies = append(c.RoutePolicies, p)
		}
	}
	if *sweep != "" {
		if c.SweepPrompts, err = parseInts(*sweep); err != nil {
			return Config{}, fmt.Errorf("-sweep: %w", err)
		}
	}
	if *streams != "" {
		if c.Streams, err = parseInts(*streams); err != nil {
			return Config{}, fmt.Errorf("-streams: %w", err)
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

// Run runs the configured experiments in order, printing each section to
// out as it completes; progress goes to logOut.
func Run(ctx context.Context, c Config, out, logOut io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	if c.CPUProfile != "" {
		f, err := os.Create(c.CPUProfile)
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
	for _, e := range c.Only {
		fmt.Fprintf(logOut, "tlbench: %s...\n", e)
		var sec section
		var ps []plotFile
		var err error
		switch e {
		case ExpRouting:
			sec, ps, err = routingExperiment(ctx, c, logOut)
		case ExpOverhead:
			sec, ps, err = overheadExperiment(ctx, c, logOut)
		case ExpScale:
			sec, ps, err = scaleExperiment(ctx, c)
		case ExpMemory:
			sec, ps, err = memoryExperiment(ctx, c, logOut)
		case ExpOverload:
			sec, ps, err = overloadExperiment(ctx, c, logOut)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", e, err)
		}
		rep.add(out, sec)
		plots = append(plots, ps...)
	}
	fmt.Fprintf(logOut, "tlbench: done in %v\n", time.Since(started).Round(time.Millisecond))
	if c.Out == "" {
		return nil
	}
	return rep.write(c.Out, plots)
}
