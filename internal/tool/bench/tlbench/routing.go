package tlbench

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
	"github.com/tlgate/tlgate/internal/tool/svgplot"
)

// Routing policies compared: the gateway's three, and two baselines that
// bypass the gateway and pick an engine in the client.
const (
	baseRandom     = "random"
	baseRoundRobin = "round_robin"
)

var Policies = []string{config.PolicyLeastOutstanding, config.PolicyWeighted, config.PolicyAffinity, config.PolicyCacheAware, baseRandom, baseRoundRobin}

// viaGateway reports whether a policy is the gateway's.
func viaGateway(p string) bool { return p != baseRandom && p != baseRoundRobin }

// routingRow is one (workload, policy) run.
type routingRow struct {
	workload  loadgen.Kind
	prompts   int // shared system prompts of the workload
	policy    string
	hitRate   float64 // prefix cache hits / queries, in tokens
	ttft, e2e loadgen.Summary
	rps       float64
	perEngine []uint64 // requests each engine received
	maxMean   float64
	// busy and stalled are the engines' running slots over the run and
	// their free slots while sequences waited (KV short), as shares of
	// all their slots.
	busy, stalled float64
	// preempted counts the sequences the engines' step schedulers
	// preempted (to recompute) when KV blocks ran out; always 0 on the
	// flat model, which admits a sequence only when all its blocks fit.
	preempted uint64
	res       *loadgen.Result
}

// workloadConfig is the workload of kind with n shared system prompts.
func workloadConfig(c Config, kind loadgen.Kind, n int, seed uint64) loadgen.WorkloadConfig {
	w := loadgen.WorkloadConfig{
		Kind: kind, Requests: c.Requests, Model: c.Model,
		SystemPrompts: n, SystemBytes: c.SystemBytes, UserBytes: c.UserBytes,
		MaxTokens: c.MaxTokens, StreamFraction: c.StreamFraction, Seed: seed,
		NumberShare: c.NumberShare,
	}
	switch kind {
	case loadgen.MultiTurn:
		w.Requests = c.TurnRequests
		w.SystemBytes, w.UserBytes, w.Conversations, w.AnswerBytes = c.TurnSystemBytes, c.TurnUserBytes, c.Conversations, c.AnswerBytes
	case loadgen.RAG:
		w.SystemBytes, w.Documents, w.DocumentBytes = c.RAGSystemBytes, c.Documents, c.DocumentBytes
	}
	return w
}

// CheckEnginePreset reports an error unless name is "" (the flat timing
// model) or an enginesim preset's (Config.EnginePreset).
func CheckEnginePreset(name string) error {
	if name == "" {
		return nil
	}
	if _, err := enginesim.LookupPreset(name); err != nil {
		return fmt.Errorf("unknown engine preset %q (want %s, or none for the flat timing model)", name, strings.Join(enginesim.PresetNames(), ", "))
	}
	return nil
}

// timeEngine sets e's timing as c says: the step scheduler of
// c.EnginePreset, keeping e's KV blocks and running sequences, or the
// flat model's prefill (c.Prefill) and decode time per token.
func timeEngine(c Config, e *enginesim.Config, decode time.Duration) {
	if p, ok := enginesim.Presets[c.EnginePreset]; ok {
		p.Apply(e)
		e.PrefillPerToken, e.DecodePerToken = 0, 0
		return
	}
	e.Step = nil
	e.PrefillPerToken, e.DecodePerToken = c.Prefill, decode
}

// engineModel says which engine model timeEngine gives the engines, with
// the flat model's decode time per token.
func engineModel(c Config, decode time.Duration) string {
	p, ok := enginesim.Presets[c.EnginePreset]
	if !ok {
		return flatModel(c.Prefill, decode)
	}
	k := p.Step.Cost
	budget := p.Step.MaxNumBatchedTokens
	if budget == 0 {
		budget = enginesim.DefaultMaxNumBatchedTokens
	}
	d := fmt.Sprintf("step model, preset %s: %s on %s, each step %v + %v per prefill token + %v per decode sequence + %v per context token, %d tokens per step at most",
		p.Name, p.Model, p.GPU, k.Fixed, k.PerPrefillToken, k.PerDecodeSeq, k.PerContextToken, budget)
	return d + apiServerSaid(p)
}

// apiServerSaid describes a preset's API server stage, if it has one.
func apiServerSaid(p enginesim.Preset) string {
	a := p.Step.APIServer
	if a == (enginesim.APIServerCost{}) {
		return ""
	}
	return fmt.Sprintf("; API server %v per request and %v per output token, serially", a.PerRequest, a.PerOutputToken)
}

// flatModel describes the flat timing model with its per-token times.
func flatModel(prefill, decode time.Duration) string {
	return fmt.Sprintf("flat timing: prefill %v per uncached prompt token, decode %v per token", prefill, decode)
}

// routingEngines returns the engine configurations of a routing run of
// workload kind, timed as c.EnginePreset says.
func routingEngines(c Config, kind loadgen.Kind) []enginesim.Config {
	out := make([]enginesim.Config, c.Engines)
	blocks := c.KVBlocks
	switch kind {
	case loadgen.MultiTurn:
		blocks = c.KVBlocksTurns
	case loadgen.RAG:
		blocks = c.KVBlocksLong
	}
	for i := range out {
		out[i] = enginesim.Config{
			ID: fmt.Sprintf("engine-%d", i), Model: c.Model,
			KVBlocks: blocks, MaxRunning: c.MaxRunning,
			HeartbeatInterval: c.Heartbeat,
		}
		timeEngine(c, &out[i], c.Decode)
	}
	return out
}

// routingExperiment runs every workload under every policy, each run on
// fresh engines (cold caches).
func routingExperiment(ctx context.Context, c Config, logOut io.Writer) (section, []plotFile, error) {
	var rows []routingRow
	var meanTokens = map[loadgen.Kind]float64{}
	for wi, kind := range c.Workloads {
		w, err := loadgen.Build(workloadConfig(c, kind, c.SystemPrompts, c.Seed+uint64(wi)))
		if err != nil {
			return section{}, nil, err
		}
		meanTokens[kind] = w.MeanPromptTokens
		for _, p := range c.RoutePolicies {
			row, err := routingRun(ctx, c, kind, p, w)
			if err != nil {
				return section{}, nil, fmt.Errorf("%s/%s: %w", kind, p, err)
			}
			row.prompts = c.SystemPrompts
			logRouting(logOut, row)
			rows = append(rows, row)
		}
	}
	sec := routingSection(c, rows, meanTokens)
	plots := routingPlots(rows)
	if len(c.SweepPrompts) == 0 {
		return sec, plots, nil
	}
	// How the hit rate depends on the prefix working set: more shared
	// system prompts than one engine's cache holds.
	var sweep []routingRow
	for _, n := range c.SweepPrompts {
		w, err := loadgen.Build(workloadConfig(c, loadgen.Shared, n, c.Seed))
		if err != nil {
			return section{}, nil, err
		}
		for _, p := range c.RoutePolicies {
			row, err := routingRun(ctx, c, loadgen.Shared, p, w)
			if err != nil {
				return section{}, nil, fmt.Errorf("shared with %d prompts/%s: %w", n, p, err)
			}
			row.prompts = n
			logRouting(logOut, row)
			sweep = append(sweep, row)
		}
	}
	sec.tables = append(sec.tables, sweepTable(sweep))
	sec.notes = append(sec.notes, sweepNotes(c, sweep)...)
	t, notes := cacheAwareTargets(rows, sweep)
	sec.tables = append(sec.tables, t)
	sec.notes = append(sec.notes, notes...)
	return sec, append(plots, sweepPlots(sweep)...), nil
}

// sweepPolicies are compared over the prompt-count sweep: all of them, so
// that cache_aware is held to the best of the others at every count.
var sweepPolicies = Policies

func logRouting(w io.Writer, r routingRow) {
	fmt.Fprintf(w, "tlbench:   %-10s %3d prompts %-17s hit %5.1f%%  ttft p50 %6s p99 %6s ms  %6.1f req/s  max/mean %.2f  preempted %d\n",
		r.workload, r.prompts, r.policy, 100*r.hitRate, ms(r.ttft.P50), ms(r.ttft.P99), r.rps, r.maxMean, r.preempted)
}

// routingRun starts a fresh cluster for one policy and drives the workload.
func routingRun(ctx context.Context, c Config, kind loadgen.Kind, p string, w *loadgen.Workload) (routingRow, error) {
	var gc *gatewayConfig
	if viaGateway(p) {
		gc = &gatewayConfig{policy: p, loadFactor: c.LoadFactor, heartbeat: c.Heartbeat, cacheLoadWeight: c.CacheLoadWeight}
		switch c.Admission {
		case AdmissionOff:
			gc.tune = func(g *config.Gateway) { g.Admission.Enabled = false }
		case AdmissionWorker:
			gc.tune = func(g *config.Gateway) { g.Admission.Enabled, g.Admission.LimitScope = true, config.LimitScopeWorker }
		}
	}
	cl, err := startCluster(ctx, gc, routingEngines(c, kind))
	if err != nil {
		return routingRow{}, err
	}
	defer cl.close()
	var picker loadgen.Picker
	switch p {
	case baseRandom:
		picker = loadgen.Random(cl.engineURLs(), c.Seed)
	case baseRoundRobin:
		picker = loadgen.RoundRobin(cl.engineURLs())
	default:
		picker = loadgen.Fixed(cl.url())
	}
	run := loadgen.Closed{Concurrency: c.Concurrency, Requests: w.Requests}
	if kind == loadgen.MultiTurn {
		// Every conversation is a user of its own: it sends a turn, waits
		// for the answer, thinks and sends the next; the users start
		// spread over one think time.
		run.Concurrency, run.Think, run.Ramp = c.Conversations, c.Think, c.Think
	}
	client := loadgen.NewClient(run.Concurrency)
	defer client.CloseIdleConnections()
	before, start := cl.stats(), time.Now()
	res := loadgen.RunClosed(ctx, client, picker, run)
	if err := ctx.Err(); err != nil {
		return routingRow{}, err
	}
	if res.OK == 0 {
		return routingRow{}, fmt.Errorf("no request succeeded (%d failed: %s)", res.Failed, res.FirstError())
	}
	after, span := cl.stats(), time.Since(start)
	row := routingRow{workload: kind, policy: p, ttft: loadgen.Summarize(res.TTFT), e2e: loadgen.Summarize(res.Latency),
		rps: res.Throughput(), res: res}
	var hits, queries uint64
	var busy, stalled time.Duration
	for i := range after {
		busy += after[i].BusySlotTime - before[i].BusySlotTime
		stalled += after[i].StalledSlotTime - before[i].StalledSlotTime
		hits += after[i].PrefixHits - before[i].PrefixHits
		queries += after[i].PrefixQueries - before[i].PrefixQueries
		row.preempted += after[i].Preemptions - before[i].Preemptions
		row.perEngine = append(row.perEngine, after[i].Requests-before[i].Requests)
	}
	if queries > 0 {
		row.hitRate = float64(hits) / float64(queries)
	}
	row.maxMean = maxOverMean(row.perEngine)
	if slots := span * time.Duration(len(after)*c.MaxRunning); slots > 0 {
		row.busy, row.stalled = float64(busy)/float64(slots), float64(stalled)/float64(slots)
	}
	return row, nil
}

// maxOverMean is the largest count over the mean count (1 is perfectly
// even); 0 when nothing was counted.
func maxOverMean(counts []uint64) float64 {
	var sum, top uint64
	for _, n := range counts {
		sum += n
		top = max(top, n)
	}
	if sum == 0 {
		return 0
	}
	return float64(top) * float64(len(counts)) / float64(sum)
}

// perEngine formats the per-engine request counts.
func (r routingRow) perEngineString() string {
	s := ""
	for i, n := range r.perEngine {
		if i > 0 {
			s += " "
		}
		s += strconv.FormatUint(n, 10)
	}
	return s
}

func routingSection(c Config, rows []routingRow, meanTokens map[loadgen.Kind]float64) section {
	t := &table{header: []string{"workload", "policy", "prefix-cache hit rate", "TTFT p50 ms", "TTFT p99 ms",
		"latency p50 ms", "latency p99 ms", "req/s", "slots busy", "slots stalled on KV", "max/mean load", "requests per engine", "failed", "preempted"}}
	for _, r := range rows {
		t.add(string(r.workload), r.policy, pct(r.hitRate), ms(r.ttft.P50), ms(r.ttft.P99), ms(r.e2e.P50), ms(r.e2e.P99),
			f1(r.rps), pct(r.busy), pct(r.stalled), f2(r.maxMean), r.perEngineString(), strconv.Itoa(r.res.Failed), strconv.FormatUint(r.preempted, 10))
	}
	lead := fmt.Sprintf("%d engines (%s; prefix cache in %d-token blocks, "+
		"%d KV blocks and %d running sequences each), %d concurrent keep-alive clients, %d chat requests per run "+
		"(max_tokens %d, %.0f%% streamed), fresh engines for every run. "+
		"shared: %d system prompts of about %d bytes with random user messages of about %d bytes; distinct: a system prompt of its own per request; mixed: half and half. "+
		"multi-turn: %d conversations interleaved, %d turns in all (each round of turns in a new random order), all opening with the same system prompt of about %d bytes; "+
		"every turn's prompt is the previous prompt, an answer of about %d bytes and a new user message of about %d bytes, sent a think time (%v on average, evenly from half to one and a half times) after the previous turn was answered; "+
		"each conversation is a user of its own, not one of the concurrent clients: it sends a turn, waits for the answer and thinks; the users start spread over one think time. "+
		"rag: one system prompt of about %d bytes, one of %d documents of about %d bytes drawn at random, and a question of about %d bytes. "+
		"multi-turn runs on engines with %d KV blocks each, rag on engines with %d (the working set of each is larger than one engine's cache, smaller than the fleet's). "+
		"Mean prompt: %s tokens (shared), %s (distinct), %s (mixed), %s (multi-turn), %s (rag). "+
		"least_outstanding, weighted, affinity and cache_aware go through the gateway (route_policy, affinity_load_factor %v, cache_aware with %s); random and round_robin are clients that send straight to the engines. "+
		"Hit rate = the engines' prefix-cache hits / queries (tokens); TTFT from the streamed requests, latency (to the last byte) from all; "+
		"slots busy = the engines' running sequences over the run, a share of all their running slots; slots stalled on KV = their free slots while requests waited anyway, "+
		"the head of the queue not fitting the free KV blocks (the rest of the idle share is slots free with nothing waiting); "+
		"max/mean load = the busiest engine's request count over the mean; preempted = the sequences the engines preempted to recompute later when KV blocks ran out "+
		"(the step model admits a sequence when its first chunk fits and allocates blocks as it grows, as vLLM does; the flat model admits one only when all its blocks fit and never preempts). "+
		"The hit rate counts every admission's lookup, a preempted sequence's readmission included.",
		c.Engines, engineModel(c, c.Decode), enginesim.BlockTokens, c.KVBlocks, c.MaxRunning, c.Concurrency, c.Requests,
		c.MaxTokens, 100*c.StreamFraction, c.SystemPrompts, c.SystemBytes, c.UserBytes,
		c.Conversations, c.TurnRequests, c.TurnSystemBytes, c.AnswerBytes, c.TurnUserBytes, c.Think,
		c.RAGSystemBytes, c.Documents, c.DocumentBytes, c.UserBytes, c.KVBlocksTurns, c.KVBlocksLong,
		tokensOf(meanTokens, loadgen.Shared), tokensOf(meanTokens, loadgen.Distinct), tokensOf(meanTokens, loadgen.Mixed),
		tokensOf(meanTokens, loadgen.MultiTurn), tokensOf(meanTokens, loadgen.RAG), c.LoadFactor, cacheWeights(c))
	switch c.Admission {
	case AdmissionOff:
		lead += " Admission control is off (`[gateway.admission] enabled = false`)."
	case AdmissionWorker:
		lead += " Admission control is on with limits per worker (`limit_scope = \"worker\"`, each worker's limit derived from its reports)."
	default:
		lead += " Admission control is on as by default (limits per pool, each worker's limit derived from its reports)."
	}
	return section{title: "Routing quality", lead: lead, tables: []*table{t}, notes: routingNotes(c, rows)}
}

func tokensOf(m map[loadgen.Kind]float64, k loadgen.Kind) string {
	v, ok := m[k]
	if !ok {
		return "-"
	}
	return strconv.Itoa(int(math.Round(v)))
}

// routingNotes checks the targets: affinity at least twice the hit rate of
// least_outstanding on the shared workload, with max/mean load within the
// load factor.
func routingNotes(c Config, rows []routingRow) []string {
	find := func(k loadgen.Kind, p string) (routingRow, bool) {
		for _, r := range rows {
			if r.workload == k && r.policy == p {
				return r, true
			}
		}
		return routingRow{}, false
	}
	aff, ok1 := find(loadgen.Shared, config.PolicyAffinity)
	lo, ok2 := find(loadgen.Shared, config.PolicyLeastOutstanding)
	if !ok1 || !ok2 {
		return nil
	}
	ratio := math.Inf(1)
	if lo.hitRate > 0 {
		ratio = aff.hitRate / lo.hitRate
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	return []string{
		fmt.Sprintf("Target: affinity ≥ 2× the hit rate of least_outstanding on shared prompts: %s vs %s = %.3f× — %s.",
			pct(aff.hitRate), pct(lo.hitRate), ratio, verdict(ratio >= 2)),
		fmt.Sprintf("Target: affinity's max/mean load within the load factor %v: %.2f — %s.",
			c.LoadFactor, aff.maxMean, verdict(aff.maxMean <= c.LoadFactor)),
	}
}

// routingPlots draws the hit rate against TTFT p50, one series per policy,
// each point labelled with its workload.
func routingPlots(rows []routingRow) []plotFile {
	var series []svgplot.Series
	for _, p := range Policies {
		s := svgplot.Series{Name: p}
		for _, r := range rows {
			if r.policy == p && r.ttft.Count > 0 {
				s.Points = append(s.Points, svgplot.Point{X: 100 * r.hitRate, Y: float64(r.ttft.P50) / 1e6, Label: string(r.workload)})
			}
		}
		if len(s.Points) > 0 {
			series = append(series, s)
		}
	}
	if len(series) == 0 {
		return nil
	}
	return []plotFile{{name: "routing", plot: svgplot.Plot{
		Title: "Routing: prefix-cache hit rate and TTFT p50 per policy", XLabel: "prefix-cache hit rate (%)", YLabel: "TTFT p50 (ms)",
		Width: 960, Height: 600, Series: series,
	}}}
}

// sweepTable lists the shared workload's runs by number of system prompts.
func sweepTable(rows []routingRow) *table {
	t := &table{header: []string{"shared system prompts", "policy", "prefix-cache hit rate", "TTFT p50 ms", "TTFT p99 ms",
		"req/s", "slots busy", "slots stalled on KV", "max/mean load", "requests per engine", "failed", "preempted"}}
	for _, r := range rows {
		t.add(strconv.Itoa(r.prompts), r.policy, pct(r.hitRate), ms(r.ttft.P50), ms(r.ttft.P99), f1(r.rps), pct(r.busy), pct(r.stalled), f2(r.maxMean),
			r.perEngineString(), strconv.Itoa(r.res.Failed), strconv.FormatUint(r.preempted, 10))
	}
	return t
}

// sweepNotes states the hit-rate ratio of affinity over least_outstanding
// at every prompt count.
func sweepNotes(c Config, rows []routingRow) []string {
	var notes []string
	for _, n := range c.SweepPrompts {
		var aff, lo *routingRow
		for i := range rows {
			switch {
			case rows[i].prompts != n:
			case rows[i].policy == config.PolicyAffinity:
				aff = &rows[i]
			case rows[i].policy == config.PolicyLeastOutstanding:
				lo = &rows[i]
			}
		}
		if aff == nil || lo == nil || lo.hitRate == 0 {
			continue
		}
		r := aff.hitRate / lo.hitRate
		notes = append(notes, fmt.Sprintf("Sweep, %d shared system prompts: affinity %s vs least_outstanding %s = %.3f× (≥ 2×: %s), affinity max/mean load %.2f (≤ %v: %s).",
			n, pct(aff.hitRate), pct(lo.hitRate), r, metOrMissed(r >= 2), aff.maxMean, c.LoadFactor, metOrMissed(aff.maxMean <= c.LoadFactor)))
	}
	return notes
}

// sweepPlots draws the hit rate against the number of shared prompts.
func sweepPlots(rows []routingRow) []plotFile {
	var series []svgplot.Series
	for _, p := range sweepPolicies {
		s := svgplot.Series{Name: p, Line: true}
		for _, r := range rows {
			if r.policy == p {
				s.Points = append(s.Points, svgplot.Point{X: float64(r.prompts), Y: 100 * r.hitRate})
			}
		}
		if len(s.Points) > 0 {
			series = append(series, s)
		}
	}
	if len(series) == 0 {
		return nil
	}
	return []plotFile{{name: "routing-sweep", plot: svgplot.Plot{
		Title: "Shared prompts: prefix-cache hit rate by number of system prompts", XLabel: "shared system prompts",
		YLabel: "prefix-cache hit rate (%)", Width: 960, Height: 600, Series: series,
	}}}
}
