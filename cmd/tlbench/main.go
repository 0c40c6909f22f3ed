// Command tlbench benchmarks the gateway on loopback: reference engines
// with realistic costs, the gateway in process or as separate processes,
// and concurrent keep-alive clients; it prints markdown tables of routing
// quality, overhead, scale, memory and overload (see package
// internal/tool/bench/tlbench, which holds the experiments).
//
// main parses the flags into a tlbench.Config and calls tlbench.Run. With
// -out it also writes the tables and plots into that directory; -quick is
// a smoke test that finishes in well under a minute.
//
//	go run ./cmd/tlbench -out docs/bench
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
	"github.com/tlgate/tlgate/internal/tool/bench/tlbench"
)

func main() {
	if ran, err := tlbench.RunRole(); ran {
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
	if err := tlbench.Run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tlbench:", err)
		os.Exit(1)
	}
}

// parseFlags reads the command line over the preset -quick selects.
func parseFlags(args []string, errOut io.Writer) (tlbench.Config, error) {
	fs := flag.NewFlagSet("tlbench", flag.ContinueOnError)
	fs.SetOutput(errOut)
	quick := fs.Bool("quick", false, "a smaller, faster run (well under a minute) for a smoke test")
	out := fs.String("out", "", "write results.md and the plots (SVG, and PNG with rsvg-convert) into this directory")
	only := fs.String("only", "", "comma-separated experiments to run (default "+strings.Join(tlbench.Experiments, ",")+"; also "+strings.Join(tlbench.Optional, ",")+")")
	nginx := fs.String("nginx", "", "nginx binary for the overhead comparison (default: nginx on PATH; missing: skipped)")
	timeout := fs.Duration("timeout", 0, "bound on the whole run (default 15m, 2m with -quick; with openloop 4h, with pd 45m, either 10m with -quick)")
	openRates := fs.String("open-rates", "", "openloop, kvevents: arrival rates in percent of least_outstanding's single-replica capacity (default 50,70,90,110; 70 with -quick)")
	openGoodputRates := fs.String("open-goodput-rates", "", "openloop: rates beyond -open-rates, in percent, run through the most replicas only to find where each policy's goodput ends (default 130,160,200; none with -quick; \"none\" for none)")
	openReplicas := fs.String("open-replicas", "", "openloop: gateway replica counts (default 1,2,3; 1,3 with -quick)")
	openSync := fs.String("open-sync", "", "openloop: fleet sync settings to compare, off and/or on (default off,on)")
	openRepeats := fs.Int("open-repeats", 0, "openloop, synccost, kvevents: runs of every configuration (default 3, 1 with -quick)")
	openDuration := fs.Duration("open-duration", 0, "openloop, synccost, kvevents: how long each run sends, its warmup included (default 8s, 4s with -quick)")
	openWorkloads := fs.String("open-workloads", "", "openloop, kvevents: workloads (default multi-turn,rag)")
	kvSample := fs.Int("kv-agreement-sample", 0, "kvevents: the gateway's [gateway.kv_events] agreement_sample (default: the gateway's)")
	kvPressure := fs.Float64("kv-pressure", 0, "kvevents: the share of the workload's working set the fleet's KV holds (default 1/3: the engines evict; above 1 their caches hold it all)")
	kvAgreement := fs.String("kv-index-agreement", "", "kvevents: the events arm's [gateway.kv_events] index_agreement, 0 included (0: every pick tokenized and made on the events; default: the gateway's)")
	numberShare := fs.Float64("number-share", 0, "routing, openloop, kvevents: the share of the workloads' words that are numbers, read one token per byte (0: words alone, about 5.9 bytes per token; 0.1: about 4; 0.2: about 3)")
	openOneEntry := fs.Bool("open-one-entry", false, "openloop: send every request to the first replica, the others only heartbeating and syncing (a control)")
	sharePeersSilent := fs.Bool("share-peers-silent", false, "openloop, synccost: the sync cost's mirror peers publish nothing, so one replica's share prices its own publishing alone")
	overheadProfile := fs.Bool("overhead-profile", false, "overhead: after each mode's measured runs, take a CPU profile of the gateway over one more fixed-rate run (kept in -out as overhead-<mode>.pprof, with allocation profiles from before and after it, overhead-<mode>-allocs-before.pprof and -after.pprof; the table does not count it)")
	shareProfile := fs.Bool("share-profile", false, "openloop, synccost: take a CPU profile of the sync cost share's gateway in each run and report where its CPU goes (the profiles are kept in -out)")
	openPolicies := fs.String("open-policies", "", "openloop: routing policies to compare, least_outstanding and/or cache_aware (default both)")
	openSyncBatch := fs.Duration("open-sync-batch", 0, "openloop, synccost: the replicas' [gateway.sync] batch_interval (default: the gateway's)")
	openReleaseHold := fs.String("open-release-hold", "", "openloop, synccost: the replicas' [gateway.sync] release_hold, 0 included (default: the gateway's)")
	requests := fs.Int("requests", 0, "requests per routing run (default 600, 160 with -quick)")
	concurrency := fs.Int("concurrency", 0, "concurrent clients of a routing run (default 48, 32 with -quick)")
	kvBlocks := fs.Int("kv-blocks", 0, "KV blocks of 16 tokens per routing engine (default 160)")
	kvBlocksLong := fs.Int("kv-blocks-long", 0, "KV blocks of 16 tokens per engine of the rag runs (default 512)")
	kvBlocksTurns := fs.Int("kv-blocks-turns", 0, "KV blocks of 16 tokens per engine of the multi-turn runs (default 1024)")
	turnRequests := fs.Int("turn-requests", 0, "turns per multi-turn run, all conversations together (default 1200, 320 with -quick)")
	turnSystemBytes := fs.Int("turn-system-bytes", 0, "bytes of a multi-turn conversation's system prompt (default 256)")
	turnUserBytes := fs.Int("turn-user-bytes", 0, "bytes of each multi-turn user message (default 128)")
	answerBytes := fs.Int("answer-bytes", 0, "bytes of each answer a multi-turn prompt carries into the next turn (default 96)")
	rate := fs.Float64("rate", 0, "requests per second of the overhead latency runs (default 1000)")
	overheadRounds := fs.Int("overhead-rounds", 0, "overhead: interleaved rounds of the fixed-rate runs, each path once per round (default 3, 1 with -quick)")
	workers := fs.String("workers", "", "fleet sizes of the route decision timing (default 4,64,1024)")
	streams := fs.String("streams", "", "open-stream counts of the memory measurement (default 1000,10000; 1000 with -quick)")
	workloads := fs.String("workloads", "", "comma-separated routing workloads (default shared,distinct,mixed,multi-turn,rag)")
	pols := fs.String("policies", "", "comma-separated routing policies to compare (default all: "+strings.Join(tlbench.Policies, ",")+")")
	sweep := fs.String("sweep", "", "shared system prompt counts of the routing sweep (default 4,8,16,32,64; 16 with -quick)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (every party in the process) to this file")
	memprofile := fs.String("memprofile", "", "write a heap profile while the largest stream count is held open through the gateway")
	seed := fs.Uint64("seed", 1, "seed of the workloads and the random baseline")
	think := fs.Duration("think", -1, "a multi-turn user's think time between an answer and the next turn (default 100ms)")
	admission := fs.String("admission", tlbench.AdmissionDefault, "the routing runs' admission control: default (the gateway's: on, limits per pool, derived from the engines' reports), off, or worker (limits per worker)")
	priorityRepeats := fs.Int("priority-repeats", 0, "priority: runs of every mode (default 3, 1 with -quick)")
	priorityDuration := fs.Duration("priority-duration", 0, "priority: how long each run sends, its warmup included (default 30s, 6s with -quick)")
	priorityModes := fs.String("priority-modes", "", "priority: modes to compare, of "+strings.Join(tlbench.PriorityModes, ",")+" (default all)")
	pdRates := fs.String("pd-rates", "", "pd: arrival rates in requests per second (default 12,18,24; 24 with -quick)")
	pdRepeats := fs.Int("pd-repeats", 0, "pd: runs of every fleet at every rate (default 3, 1 with -quick)")
	pdDuration := fs.Duration("pd-duration", 0, "pd: how long each run sends, its warmup included (default 15s, 8s with -quick)")
	pdSplits := fs.String("pd-splits", "", "pd: prefill engine counts of the disaggregated fleets, the rest of the engines decoding (default 2,1; 2 with -quick)")
	pdProtocols := fs.String("pd-protocols", "", "pd: disaggregation protocols, of "+strings.Join(tlbench.PDProtocols, ",")+" (default both)")
	loadWeight := fs.Float64("cache-load-weight", 0, "cache_aware_load_weight of the cache_aware runs (default: the gateway's)")
	enginePreset := fs.String("engine-preset", "", "routing, openloop, kvevents: run the engines on the step model of this enginesim preset ("+
		strings.Join(enginesim.PresetNames(), ", ")+"), each with its run's KV blocks and running sequences (default: the flat timing model)")
	if err := fs.Parse(args); err != nil {
		return tlbench.Config{}, err
	}
	if fs.NArg() > 0 {
		return tlbench.Config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	c := tlbench.Preset(*quick)
	c.Out, c.Nginx, c.Seed, c.MemProfile, c.CPUProfile = *out, *nginx, *seed, *memprofile, *cpuprofile
	if *loadWeight < 0 {
		return tlbench.Config{}, fmt.Errorf("-cache-load-weight: must not be negative, got %v", *loadWeight)
	}
	switch *admission {
	case tlbench.AdmissionDefault, tlbench.AdmissionOff, tlbench.AdmissionWorker:
	default:
		return tlbench.Config{}, fmt.Errorf("-admission: want %s, %s or %s, got %q", tlbench.AdmissionDefault, tlbench.AdmissionOff, tlbench.AdmissionWorker, *admission)
	}
	c.CacheLoadWeight, c.Admission = *loadWeight, *admission
	if err := tlbench.CheckEnginePreset(*enginePreset); err != nil {
		return tlbench.Config{}, fmt.Errorf("-engine-preset: %w", err)
	}
	c.EnginePreset = *enginePreset
	switch {
	case *kvPressure < 0:
		return tlbench.Config{}, fmt.Errorf("-kv-pressure: must not be negative, got %v", *kvPressure)
	case *kvPressure > 0:
		c.KVPressure = *kvPressure
	}
	if *kvAgreement != "" {
		a, err := strconv.ParseFloat(*kvAgreement, 64)
		if err != nil || a < 0 || a > 1 {
			return tlbench.Config{}, fmt.Errorf("-kv-index-agreement: want a share in [0, 1], got %q", *kvAgreement)
		}
		c.KVIndexAgreement = &a
	}
	if err := loadgen.CheckNumberShare(*numberShare); err != nil {
		return tlbench.Config{}, fmt.Errorf("-number-share: %w", err)
	}
	c.NumberShare = *numberShare
	if *kvSample < 0 {
		return tlbench.Config{}, fmt.Errorf("-kv-agreement-sample: must not be negative, got %d", *kvSample)
	}
	c.KVAgreementSample = *kvSample
	if *priorityRepeats < 0 {
		return tlbench.Config{}, fmt.Errorf("-priority-repeats: must not be negative, got %d", *priorityRepeats)
	} else if *priorityRepeats > 0 {
		c.PriorityRepeats = *priorityRepeats
	}
	if *priorityDuration < 0 {
		return tlbench.Config{}, fmt.Errorf("-priority-duration: must not be negative, got %v", *priorityDuration)
	} else if *priorityDuration > 0 {
		if *priorityDuration <= c.PriorityWarmup {
			return tlbench.Config{}, fmt.Errorf("-priority-duration: %v is not longer than the warmup of %v", *priorityDuration, c.PriorityWarmup)
		}
		c.PriorityDuration = *priorityDuration
	}
	if *priorityModes != "" {
		ms, err := chooseFrom("-priority-modes", *priorityModes, tlbench.PriorityModes)
		if err != nil {
			return tlbench.Config{}, err
		}
		c.PriorityModes = ms
	}
	if err := parsePD(&c, *pdRates, *pdSplits, *pdProtocols, *pdRepeats, *pdDuration); err != nil {
		return tlbench.Config{}, err
	}
	if *only != "" {
		c.Only = nil
		for _, e := range strings.Split(*only, ",") {
			e = strings.TrimSpace(e)
			if !slices.Contains(tlbench.Experiments, e) && !slices.Contains(tlbench.Optional, e) {
				return tlbench.Config{}, fmt.Errorf("-only: unknown experiment %q (want %s)", e, strings.Join(append(slices.Clone(tlbench.Experiments), tlbench.Optional...), ", "))
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
		{"kv-blocks-turns", kvBlocksTurns, &c.KVBlocksTurns}, {"turn-requests", turnRequests, &c.TurnRequests},
		{"turn-system-bytes", turnSystemBytes, &c.TurnSystemBytes}, {"turn-user-bytes", turnUserBytes, &c.TurnUserBytes}, {"answer-bytes", answerBytes, &c.AnswerBytes}}
	for _, p := range positive {
		if *p.v < 0 {
			return tlbench.Config{}, fmt.Errorf("-%s: must be positive, got %d", p.name, *p.v)
		}
		if *p.v > 0 {
			*p.dst = *p.v
		}
	}
	if *think >= 0 {
		c.Think = *think
	} else if *think != -1 {
		return tlbench.Config{}, fmt.Errorf("-think: must not be negative, got %v", *think)
	}
	if *timeout < 0 || *rate < 0 {
		return tlbench.Config{}, errors.New("-timeout and -rate must not be negative")
	}
	if *overheadRounds < 0 {
		return tlbench.Config{}, fmt.Errorf("-overhead-rounds: must not be negative, got %d", *overheadRounds)
	}
	if slices.Contains(c.Only, tlbench.ExpOpenLoop) || slices.Contains(c.Only, tlbench.ExpKVEvents) {
		c.Timeout = 4 * time.Hour // the default sweep runs about two hours on 2 cores
		if *quick {
			c.Timeout = 10 * time.Minute
		}
	}
	if slices.Contains(c.Only, tlbench.ExpPD) {
		c.Timeout = 45 * time.Minute // the default runs about 20 minutes on 2 cores (3 rates, 15 runs each)
		if *quick {
			c.Timeout = 10 * time.Minute
		}
	}
	if *timeout > 0 {
		c.Timeout = *timeout
	}
	if *rate > 0 {
		c.Rate = *rate
	}
	if *overheadRounds > 0 {
		c.Rounds = *overheadRounds
	}
	var err error
	if *workers != "" {
		if c.Workers, err = parseInts(*workers); err != nil {
			return tlbench.Config{}, fmt.Errorf("-workers: %w", err)
		}
	}
	if *workloads != "" {
		c.Workloads = nil
		for _, w := range strings.Split(*workloads, ",") {
			k := loadgen.Kind(strings.TrimSpace(w))
			if !slices.Contains(loadgen.Kinds, k) {
				return tlbench.Config{}, fmt.Errorf("-workloads: unknown workload %q", w)
			}
			c.Workloads = append(c.Workloads, k)
		}
	}
	if *pols != "" {
		ps, err := chooseFrom("-policies", *pols, tlbench.Policies)
		if err != nil {
			return tlbench.Config{}, err
		}
		c.RoutePolicies = ps
	}
	if *sweep != "" {
		if c.SweepPrompts, err = parseInts(*sweep); err != nil {
			return tlbench.Config{}, fmt.Errorf("-sweep: %w", err)
		}
	}
	if *streams != "" {
		if c.Streams, err = parseInts(*streams); err != nil {
			return tlbench.Config{}, fmt.Errorf("-streams: %w", err)
		}
	}
	if err := parseOpenLoop(&c, *openRates, *openGoodputRates, *openReplicas, *openSync, *openWorkloads, *openPolicies, *openRepeats, *openDuration); err != nil {
		return tlbench.Config{}, err
	}
	if *openSyncBatch < 0 {
		return tlbench.Config{}, fmt.Errorf("-open-sync-batch: must not be negative, got %v", *openSyncBatch)
	}
	c.OpenSyncBatch = *openSyncBatch
	if *openReleaseHold != "" {
		d, err := time.ParseDuration(*openReleaseHold)
		if err != nil || d < 0 {
			return tlbench.Config{}, fmt.Errorf("-open-release-hold: want a duration of 0 or more, got %q", *openReleaseHold)
		}
		c.OpenReleaseHold = &d
	}
	c.OpenOneEntry = *openOneEntry
	c.SharePeersSilent = *sharePeersSilent
	c.ShareProfile = *shareProfile
	c.OverheadProfile = *overheadProfile
	return c, nil
}

// parsePD applies the pd experiment's flags to c.
func parsePD(c *tlbench.Config, rates, splits, protocols string, repeats int, duration time.Duration) error {
	if rates != "" {
		c.PDRates = nil
		for _, p := range strings.Split(rates, ",") {
			r, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
			if err != nil || r <= 0 || math.IsInf(r, 0) {
				return fmt.Errorf("-pd-rates: not a positive rate: %q", p)
			}
			c.PDRates = append(c.PDRates, r)
		}
	}
	if splits != "" {
		ps, err := parseInts(splits)
		if err != nil {
			return fmt.Errorf("-pd-splits: %w", err)
		}
		for _, p := range ps {
			if p >= c.PDEngines {
				return fmt.Errorf("-pd-splits: %d prefill engines of %d leave none to decode", p, c.PDEngines)
			}
		}
		c.PDSplits = ps
	}
	if protocols != "" {
		ps, err := chooseFrom("-pd-protocols", protocols, tlbench.PDProtocols)
		if err != nil {
			return err
		}
		c.PDProtocols = ps
	}
	return runShape("-pd", repeats, duration, c.PDWarmup, &c.PDRepeats, &c.PDDuration)
}

// parseOpenLoop applies the openloop experiment's flags to c.
func parseOpenLoop(c *tlbench.Config, rates, goodputRates, replicas, sync, workloads, policies string, repeats int, duration time.Duration) error {
	if rates != "" {
		ps, err := parseInts(rates)
		if err != nil {
			return fmt.Errorf("-open-rates: %w", err)
		}
		c.OpenFractions = nil
		for _, p := range ps {
			c.OpenFractions = append(c.OpenFractions, float64(p)/100)
		}
	}
	switch goodputRates {
	case "":
	case "none":
		c.OpenGoodputFractions = nil
	default:
		ps, err := parseInts(goodputRates)
		if err != nil {
			return fmt.Errorf("-open-goodput-rates: %w", err)
		}
		c.OpenGoodputFractions = nil
		for _, p := range ps {
			c.OpenGoodputFractions = append(c.OpenGoodputFractions, float64(p)/100)
		}
	}
	if replicas != "" {
		rs, err := parseInts(replicas)
		if err != nil {
			return fmt.Errorf("-open-replicas: %w", err)
		}
		c.OpenReplicas = rs
	}
	if sync != "" {
		c.OpenSync = nil
		for _, s := range strings.Split(sync, ",") {
			switch strings.TrimSpace(s) {
			case "off":
				c.OpenSync = append(c.OpenSync, false)
			case "on":
				c.OpenSync = append(c.OpenSync, true)
			default:
				return fmt.Errorf("-open-sync: %q is not off or on", s)
			}
		}
	}
	if workloads != "" {
		c.OpenWorkloads = nil
		for _, w := range strings.Split(workloads, ",") {
			k := loadgen.Kind(strings.TrimSpace(w))
			if k != loadgen.MultiTurn && k != loadgen.RAG {
				return fmt.Errorf("-open-workloads: %q is not multi-turn or rag", w)
			}
			c.OpenWorkloads = append(c.OpenWorkloads, k)
		}
	}
	if policies != "" {
		// The preset compares every policy the open loop knows.
		ps, err := chooseFrom("-open-policies", policies, c.OpenPolicies)
		if err != nil {
			return err
		}
		c.OpenPolicies = ps
	}
	return runShape("-open", repeats, duration, c.OpenWarmup, &c.OpenRepeats, &c.OpenDuration)
}

// chooseFrom reads flag's comma-separated list of names from known, each
// kept once, in the order given.
func chooseFrom(flag, list string, known []string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(known, p) {
			return nil, fmt.Errorf("%s: %q is not %s", flag, p, orList(known))
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// orList names the choices: "a, b or c".
func orList(choices []string) string {
	if len(choices) < 2 {
		return strings.Join(choices, "")
	}
	return strings.Join(choices[:len(choices)-1], ", ") + " or " + choices[len(choices)-1]
}

// runShape sets an experiment's repeats and run duration from the flags
// prefix-repeats and prefix-duration (zero: the default kept); a run must
// last longer than its warmup.
func runShape(prefix string, repeats int, duration, warmup time.Duration, toRepeats *int, toDuration *time.Duration) error {
	switch {
	case repeats < 0:
		return fmt.Errorf("%s-repeats: must not be negative, got %d", prefix, repeats)
	case repeats > 0:
		*toRepeats = repeats
	}
	switch {
	case duration < 0:
		return fmt.Errorf("%s-duration: must not be negative, got %v", prefix, duration)
	case duration > 0 && duration <= warmup:
		return fmt.Errorf("%s-duration: %v is not longer than the warmup of %v", prefix, duration, warmup)
	case duration > 0:
		*toDuration = duration
	}
	return nil
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
