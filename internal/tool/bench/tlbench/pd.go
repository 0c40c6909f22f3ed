package tlbench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
	"github.com/tlgate/tlgate/internal/tool/bench/procs"
)

// The disaggregation experiment: one fleet of PDEngines reference engines
// on the step model (a preset calibrated to vLLM), probed by one gateway
// process as the engines operators run (no heartbeats), either all
// unified or split into prefill and decode engines that the gateway pairs
// over vLLM's kv_transfer_params or SGLang's bootstrap rooms. Long prompts
// mixed with chat arrive as a Poisson process; every answer is streamed
// and its token events timed.

// The disaggregation protocols, as the engines' kind names them.
const (
	protocolVLLM   = "vllm"
	protocolSGLang = "sglang"
)

// PDProtocols are the protocols the experiment can drive.
var PDProtocols = []string{protocolVLLM, protocolSGLang}

// pdModel is the route every request of the experiment names: unified or
// disaggregated over the engines' model, so that both fleets are sent the
// same bodies.
const pdModel = "bench-pd"

// pdFleet is one fleet of the experiment: prefill engines (none: every
// engine unified) and decode (or unified) engines, of one kind.
type pdFleet struct {
	prefill, decode int
	protocol        string // the engines' kind
}

func (f pdFleet) unified() bool { return f.prefill == 0 }

// name is the fleet as the tables write it.
func (f pdFleet) name() string {
	if f.unified() {
		return fmt.Sprintf("%d unified", f.decode)
	}
	return fmt.Sprintf("%dP + %dD", f.prefill, f.decode)
}

// protocolName is the fleet's protocol as the tables write it.
func (f pdFleet) protocolName() string {
	switch {
	case f.unified():
		return "–"
	case f.protocol == protocolSGLang:
		return "SGLang bootstrap rooms"
	default:
		return "vLLM kv_transfer_params"
	}
}

// pdFleets are the fleets of a run, in order: the unified one, then each
// split with each protocol.
func pdFleets(c Config) []pdFleet {
	out := []pdFleet{{decode: c.PDEngines, protocol: protocolVLLM}}
	for _, p := range c.PDSplits {
		for _, proto := range c.PDProtocols {
			out = append(out, pdFleet{prefill: p, decode: c.PDEngines - p, protocol: proto})
		}
	}
	return out
}

// pdEngineConfigs are the fleet's engines: the preset's step model, each
// with its role (an SGLang prefill engine with a bootstrap port).
func pdEngineConfigs(c Config, f pdFleet) ([]enginesim.Config, error) {
	p, err := enginesim.LookupPreset(c.PDPreset)
	if err != nil {
		return nil, err
	}
	var out []enginesim.Config
	add := func(role string, n int) {
		for i := range n {
			ec := enginesim.Config{ID: fmt.Sprintf("%s-%d", role, i), Model: c.Model, Role: role}
			p.Apply(&ec)
			if role == enginesim.RolePrefill && f.protocol == protocolSGLang {
				ec.BootstrapAddr = "127.0.0.1:0"
			}
			out = append(out, ec)
		}
	}
	if f.unified() {
		add(enginesim.RoleUnified, f.decode)
	} else {
		add(enginesim.RolePrefill, f.prefill)
		add(enginesim.RoleDecode, f.decode)
	}
	return out, nil
}

// pdProbed is an engine as the gateway's configuration lists it.
type pdProbed struct {
	id, role, addr string
	bootstrapPort  string // an SGLang prefill engine's ("" for the others)
}

// pdTOML is the gateway's configuration beside replicaTOML's: admission
// control off (the engines' own queues are what is measured), the route
// the requests name, and the engines, probed as kind f.protocol.
func pdTOML(c Config, f pdFleet, engines []pdProbed) string {
	var b strings.Builder
	target := "unified"
	if !f.unified() {
		target = "disaggregated"
	}
	fmt.Fprintf(&b, "\n[gateway.admission]\nenabled = false\n\n[[gateway.routes]]\nmodel = %q\nbackends = [{ model = %q, weight = 1 }]\ntargets = [%q]\n",
		pdModel, c.Model, target)
	for _, e := range engines {
		fmt.Fprintf(&b, "\n[[gateway.engines]]\nid = %q\nhttp_address = %q\nkind = %q\nprobe_interval = %q\n", e.id, e.addr, f.protocol, c.Heartbeat.String())
		if e.role != enginesim.RoleUnified {
			fmt.Fprintf(&b, "role = %q\n", e.role)
		}
		if e.bootstrapPort != "" {
			fmt.Fprintf(&b, "bootstrap_port = %s\n", e.bootstrapPort)
		}
	}
	return b.String()
}

// startPDFleet starts the fleet's engines, then a gateway probing them,
// and waits until it routes to every one.
func startPDFleet(ctx context.Context, c Config, bin string, f pdFleet) (_ *replicaFleet, err error) {
	dir, err := os.MkdirTemp("", "tlbench-pd-")
	if err != nil {
		return nil, err
	}
	fl := &replicaFleet{dir: dir}
	defer func() {
		if err != nil {
			fl.close()
		}
	}()
	cfgs, err := pdEngineConfigs(c, f)
	if err != nil {
		return nil, err
	}
	var probed []pdProbed
	for _, ec := range cfgs {
		e, err := enginesim.Start(ctx, ec)
		if err != nil {
			return nil, fmt.Errorf("engine %s: %w", ec.ID, err)
		}
		fl.engines = append(fl.engines, e)
		pe := pdProbed{id: ec.ID, role: ec.Role, addr: e.HTTPAddr()}
		if ec.BootstrapAddr != "" {
			_, pe.bootstrapPort, _ = net.SplitHostPort(e.BootstrapAddr())
		}
		probed = append(probed, pe)
	}
	addrs, err := procs.FreeAddrs(2)
	if err != nil {
		return nil, err
	}
	spec := replicaSpec{bin: bin, replicas: 1, policy: config.PolicyCacheAware, heartbeat: c.Heartbeat, extra: pdTOML(c, f, probed)}
	path := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(path, []byte(replicaTOML(spec, 0, addrs[0], addrs[1], filepath.Join(dir, "state"))), 0o644); err != nil {
		return nil, err
	}
	p, err := procs.Start("gateway", dir, bin, []string{"-config", path}, nil)
	if err != nil {
		return nil, err
	}
	fl.gateways = append(fl.gateways, p)
	fl.urls = append(fl.urls, "http://"+addrs[0])
	if err := p.WaitHTTP(ctx, fl.urls[0]+"/healthz", http.StatusOK, 30*time.Second); err != nil {
		return nil, err
	}
	if err := fl.waitRoutable(ctx, 0, 15*time.Second); err != nil {
		return nil, err
	}
	return fl, nil
}

// pdRun is one run: a fleet at a rate.
type pdRun struct {
	fleet  pdFleet
	rate   float64 // offered requests per second
	repeat int

	ttft, itl, tpot loadgen.Summary
	// goodput is the requests per second of the window that met the joint
	// SLO; attained their share of the window's requests, and tpotMet the
	// share that met the inter-token objective alone.
	goodput, attained, tpotMet float64
	ok, failed, dropped        int
	topError                   string
	load                       float64 // the machine's 1-minute load average at the end
}

// jointSLO counts the requests that met both objectives, DistServe's
// way (a time to first token within ttftSLO and a time per output token,
// the mean gap between its tokens, within tpotSLO), and those that met
// the inter-token objective. ttft and tpot hold one streamed answer's
// each, in the same order.
func jointSLO(ttft, tpot []time.Duration, ttftSLO, tpotSLO time.Duration) (both, tpotOnly int) {
	for i := range min(len(ttft), len(tpot)) {
		if tpot[i] <= tpotSLO {
			tpotOnly++
			if ttft[i] <= ttftSLO {
				both++
			}
		}
	}
	return both, tpotOnly
}

// pdFigures are a run's figures from what the load generator recorded.
// Failed and dropped requests count against the attainments.
func pdFigures(res *loadgen.Result, ttftSLO, tpotSLO time.Duration) pdRun {
	r := pdRun{ttft: loadgen.Summarize(res.TTFT), itl: loadgen.Summarize(res.ITL), tpot: loadgen.Summarize(res.TPOT),
		ok: res.OK, failed: res.Failed, dropped: res.Dropped, topError: res.FirstError()}
	both, tpotOnly := jointSLO(res.TTFT, res.TPOT, ttftSLO, tpotSLO)
	if res.Elapsed > 0 {
		r.goodput = float64(both) / res.Elapsed.Seconds()
	}
	if all := res.OK + res.Failed + res.Dropped; all > 0 {
		r.attained = float64(both) / float64(all)
		r.tpotMet = float64(tpotOnly) / float64(all)
	}
	return r
}

// pdSessions are the mixed workload at rate: one session per request,
// enough for the whole run.
func pdSessions(c Config, rate float64, seed uint64) ([]loadgen.Session, *loadgen.Mix, error) {
	n := int(math.Ceil(rate*c.PDDuration.Seconds()*1.5)) + 16
	m, err := loadgen.BuildMix(loadgen.MixConfig{Requests: n, Model: pdModel, LongShare: c.PDLongShare,
		LongTokens: c.PDLongTokens, ChatTokens: c.PDChatTokens, LongMaxTokens: c.PDLongOutput, ChatMaxTokens: c.PDChatOutput, Seed: seed})
	if err != nil {
		return nil, nil, err
	}
	return loadgen.SessionsOf(&loadgen.Workload{Requests: m.Requests}), m, nil
}

// pdOne runs the sessions at rate through a fresh fleet.
func pdOne(ctx context.Context, c Config, bin string, f pdFleet, sessions []loadgen.Session, rate float64, seed uint64) (pdRun, error) {
	fl, err := startPDFleet(ctx, c, bin, f)
	if err != nil {
		return pdRun{}, err
	}
	defer fl.close()
	client := loadgen.NewClient(1024)
	defer client.CloseIdleConnections()
	res := loadgen.RunSessions(ctx, client, loadgen.Fixed(fl.urls[0]), loadgen.Sessions{Rate: rate, Duration: c.PDDuration, Warmup: c.PDWarmup,
		Sessions: sessions, Seed: seed, InterToken: true})
	if err := ctx.Err(); err != nil {
		return pdRun{}, err
	}
	if res.OK == 0 {
		return pdRun{}, fmt.Errorf("no request succeeded (%d failed: %s): %s", res.Failed, res.FirstError(), fl.gateways[0].Log())
	}
	r := pdFigures(res, c.PDTTFTSLO, c.PDTPOTSLO)
	r.fleet, r.rate, r.load = f, rate, loadAverage()
	return r, nil
}

func pdExperiment(ctx context.Context, c Config, bins binaries, logOut io.Writer) (section, error) {
	if len(c.PDRates) == 0 || c.PDRepeats < 1 || c.PDEngines < 2 {
		return section{}, fmt.Errorf("pd needs rates (%v), repeats (%d) and at least 2 engines (%d)", c.PDRates, c.PDRepeats, c.PDEngines)
	}
	for _, p := range c.PDSplits {
		if p < 1 || p >= c.PDEngines {
			return section{}, fmt.Errorf("pd: %d prefill engines of %d leave no decode engine or no prefill one", p, c.PDEngines)
		}
	}
	var runs []pdRun
	var mix *loadgen.Mix
	for rep := range c.PDRepeats {
		for ri, rate := range c.PDRates {
			seed := c.Seed + uint64(100*(rep+1)+ri)
			sessions, m, err := pdSessions(c, rate, seed)
			if err != nil {
				return section{}, err
			}
			if mix == nil {
				mix = m
			}
			for _, f := range pdFleets(c) {
				r, err := pdOne(ctx, c, bins.gateway, f, sessions, rate, seed)
				if err != nil {
					return section{}, fmt.Errorf("%s %s at %.1f req/s: %w", f.name(), f.protocol, rate, err)
				}
				r.repeat = rep
				fmt.Fprintf(logOut, "tlbench:   #%d %5.1f req/s %-11s %-23s TTFT p50 %7.1f p99 %7.1f ms, ITL p50 %5.1f p99 %6.1f ms, TPOT p99 %5.1f ms, joint SLO %5.1f%% (TPOT %5.1f%%), goodput %5.1f/s, failed %d, load %.1f\n",
					rep, rate, f.name(), f.protocolName(), msf(r.ttft.P50), msf(r.ttft.P99), msf(r.itl.P50), msf(r.itl.P99), msf(r.tpot.P99),
					100*r.attained, 100*r.tpotMet, r.goodput, r.failed+r.dropped, r.load)
				if r.topError != "" {
					fmt.Fprintf(logOut, "tlbench:     most frequent failure: %s\n", r.topError)
				}
				runs = append(runs, r)
			}
		}
	}
	return pdSection(c, mix, runs), nil
}

// pdGroup is the repeats of one fleet at one rate, summarised.
type pdGroup struct {
	fleet              pdFleet
	rate               float64
	n, failed          int
	ttft50, ttft99     spread
	itl50, itl99       spread
	tpot99             spread
	good, att, tpotMet spread
	loadLo, loadHi     float64
}

// groupPD summarises the runs per fleet and rate, in the runs' order.
func groupPD(runs []pdRun) []pdGroup {
	type key struct {
		fleet pdFleet
		rate  float64
	}
	var keys []key
	by := map[key][]pdRun{}
	for _, r := range runs {
		k := key{r.fleet, r.rate}
		if _, ok := by[k]; !ok {
			keys = append(keys, k)
		}
		by[k] = append(by[k], r)
	}
	out := make([]pdGroup, 0, len(keys))
	for _, k := range keys {
		g := pdGroup{fleet: k.fleet, rate: k.rate, n: len(by[k]), loadLo: math.Inf(1)}
		var t50, t99, i50, i99, p99, good, att, met []float64
		for _, r := range by[k] {
			t50, t99 = append(t50, msf(r.ttft.P50)), append(t99, msf(r.ttft.P99))
			i50, i99, p99 = append(i50, msf(r.itl.P50)), append(i99, msf(r.itl.P99)), append(p99, msf(r.tpot.P99))
			good, att, met = append(good, r.goodput), append(att, r.attained), append(met, r.tpotMet)
			g.failed += r.failed + r.dropped
			g.loadLo, g.loadHi = math.Min(g.loadLo, r.load), math.Max(g.loadHi, r.load)
		}
		g.ttft50, g.ttft99, g.itl50, g.itl99, g.tpot99 = spreadOf(t50), spreadOf(t99), spreadOf(i50), spreadOf(i99), spreadOf(p99)
		g.good, g.att, g.tpotMet = spreadOf(good), spreadOf(att), spreadOf(met)
		out = append(out, g)
	}
	return out
}

// pdTarget is the acceptance of one disaggregated fleet at a rate where
// the unified fleet missed the inter-token objective.
type pdTarget struct {
	rate                  float64
	fleet                 pdFleet
	unifiedTPOTMet        float64
	itlRatio, goodRatio   float64
	unifiedGood, pdGood   float64
	unifiedITL99, pdITL99 float64
	met                   bool
}

// pdTargets checks the acceptance at every rate where fewer than
// attainment of the unified fleet's requests met the inter-token
// objective: each disaggregated fleet's inter-token latency p99 at most
// half the unified fleet's, and its goodput under the joint SLO at least
// 1.5 times. It also returns the rates where the unified fleet held the
// objective.
func pdTargets(groups []pdGroup, attainment float64) (targets []pdTarget, held []float64) {
	unified := map[float64]pdGroup{}
	var rates []float64
	for _, g := range groups {
		if g.fleet.unified() {
			unified[g.rate] = g
			rates = append(rates, g.rate)
		}
	}
	for _, rate := range rates {
		u := unified[rate]
		if u.tpotMet.med >= attainment {
			held = append(held, rate)
			continue
		}
		for _, g := range groups {
			if g.fleet.unified() || g.rate != rate {
				continue
			}
			t := pdTarget{rate: rate, fleet: g.fleet, unifiedTPOTMet: u.tpotMet.med,
				itlRatio: fratio(g.itl99.med, u.itl99.med), goodRatio: fratio(g.good.med, u.good.med),
				unifiedGood: u.good.med, pdGood: g.good.med, unifiedITL99: u.itl99.med, pdITL99: g.itl99.med}
			t.met = t.itlRatio <= 0.5 && t.goodRatio >= 1.5
			targets = append(targets, t)
		}
	}
	return targets, held
}

// pdTables are the results table and the acceptance table.
func pdTables(groups []pdGroup, attainment float64) (*table, *table, []float64) {
	t := &table{header: []string{"rate req/s", "fleet", "protocol", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "TPOT p99 ms",
		"within TPOT SLO", "within joint SLO", "goodput req/s", "failed", "load avg"}}
	pctf := func(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }
	for _, g := range groups {
		t.add(f1(g.rate), g.fleet.name(), g.fleet.protocolName(), g.ttft50.format(f1, g.n), g.ttft99.format(f1, g.n),
			g.itl50.format(f1, g.n), g.itl99.format(f1, g.n), g.tpot99.format(f1, g.n), g.tpotMet.format(pctf, g.n), g.att.format(pctf, g.n),
			g.good.format(f1, g.n), strconv.Itoa(g.failed), fmt.Sprintf("%.1f–%.1f", g.loadLo, g.loadHi))
	}
	targets, held := pdTargets(groups, attainment)
	tt := &table{header: []string{"rate req/s", "fleet", "protocol", "unified within TPOT SLO", "ITL p99: disaggregated / unified (target ≤ 0.5)",
		"goodput: disaggregated / unified (target ≥ 1.5)", "verdict"}}
	for _, x := range targets {
		tt.add(f1(x.rate), x.fleet.name(), x.fleet.protocolName(), pctf(x.unifiedTPOTMet),
			fmt.Sprintf("%.2f (%.1f / %.1f ms)", x.itlRatio, x.pdITL99, x.unifiedITL99),
			fmt.Sprintf("%.2f (%.1f / %.1f req/s)", x.goodRatio, x.pdGood, x.unifiedGood), metOrMissed(x.met))
	}
	return t, tt, held
}

func pdSection(c Config, mix *loadgen.Mix, runs []pdRun) section {
	groups := groupPD(runs)
	t, tt, held := pdTables(groups, c.OpenAttainment)
	p, _ := enginesim.LookupPreset(c.PDPreset)
	cost := p.Step.Cost
	longMean, chatMean := 0.0, 0.0
	if mix != nil {
		longMean, chatMean = mix.MeanLongTokens, mix.MeanChatTokens
	}
	splits := make([]string, len(c.PDSplits))
	for i, s := range c.PDSplits {
		splits[i] = fmt.Sprintf("%d prefill + %d decode", s, c.PDEngines-s)
	}
	// What a long prompt's chunk does to the decodes batched with it: a
	// step of 16 running sequences of 1,000 tokens of context, alone and
	// with a chunk of the budget.
	decodeOnly := cost.Duration(0, 16, 16*1000)
	withChunk := cost.Duration(p.Step.MaxNumBatchedTokens-16, 16, 16*1000+p.Step.MaxNumBatchedTokens-16)
	lead := fmt.Sprintf("%d reference engines on the step model (preset `%s`: %s on %s; a step costs %v, plus %v per prefill token, %v per decode sequence and %v per context token, "+
		"at most %d tokens a step%s; %d KV blocks, %d running sequences), probed by one gateway process (`cache_aware`, admission control off, probes every %v), "+
		"as %d unified engines or as %s, the gateway pairing them over each protocol (`kind = \"vllm\"`: kv_transfer_params; `kind = \"sglang\"`: bootstrap rooms; the unified engines are probed as `vllm`). "+
		"Like vLLM's scheduler, a step carries every running sequence's decode token and then prefill chunks within the budget, so a long prompt's chunk slows every decode batched with it: "+
		"16 sequences decode in %v a step alone and %v beside a chunk of %d tokens. "+
		"Workload: Poisson arrivals, every request a chat completion of a prompt of its own (no prefix cache helps), streamed; %.0f%% long prompts of %d–%d tokens (mean %.0f rendered) answered with %d tokens, "+
		"the rest chat prompts of %d–%d tokens (mean %.0f) answered with %d. Each run starts fresh engines and a fresh gateway and sends for %v, the first %v not recorded. "+
		"TTFT: send to the first token event. ITL: every gap between two token events of every answer (vLLM's benchmark's ITL). TPOT: an answer's mean gap (DistServe's time per output token). "+
		"Joint SLO (DistServe's): TTFT ≤ %v and TPOT ≤ %v; goodput is the requests per second of the window that met both, and the shares are of every request of the window (failed ones miss). "+
		"Figures are the median of %d runs with their range (min–max); the load average is the machine's 1-minute one at the end of each run (2 cores, shared).",
		c.PDEngines, p.Name, p.Model, p.GPU, cost.Fixed, cost.PerPrefillToken, cost.PerDecodeSeq, cost.PerContextToken,
		p.Step.MaxNumBatchedTokens, apiServerSaid(p), p.KVBlocks, p.MaxRunning, c.Heartbeat,
		c.PDEngines, strings.Join(splits, " or "),
		decodeOnly.Round(100*time.Microsecond), withChunk.Round(100*time.Microsecond), p.Step.MaxNumBatchedTokens-16,
		100*c.PDLongShare, c.PDLongTokens[0], c.PDLongTokens[1], longMean, c.PDLongOutput,
		c.PDChatTokens[0], c.PDChatTokens[1], chatMean, c.PDChatOutput, c.PDDuration, c.PDWarmup,
		c.PDTTFTSLO, c.PDTPOTSLO, c.PDRepeats)
	sec := section{title: "Disaggregated prefill and decode", lead: lead, tables: []*table{t}}
	if len(tt.rows) > 0 {
		sec.tables = append(sec.tables, tt)
		sec.notes = append(sec.notes, fmt.Sprintf("Acceptance, at each rate where fewer than %.0f%% of the unified fleet's requests met the TPOT objective: the disaggregated fleet's ITL p99 at most half the unified fleet's and its goodput under the joint SLO at least 1.5 times (medians).",
			100*c.OpenAttainment))
	} else {
		sec.notes = append(sec.notes, fmt.Sprintf("Acceptance not measured: the unified fleet met the TPOT objective for at least %.0f%% of its requests at every rate; a higher rate (-pd-rates) finds where it misses.", 100*c.OpenAttainment))
	}
	if len(held) > 0 && len(tt.rows) > 0 {
		rs := make([]string, len(held))
		for i, r := range held {
			rs[i] = f1(r)
		}
		sec.notes = append(sec.notes, fmt.Sprintf("At %s req/s the unified fleet held the TPOT objective (at least %.0f%% of its requests): no acceptance applies there.", strings.Join(rs, ", "), 100*c.OpenAttainment))
	}
	return sec
}
