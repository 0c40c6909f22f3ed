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
// Run only when named: the open loop through replicas and fleet sync, its
// sync cost, exact routing on KV events, priorities (two tenants at 120%
// of capacity, with and without priority bands and TTFT objectives) and
// fleet-wide key limits (three synced replicas granting one key's limit)
// and disaggregated prefill and decode (unified engines against prefill
// and decode ones paired over vLLM's and SGLang's protocols, on the
// engines' step model).
//
// With Config.Out set it also writes the tables (results.md) and SVG plots
// (and PNGs when rsvg-convert is installed) into that directory. Every run
// is bounded in requests and time. cmd/tlbench fills a Config from its
// flags and calls Run.
package tlbench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
	"github.com/tlgate/tlgate/internal/tool/bench/procs"
)

// The experiments, as Config.Only names them.
const (
	ExpRouting  = "routing"
	ExpOverhead = "overhead"
	ExpScale    = "scale"
	ExpMemory   = "memory"
	ExpOverload = "overload"
	ExpOpenLoop = "openloop"
	ExpSyncCost = "synccost"
	// ExpKVEvents is exact routing on the engines' KV cache events (an
	// open-loop sweep under eviction pressure, a drill, the costs).
	ExpKVEvents = "kvevents"
	// ExpPriority is two tenants at more than the fleet's capacity:
	// interactive with a TTFT objective, batch sheddable (priority.go).
	ExpPriority = "priority"
	// ExpKeyLimits is three synced replicas granting one key's limit
	// (keylimits.go).
	ExpKeyLimits = "keylimits"
	// ExpPD is unified engines against prefill and decode engines, on
	// long prompts mixed with chat (pd.go).
	ExpPD = "pd"
)

// Admission control of the routing runs' gateways (Config.Admission).
const (
	// AdmissionDefault: the gateway's default (on, limits per pool).
	AdmissionDefault = "default"
	// AdmissionOff: [gateway.admission] enabled = false.
	AdmissionOff = "off"
	// AdmissionWorker: on, limit_scope = "worker".
	AdmissionWorker = "worker"
)

// Experiments are the experiments a run runs unless told otherwise, in
// order.
var Experiments = []string{ExpRouting, ExpOverhead, ExpScale, ExpMemory, ExpOverload}

// Optional are the experiments run only when named: the open-loop sweep
// takes an hour or more; the sync cost measurement, which ends it, can
// also run alone.
var Optional = []string{ExpOpenLoop, ExpSyncCost, ExpKVEvents, ExpPriority, ExpKeyLimits, ExpPD}

// Config is everything a run needs; Preset gives the full and quick ones
// and cmd/tlbench's flags override parts.
type Config struct {
	Only  []string // experiments to run, in order
	Out   string   // directory for results.md and plots; "" writes none
	Nginx string   // nginx binary; "" looks it up on PATH
	// BuildFlags go to go build for the binaries the experiments start
	// (the tests give -race when they run with it, to reuse their build).
	BuildFlags []string
	// Timeout bounds the run's experiments; building the binaries they
	// start as processes comes before it and is not counted.
	Timeout time.Duration
	Seed    uint64
	Model   string

	// EnginePreset, when set, runs the engines of the routing runs and of
	// the runs built on them (open loop and its sync drill, KV events) on the
	// step scheduler of the enginesim preset of that name, each with its
	// run's own KV blocks and running sequences (they size the eviction
	// pressure); "" runs them on the flat timing model (Prefill, and
	// Decode or OpenDecode, per token).
	EnginePreset string

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
	Admission                                     string   // the routing runs' admission control: AdmissionDefault, AdmissionOff or AdmissionWorker
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

	// Priorities (priority.go): PriorityEngines engines of MaxRunning
	// slots and PriorityKVBlocks blocks (prefill Prefill, decode
	// OpenDecode per token); the interactive tenant's conversations are
	// the open loop's multi-turn ones (OpenTurns turns, answers of
	// PriorityChatTokens tokens); the batch tenant's prompts PriorityBatchBytes long with
	// PriorityBatchTokens-token answers. The tenants offer
	// PriorityInteractive and PriorityBatch of their capacity alone, for
	// PriorityDuration (PriorityWarmup not recorded), in each of
	// PriorityModes, PriorityRepeats times; PriorityObjective is the
	// interactive tenant's TTFT objective.
	PriorityEngines, PriorityKVBlocks       int
	PriorityChatTokens                      int
	PriorityBatchBytes, PriorityBatchTokens int
	PriorityInteractive, PriorityBatch      float64
	PriorityDuration, PriorityWarmup        time.Duration
	PriorityObjective                       time.Duration
	PriorityModes                           []string
	PriorityRepeats                         int

	// Key limits (keylimits.go): the key's requests per minute and how
	// long its clients send.
	KeyLimitRPM      int
	KeyLimitDuration time.Duration

	// Disaggregated prefill and decode (pd.go): PDEngines engines of the
	// step model's preset PDPreset, all unified or, for each of PDSplits,
	// that many prefill engines and the rest decode ones, paired over
	// each of PDProtocols; Poisson arrivals at each of PDRates requests
	// per second for PDDuration (PDWarmup not recorded), PDRepeats times.
	// PDLongShare of the prompts are of PDLongTokens tokens answered with
	// PDLongOutput tokens, the rest of PDChatTokens answered with
	// PDChatOutput; the joint SLO is PDTTFTSLO and PDTPOTSLO.
	PDEngines                  int
	PDPreset                   string
	PDSplits                   []int
	PDProtocols                []string
	PDRates                    []float64
	PDDuration, PDWarmup       time.Duration
	PDRepeats                  int
	PDLongShare                float64
	PDLongTokens, PDChatTokens [2]int
	PDLongOutput, PDChatOutput int
	PDTTFTSLO, PDTPOTSLO       time.Duration

	// Overload (overload.go).
	OverloadEngines, OverloadRunning, OverloadTokens, OverloadQueue int
	OverloadDecode, OverloadQueueTimeout, OverloadSLO               time.Duration
	OverloadDuration, OverloadClientTimeout                         time.Duration
	OverloadMultiples                                               []float64

	// Open loop (openloop.go): Poisson arrivals through 1 to 3 replicas.
	OpenWorkloads []loadgen.Kind
	OpenPolicies  []string
	OpenReplicas  []int
	OpenSync      []bool // sync off (false) and on (true)
	// OpenSyncBatch is the replicas' [gateway.sync] batch_interval (0:
	// the gateway's default).
	OpenSyncBatch time.Duration
	// OpenReleaseHold is the replicas' [gateway.sync] release_hold (nil:
	// the gateway's default).
	OpenReleaseHold *time.Duration
	// OpenOneEntry sends every request to the first replica, the others
	// only heartbeating and syncing: a control that shows what running N
	// gateway processes costs apart from routing on partial views.
	OpenOneEntry bool
	// SharePeersSilent has the sync cost's mirror peers answer without
	// publishing: the share measurement then prices what a replica's own
	// publishing costs it, without its peers' batches.
	SharePeersSilent bool
	// ShareProfile takes a CPU profile of the share measurement's gateway
	// over each run's recorded window (its /debug/pprof/), reports where
	// its CPU goes with sync off and on, and keeps the profiles in Out.
	ShareProfile bool
	// OverheadProfile serves the overhead experiment's gateway's
	// /debug/pprof/ and, after each mode's measured runs, takes a CPU
	// profile of it over one more fixed-rate run (not counted in the
	// table), kept in Out as overhead-<mode>.pprof, with the heap's
	// allocation profiles from before and after that run
	// (overhead-<mode>-allocs-before.pprof and -after.pprof: what the run
	// allocated is their difference, go tool pprof -diff_base).
	OverheadProfile bool
	OpenFractions   []float64 // rates, as shares of least_outstanding's single-replica capacity
	// KVPressure is the share of a workload's working set the fleet's KV
	// holds in the kvevents sweep: below 1 the engines evict, above it
	// their caches hold everything and the prefix index guesses right.
	KVPressure float64
	// KVIndexAgreement, when set, is the events arm's [gateway.kv_events]
	// index_agreement (0: every pick is tokenized and made on the events).
	KVIndexAgreement *float64
	// NumberShare is the share of the workloads' words drawn as numbers
	// (loadgen.WorkloadConfig.NumberShare): text denser in tokens per
	// byte than the 4 bytes per token the prefix index assumes. 0: words
	// alone, about 5.9 bytes per token of the reference tokenizer.
	NumberShare float64
	// KVAgreementSample, when above 0, is the events arm's
	// [gateway.kv_events] agreement_sample (0: the gateway's default).
	KVAgreementSample int
	// OpenGoodputFractions are the rates beyond OpenFractions run only
	// through the most replicas, with each sync setting: where each
	// policy's goodput ends (OpenAttainment).
	OpenGoodputFractions []float64
	// OpenAttainment is the share of requests within OpenSLO a rate must
	// keep to count as held (DistServe's SLO attainment goal).
	OpenAttainment float64
	OpenRepeats    int // runs of every configuration
	OpenTurns      int // turns of a multi-turn conversation
	// OpenMaxTokens and OpenDecode are every request's max_tokens and the
	// engines' decode time per token: fewer, longer steps than the routing
	// runs', so that timer delays on a busy machine and the gateway's
	// per-chunk work weigh less.
	OpenMaxTokens int
	OpenDecode    time.Duration
	// OpenCapacityUsers are the closed-loop users of the capacity
	// measurement (0: four per engine slot).
	OpenCapacityUsers                 int
	OpenDuration, OpenWarmup, OpenSLO time.Duration
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
		Documents: 40, DocumentBytes: 3072, RAGSystemBytes: 256, RoutePolicies: slices.Clone(Policies), Admission: AdmissionDefault,

		Rate: 1000, RateDuration: 3 * time.Second, Rounds: 3,
		TputConcurrency: 32, TputDuration: 3 * time.Second, OverheadTokens: 4,

		Workers: []int{4, 64, 1024}, PickBudget: time.Second, PickMinOps: 2000,
		Streams: []int{1000, 10000},

		OverloadEngines: 2, OverloadRunning: 4, OverloadTokens: 16, OverloadQueue: 16,
		OverloadDecode: 8 * time.Millisecond, OverloadQueueTimeout: 2 * time.Second, OverloadSLO: time.Second,
		OverloadDuration: 5 * time.Second, OverloadClientTimeout: 10 * time.Second,
		OverloadMultiples: []float64{2, 5},

		OpenWorkloads: []loadgen.Kind{loadgen.MultiTurn, loadgen.RAG},
		OpenPolicies:  []string{config.PolicyLeastOutstanding, config.PolicyCacheAware},
		OpenReplicas:  []int{1, 2, 3}, OpenSync: []bool{false, true},
		OpenFractions: []float64{0.5, 0.7, 0.9, 1.1}, OpenGoodputFractions: []float64{1.3, 1.6, 2.0}, OpenAttainment: 0.9,
		OpenRepeats: 3, OpenTurns: 6, KVPressure: 1.0 / 3,
		OpenMaxTokens: 8, OpenDecode: 9 * time.Millisecond,
		OpenDuration: 8 * time.Second, OpenWarmup: 2 * time.Second, OpenSLO: 250 * time.Millisecond,

		PriorityEngines: 2, PriorityKVBlocks: 1024, PriorityChatTokens: 32, PriorityBatchBytes: 6144, PriorityBatchTokens: 32,
		PriorityInteractive: 0.5, PriorityBatch: 0.7, PriorityObjective: 500 * time.Millisecond,
		PriorityDuration: 30 * time.Second, PriorityWarmup: 5 * time.Second,
		PriorityModes: slices.Clone(PriorityModes), PriorityRepeats: 3,
		KeyLimitRPM: 600, KeyLimitDuration: 20 * time.Second,

		PDEngines: 4, PDPreset: enginesim.PresetLlama8BH100.Name, PDSplits: []int{2, 1}, PDProtocols: slices.Clone(PDProtocols),
		PDRates: []float64{12, 18, 24}, PDDuration: 15 * time.Second, PDWarmup: 3 * time.Second, PDRepeats: 3,
		PDLongShare: 0.5, PDLongTokens: [2]int{2048, 8192}, PDChatTokens: [2]int{128, 512}, PDLongOutput: 64, PDChatOutput: 128,
		PDTTFTSLO: time.Second, PDTPOTSLO: 15 * time.Millisecond,
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
		c.OpenReplicas, c.OpenFractions, c.OpenGoodputFractions, c.OpenRepeats = []int{1, 3}, []float64{0.7}, nil, 1
		c.OpenDuration, c.OpenWarmup = 4*time.Second, time.Second
		c.PriorityDuration, c.PriorityWarmup, c.PriorityRepeats = 6*time.Second, 2*time.Second, 1
		c.KeyLimitDuration = 5 * time.Second
		c.PDSplits, c.PDRates, c.PDRepeats = []int{2}, []float64{24}, 1
		c.PDDuration, c.PDWarmup = 8*time.Second, 2*time.Second
	}
	return c
}

// binaries are the programs the experiments start as processes of their
// own, built once before the run's timeout starts: a cold build cache can
// take minutes, which no experiment should count.
type binaries struct {
	dir                   string
	gateway, engine, nats string // empty when no experiment of the run needs it
}

// buildBinaries builds the gateway for the overhead, open-loop and sync
// cost experiments, the reference engine for the overhead one and the
// NATS server for an open loop with sync on and the sync cost, when c runs
// them.
func buildBinaries(ctx context.Context, c Config, logOut io.Writer) (_ binaries, err error) {
	syncCost := slices.Contains(c.Only, ExpSyncCost)
	kvEvents := slices.Contains(c.Only, ExpKVEvents)
	keyLimits := slices.Contains(c.Only, ExpKeyLimits)
	gateway := slices.Contains(c.Only, ExpOverhead) || slices.Contains(c.Only, ExpOpenLoop) || syncCost || kvEvents || slices.Contains(c.Only, ExpPriority) || keyLimits ||
		slices.Contains(c.Only, ExpPD)
	engine := slices.Contains(c.Only, ExpOverhead)
	nats := slices.Contains(c.Only, ExpOpenLoop) && slices.Contains(c.OpenSync, true) || syncCost || kvEvents || keyLimits
	if !gateway && !engine {
		return binaries{}, nil
	}
	b := binaries{}
	if b.dir, err = os.MkdirTemp("", "tlbench-bin-"); err != nil {
		return binaries{}, err
	}
	defer func() {
		if err != nil {
			b.remove()
		}
	}()
	fmt.Fprintln(logOut, "tlbench: building the binaries")
	if gateway {
		if b.gateway, err = procs.Build(ctx, b.dir, "./cmd/gateway", c.BuildFlags...); err != nil {
			return binaries{}, err
		}
	}
	if engine {
		if b.engine, err = procs.Build(ctx, b.dir, "./cmd/enginesim", c.BuildFlags...); err != nil {
			return binaries{}, err
		}
	}
	if nats {
		out, err := procs.Build(ctx, b.dir, natsServerPkg, c.BuildFlags...)
		if err != nil {
			return binaries{}, err
		}
		b.nats = filepath.Join(b.dir, "nats-server")
		if err := os.Rename(out, b.nats); err != nil {
			return binaries{}, err
		}
	}
	return b, nil
}

func (b binaries) remove() {
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

// Run runs the configured experiments in order, printing each section to
// out as it completes; progress goes to logOut.
func Run(ctx context.Context, c Config, out, logOut io.Writer) error {
	if err := CheckEnginePreset(c.EnginePreset); err != nil {
		return err
	}
	bins, err := buildBinaries(ctx, c, logOut)
	if err != nil {
		return err
	}
	defer bins.remove()
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
			sec, ps, err = overheadExperiment(ctx, c, bins, logOut)
		case ExpScale:
			sec, ps, err = scaleExperiment(ctx, c)
		case ExpMemory:
			sec, ps, err = memoryExperiment(ctx, c, logOut)
		case ExpOverload:
			sec, ps, err = overloadExperiment(ctx, c, logOut)
		case ExpOpenLoop:
			sec, ps, err = openLoopExperiment(ctx, c, bins, logOut)
		case ExpSyncCost:
			sec, err = syncCostExperiment(ctx, c, bins, logOut)
		case ExpKVEvents:
			sec, err = kvEventsExperiment(ctx, c, bins, logOut)
		case ExpPriority:
			sec, ps, err = priorityExperiment(ctx, c, bins, logOut)
		case ExpKeyLimits:
			sec, ps, err = keyLimitsExperiment(ctx, c, bins, logOut)
		case ExpPD:
			sec, err = pdExperiment(ctx, c, bins, logOut)
		default:
			err = fmt.Errorf("unknown experiment %q", e)
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
