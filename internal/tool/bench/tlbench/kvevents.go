package tlbench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	ekv "github.com/tlgate/tlgate/enginesim/kvevents"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
	"github.com/tlgate/tlgate/internal/tool/bench/procs"
)

// The arms of the eviction-pressure sweep.
const (
	armLO     = "least_outstanding"
	armApprox = "cache_aware, prefix index"
	armEvents = "cache_aware, KV events"
)

var kvArms = []string{armLO, armApprox, armEvents}

// kvEngines are the engines of a KV events run: the open loop's, with
// blocks per engine so that the fleet holds c.KVPressure of the working set,
// publishing their events (with a replay socket) when events is set.
func kvEngines(c Config, kind loadgen.Kind, blocks int, events bool) []enginesim.Config {
	out := openEngines(c, kind)
	for i := range out {
		out[i].KVBlocks = blocks
		if events {
			out[i].KVEvents = ekv.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}
		}
	}
	return out
}

// workingSetBlocks estimates the distinct KV blocks workload w keeps in
// use at rate requests per second: RAG's every document and system
// prompt (each is asked about again and again), multi-turn's conversations
// in flight at once (Little's law over a conversation's turns and think
// times), each at its mean length in the reference engine's tokens.
func workingSetBlocks(c Config, kind loadgen.Kind, rate float64, w *loadgen.Workload) int {
	const bs = 16
	meanTokens := w.MeanPromptTokens
	switch kind {
	case loadgen.RAG:
		return int(math.Ceil(float64(c.Documents) * w.DocumentTokens / bs))
	case loadgen.MultiTurn:
		sessionRate := rate / float64(c.OpenTurns)
		life := float64(c.OpenTurns) * (c.Think + 50*time.Millisecond).Seconds()
		return int(math.Ceil(sessionRate * life * 2 * meanTokens / bs))
	}
	return int(math.Ceil(rate * meanTokens / bs))
}

// kvRun is one run of the sweep.
type kvRun struct {
	openRun
	arm string
	// tokenizeMean is the mean time tokenizations added (events arm), and
	// fallbacks the share of them past the deadline.
	tokenizeMean time.Duration
	fallbacks    float64
	exactShare   float64 // picks made on an exact view
	agreedShare  float64 // picks made untokenized on the agreeing prefix index
	// selfCPU is this process's CPU over the window per request: the
	// engines' (their KV events included) and the load generator's.
	selfCPU time.Duration
}

// kvEventsExperiment runs the eviction-pressure sweep, the drop drill, the
// tokenization cost, the subscriber's CPU per event and the agreement of
// three synced replicas.
func kvEventsExperiment(ctx context.Context, c Config, bins binaries, logOut io.Writer) (section, error) {
	var nats *natsServer
	var err error
	if bins.nats != "" {
		if nats, err = startNATS(ctx, bins.nats); err != nil {
			return section{}, err
		}
		defer nats.close()
	}
	base := fleetSpec(c, bins.gateway, nats)
	kv := ""
	if c.KVAgreementSample > 0 {
		kv = fmt.Sprintf("agreement_sample = %d\n", c.KVAgreementSample)
	}
	if c.KVIndexAgreement != nil {
		kv += fmt.Sprintf("index_agreement = %v\n", *c.KVIndexAgreement)
	}
	spec := func(replicas int, sync bool, policy string) replicaSpec {
		s := base(replicas, sync, policy)
		s.extra = kvGatewayExtra(kv)
		return s
	}
	sec := section{title: "Exact routing on the engines' KV cache events",
		lead: fmt.Sprintf("%d reference engines (%s), each KV cache sized so that the fleet holds %.2f of the workload's working set; "+
			"one gateway process; open-loop Poisson arrivals for %v (the first %v not counted); %d runs of each configuration, medians with the range. "+
			"Every arm's engines publish their KV events (ZMQ, vLLM's map encoding, with replay). Arms: least_outstanding; cache_aware on the prefix index (the gateway follows no events: [gateway.kv_events] follow = false); cache_aware on the engines' KV events. "+
			"The tokenization cost's engines answer at once (no prefill or decode time), so that the tokenizer's time is all the difference.",
			c.Engines, engineModel(c, c.OpenDecode), c.KVPressure, c.OpenDuration, c.OpenWarmup, c.OpenRepeats)}
	if c.KVIndexAgreement != nil {
		sec.lead += fmt.Sprintf(" The events arm's [gateway.kv_events] index_agreement is %v (0: every request is tokenized and picked on the events).", *c.KVIndexAgreement)
	}
	if c.NumberShare > 0 {
		sec.lead += fmt.Sprintf(" The workloads' text is %.0f%% numbers (-number-share %v), which the reference tokenizer reads one token per byte: "+
			"denser in tokens per byte than words alone, whose 5.9 bytes per token make the prefix index's 4 an underestimate of what a cache holds.", 100*c.NumberShare, c.NumberShare)
	}
	var runs []kvRun
	capacity := map[loadgen.Kind]float64{}
	blocks := map[loadgen.Kind]int{}
	for wi, kind := range c.OpenWorkloads {
		seed := c.Seed + uint64(wi)
		w, err := loadgen.Build(workloadConfig(c, kind, c.SystemPrompts, seed))
		if err != nil {
			return section{}, err
		}
		users, sessions, err := capacityLoad(c, kind, seed)
		if err != nil {
			return section{}, err
		}
		// The KV is sized at the capacity's working set, measured with
		// the routing runs' KV first.
		cr, err := openOne(ctx, c, kind, spec(1, false, config.PolicyLeastOutstanding), sessions, openOpts{users: users, seed: seed})
		if err != nil {
			return section{}, fmt.Errorf("%s capacity: %w", kind, err)
		}
		capRate := float64(cr.ok) / (c.OpenDuration - c.OpenWarmup).Seconds()
		ws := workingSetBlocks(c, kind, 0.7*capRate, w)
		blocks[kind] = max(32, int(float64(ws)*c.KVPressure)/c.Engines)
		cr, err = openOne(ctx, c, kind, spec(1, false, config.PolicyLeastOutstanding), sessions,
			openOpts{users: users, seed: seed, engines: kvEngines(c, kind, blocks[kind], true)})
		if err != nil {
			return section{}, fmt.Errorf("%s capacity: %w", kind, err)
		}
		capacity[kind] = float64(cr.ok) / (c.OpenDuration - c.OpenWarmup).Seconds()
		fmt.Fprintf(logOut, "tlbench:   %-10s working set ~%d blocks, %d blocks per engine; least_outstanding capacity %.1f req/s\n", kind, ws, blocks[kind], capacity[kind])
	}
	for rep := range c.OpenRepeats {
		for wi, kind := range c.OpenWorkloads {
			for _, frac := range c.OpenFractions {
				rate := frac * capacity[kind]
				seed := c.Seed + uint64(1000*(rep+1)+wi)
				sessions, err := openSessions(c, kind, rate, seed)
				if err != nil {
					return section{}, err
				}
				for _, arm := range kvArms {
					policy := config.PolicyCacheAware
					if arm == armLO {
						policy = config.PolicyLeastOutstanding
					}
					s := spec(1, false, policy)
					if arm == armApprox {
						s.extra = kvGatewayExtra(kv + "follow = false\n")
					}
					// Every arm's engines publish their events, so that
					// all pay the simulated engines' publishing CPU (a
					// real engine's is beside its GPU's steps); only the
					// events arm's gateway follows them.
					r, err := kvOne(ctx, c, kind, s, sessions, kvEngines(c, kind, blocks[kind], true),
						openOpts{sessionRate: rate / float64(sessionTurns(c, kind)), seed: seed})
					if err != nil {
						return section{}, fmt.Errorf("%s at %.0f%%, %s: %w", kind, 100*frac, arm, err)
					}
					r.arm, r.fraction, r.rate, r.repeat = arm, frac, rate, rep
					fmt.Fprintf(logOut, "tlbench:   %-10s %3.0f%% %-27s TTFT p50 %6.1f p90 %6.1f p99 %7.1f ms, goodput %5.1f/s, hit %4.1f%% (expected %4.1f%%), exact picks %4.1f%% (agreed %4.1f%%), tokenize %.2f ms (%.1f%% past deadline), CPU %.0f µs gateway, %.0f µs engines, failed %d\n",
						kind, 100*frac, arm, msf(r.ttft.P50), msf(r.ttft.P90), msf(r.ttft.P99), r.goodput, 100*r.hitRate, 100*r.predicted, 100*r.exactShare, 100*r.agreedShare, msf(r.tokenizeMean), 100*r.fallbacks, float64(r.cpuPerRequest)/1e3, float64(r.selfCPU)/1e3, r.failed+r.dropped)
					runs = append(runs, r)
				}
			}
		}
	}
	sec.tables = append(sec.tables, kvSweepTable(runs))
	targets, notes := kvTargets(runs)
	sec.tables = append(sec.tables, targets)
	sec.notes = append(sec.notes, notes...)
	for _, kind := range c.OpenWorkloads {
		sec.notes = append(sec.notes, fmt.Sprintf("%s: %d KV blocks per engine (%.2f of a working set of about %d blocks at 70%% of capacity, %d engines); least_outstanding's capacity on them %.1f req/s.",
			kind, blocks[kind], c.KVPressure, int(float64(blocks[kind]*c.Engines)/c.KVPressure), c.Engines, capacity[kind]))
	}

	// The drill: every engine drops its events for 10 s.
	kind := c.OpenWorkloads[0]
	drill, err := kvDrill(ctx, c, kind, spec(1, false, config.PolicyCacheAware), kvEngines(c, kind, blocks[kind], true), 0.7*capacity[kind])
	if err != nil {
		return section{}, fmt.Errorf("drill: %w", err)
	}
	sec.notes = append(sec.notes, drill)

	tok, err := kvTokenizeCost(ctx, c, spec)
	if err != nil {
		return section{}, fmt.Errorf("tokenization cost: %w", err)
	}
	sec.tables = append(sec.tables, tok)

	cpu, err := kvSubscriberCPU(ctx, c, spec)
	if err != nil {
		return section{}, fmt.Errorf("subscriber CPU: %w", err)
	}
	sec.notes = append(sec.notes, cpu)

	if nats != nil {
		agree, err := kvAgreement(ctx, c, kind, spec(3, true, config.PolicyCacheAware), kvEngines(c, kind, blocks[kind], true), 0.7*capacity[kind])
		if err != nil {
			return section{}, fmt.Errorf("agreement: %w", err)
		}
		sec.notes = append(sec.notes, agree)
	} else {
		sec.notes = append(sec.notes, "The agreement of three synced replicas was not measured: no NATS server was built for this run.")
	}
	return sec, nil
}

// kvGatewayExtra is the gateway configuration the experiment adds: the
// tokenizer's 50 ms deadline, and kv's keys of [gateway.kv_events] ("":
// the defaults).
func kvGatewayExtra(kv string) string {
	extra := "\n[gateway.tokenizer]\ntimeout = \"50ms\"\n"
	if kv != "" {
		extra += "\n[gateway.kv_events]\n" + kv
	}
	return extra
}

// kvOne is openOne with the KV events figures of the run.
func kvOne(ctx context.Context, c Config, kind loadgen.Kind, spec replicaSpec, sessions []loadgen.Session, engines []enginesim.Config, o openOpts) (kvRun, error) {
	var mu sync.Mutex
	var before, after map[string]float64
	o.engines = engines
	o.during = func(dctx context.Context, f *replicaFleet) {
		// The tokenizer's and the picks' counters, over the window.
		select {
		case <-dctx.Done():
			return
		case <-time.After(c.OpenWarmup):
		}
		m := kvCounters(ctx, f)
		m["self_cpu"] = selfCPU()
		mu.Lock()
		before = m
		mu.Unlock()
		<-dctx.Done()
		m = kvCounters(ctx, f)
		m["self_cpu"] = selfCPU()
		mu.Lock()
		after = m
		mu.Unlock()
	}
	r, err := openOne(ctx, c, kind, spec, sessions, o)
	if err != nil {
		return kvRun{}, err
	}
	out := kvRun{openRun: r}
	mu.Lock()
	defer mu.Unlock()
	if before != nil && after != nil {
		d := func(k string) float64 { return after[k] - before[k] }
		if n := d("tok_n"); n > 0 {
			out.tokenizeMean = time.Duration(d("tok_sum") / n * float64(time.Second))
			out.fallbacks = d("tok_timeout") / n
		}
		if n := r.ok + r.failed; n > 0 {
			out.selfCPU = time.Duration(d("self_cpu") / float64(n))
		}
		if n := d("exact") + d("approx") + d("agreed"); n > 0 {
			out.exactShare, out.agreedShare = d("exact")/n, d("agreed")/n
		}
	}
	return out, nil
}

// selfCPU is this process's CPU time so far, in nanoseconds (0 when it
// cannot be read).
func selfCPU() float64 {
	d, err := procs.SelfCPU()
	if err != nil {
		return 0
	}
	return float64(d)
}

// kvCounters reads the gateways' tokenizer and pick counters.
func kvCounters(ctx context.Context, f *replicaFleet) map[string]float64 {
	m := map[string]float64{}
	for _, u := range f.urls {
		b, err := fetch(ctx, u+"/metrics")
		if err != nil {
			continue
		}
		m["tok_sum"] += metricSum(b, "tlgate_tokenize_seconds_sum", "")
		m["tok_n"] += metricSum(b, "tlgate_tokenize_seconds_count", "")
		m["tok_timeout"] += metricSum(b, "tlgate_tokenize_seconds_count", `outcome="timeout"`)
		m["exact"] += metricSum(b, "tlgate_cache_aware_picks_total", `view="exact"`)
		m["approx"] += metricSum(b, "tlgate_cache_aware_picks_total", `view="approximate"`)
		m["agreed"] += metricSum(b, "tlgate_cache_aware_picks_total", `view="agreed"`)
	}
	return m
}

// kvGroup is the repeats of one configuration of the sweep.
type kvGroup struct {
	kind              loadgen.Kind
	fraction          float64
	arm               string
	n, failed         int
	p50, p90, p99     spread
	good, hit, exact  spread
	agreed            spread
	cpu, selfCPU      spread
	expected          spread
	tokMean, fallback spread
}

func groupKV(runs []kvRun) []kvGroup {
	type key struct {
		kind loadgen.Kind
		frac float64
		arm  string
	}
	var keys []key
	by := map[key][]kvRun{}
	for _, r := range runs {
		k := key{r.workload, r.fraction, r.arm}
		if _, ok := by[k]; !ok {
			keys = append(keys, k)
		}
		by[k] = append(by[k], r)
	}
	var out []kvGroup
	for _, k := range keys {
		g := kvGroup{kind: k.kind, fraction: k.frac, arm: k.arm, n: len(by[k])}
		var p50, p90, p99, good, hit, exact, agreed, tok, fb, exp, cpu, self []float64
		for _, r := range by[k] {
			p50, p90, p99 = append(p50, msf(r.ttft.P50)), append(p90, msf(r.ttft.P90)), append(p99, msf(r.ttft.P99))
			good, hit, exact = append(good, r.goodput), append(hit, r.hitRate), append(exact, r.exactShare)
			tok, fb = append(tok, msf(r.tokenizeMean)), append(fb, r.fallbacks)
			exp, agreed = append(exp, r.predicted), append(agreed, r.agreedShare)
			cpu, self = append(cpu, float64(r.cpuPerRequest)/float64(time.Microsecond)), append(self, float64(r.selfCPU)/float64(time.Microsecond))
			g.failed += r.failed + r.dropped
		}
		g.p50, g.p90, g.p99, g.good, g.hit, g.exact, g.tokMean, g.fallback = spreadOf(p50), spreadOf(p90), spreadOf(p99), spreadOf(good), spreadOf(hit), spreadOf(exact), spreadOf(tok), spreadOf(fb)
		g.expected, g.agreed = spreadOf(exp), spreadOf(agreed)
		g.cpu, g.selfCPU = spreadOf(cpu), spreadOf(self)
		out = append(out, g)
	}
	return out
}

func kvSweepTable(runs []kvRun) *table {
	t := &table{header: []string{"workload", "rate", "arm", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "goodput req/s", "hit rate (the gateway expected)", "picks on events (untokenized, the index agreeing)", "tokenize ms (past deadline)", "gateway CPU µs/request", "engines' and load generator's CPU µs/request", "failed"}}
	pctf := func(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }
	for _, g := range groupKV(runs) {
		tok, exact := "–", "–"
		if g.arm == armEvents {
			tok = g.tokMean.format(func(v float64) string { return fmt.Sprintf("%.2f", v) }, g.n) + " (" + pctf(g.fallback.med) + ")"
			exact = g.exact.format(pctf, g.n) + " (" + pctf(g.agreed.med) + ")"
		}
		t.add(string(g.kind), fmt.Sprintf("%.0f%%", 100*g.fraction), g.arm, g.p50.format(f1, g.n), g.p90.format(f1, g.n), g.p99.format(f1, g.n),
			g.good.format(f1, g.n), hitCell(g, pctf), exact, tok, g.cpu.format(f0, g.n), g.selfCPU.format(f0, g.n), strconv.Itoa(g.failed))
	}
	return t
}

// hitCell is the hit rate and, for cache_aware, the share of prompt
// tokens the gateway expected to be cached where it sent them.
func hitCell(g kvGroup, pctf func(float64) string) string {
	if g.arm == armLO {
		return g.hit.format(pctf, g.n)
	}
	return g.hit.format(pctf, g.n) + " (" + pctf(g.expected.med) + ")"
}

// kvTargets checks the acceptance at 70% and 90% of capacity: the events
// arm's TTFT p90 at most half the prefix index's, and its goodput at least
// 1.25 times.
func kvTargets(runs []kvRun) (*table, []string) {
	t := &table{header: []string{"workload", "rate", "TTFT p90: events / prefix index (target ≤ 0.5)", "goodput: events / prefix index (target ≥ 1.25)", "verdict"}}
	groups := groupKV(runs)
	find := func(kind loadgen.Kind, frac float64, arm string) (kvGroup, bool) {
		for _, g := range groups {
			if g.kind == kind && math.Abs(g.fraction-frac) < 1e-9 && g.arm == arm {
				return g, true
			}
		}
		return kvGroup{}, false
	}
	var notes []string
	seen := map[loadgen.Kind]bool{}
	for _, g := range groups {
		if seen[g.kind] {
			continue
		}
		seen[g.kind] = true
		for _, frac := range []float64{0.7, 0.9} {
			ev, ok1 := find(g.kind, frac, armEvents)
			ap, ok2 := find(g.kind, frac, armApprox)
			if !ok1 || !ok2 || ap.p90.med <= 0 || ap.good.med <= 0 {
				continue
			}
			p90 := ev.p90.med / ap.p90.med
			good := ev.good.med / ap.good.med
			verdict := "met"
			if p90 > 0.5 || good < 1.25 {
				verdict = "MISSED"
			}
			t.add(string(g.kind), fmt.Sprintf("%.0f%%", 100*frac), fmt.Sprintf("%.2f", p90), fmt.Sprintf("%.2f", good), verdict)
		}
	}
	return t, notes
}

// kvDrill drops every engine's events for 10 s in the middle of an open
// loop at rate, and reports the requests that failed, the stale workers
// seen while the events were dropped, and whether every view was exact
// again at the end.
func kvDrill(ctx context.Context, c Config, kind loadgen.Kind, spec replicaSpec, engines []enginesim.Config, rate float64) (string, error) {
	const drop = 10 * time.Second
	d := c
	d.OpenDuration = c.OpenWarmup + drop + 4*time.Second
	sessions, err := openSessions(d, kind, rate, c.Seed+7000)
	if err != nil {
		return "", err
	}
	var mu sync.Mutex
	maxStale, endStale, endExact := 0.0, -1.0, -1.0
	o := openOpts{sessionRate: rate / float64(sessionTurns(d, kind)), seed: c.Seed + 7000, engines: engines}
	o.during = func(dctx context.Context, f *replicaFleet) {
		select {
		case <-dctx.Done():
			return
		case <-time.After(c.OpenWarmup):
		}
		for _, e := range f.engines {
			e.KVEventsPublisher().SetFaults(ekv.Faults{Drop: true})
		}
		end := time.Now().Add(drop)
		for time.Now().Before(end) && dctx.Err() == nil {
			if b, err := fetch(ctx, f.urls[0]+"/metrics"); err == nil {
				mu.Lock()
				maxStale = max(maxStale, metricSum(b, "tlgate_kv_events_stale_workers", ""))
				mu.Unlock()
			}
			time.Sleep(250 * time.Millisecond)
		}
		for _, e := range f.engines {
			e.KVEventsPublisher().SetFaults(ekv.Faults{})
		}
		<-dctx.Done()
		if b, err := fetch(ctx, f.urls[0]+"/metrics"); err == nil {
			mu.Lock()
			endStale = metricSum(b, "tlgate_kv_events_stale_workers", "")
			endExact = metricSum(b, "tlgate_kv_events_workers", `view="exact"`)
			mu.Unlock()
		}
	}
	r, err := openOne(ctx, d, kind, spec, sessions, o)
	if err != nil {
		return "", err
	}
	mu.Lock()
	defer mu.Unlock()
	return fmt.Sprintf("Drill, %s at 70%% of capacity (%.1f req/s), cache_aware on events: every engine dropped its events (numbered, kept for replay, not sent) for %v after the warmup. "+
		"%d requests answered, %d failed; at most %.0f of %d workers were stale meanwhile; at the end %.0f stale and %.0f exact (target: no request fails, every view exact again by itself: %s).",
		kind, rate, drop, r.ok, r.failed+r.dropped, maxStale, len(engines), endStale, endExact,
		metOrMissed(r.failed+r.dropped == 0 && endStale == 0 && int(endExact) == len(engines))), nil
}

// kvTokenizeCost measures what tokenizing a prompt adds before its pick,
// at 512, 2048 and 8192 tokens: sequential requests, each with a prompt of
// its own, through one gateway whose engines publish events, against the
// same through one whose engines do not.
func kvTokenizeCost(ctx context.Context, c Config, spec func(int, bool, string) replicaSpec) (*table, error) {
	t := &table{header: []string{"prompt tokens", "tokenize ms (mean, gateway metric)", "TTFT p50 ms, events", "TTFT p50 ms, no events", "difference ms", "tokenize ms, a conversation's next turn"}}
	const n = 24
	for _, size := range []int{512, 2048, 8192} {
		var ttft [2]time.Duration
		var tokMean, nextMean time.Duration
		for arm := range 2 {
			events := arm == 0
			engines := kvEngines(c, loadgen.RAG, 4096, events)
			for i := range engines { // zero-cost on either model: the tokenizer's time alone
				engines[i].Step, engines[i].PrefillPerToken, engines[i].DecodePerToken = nil, 0, 0
			}
			sp := spec(1, false, config.PolicyCacheAware)
			sp.extra = kvGatewayExtra("index_agreement = 0\n") // every request tokenized: its cost is measured
			f, err := startReplicas(ctx, sp, engines)
			if err != nil {
				return nil, err
			}
			if events {
				if err := warmViews(ctx, f, c.Model); err != nil {
					f.close()
					return nil, err
				}
			}
			client := loadgen.NewClient(4)
			var ds []time.Duration
			before := map[string]float64{}
			if b, err := fetch(ctx, f.urls[0]+"/metrics"); err == nil {
				before["sum"], before["n"] = metricSum(b, "tlgate_tokenize_seconds_sum", ""), metricSum(b, "tlgate_tokenize_seconds_count", "")
			}
			rng := rand.New(rand.NewPCG(uint64(size), 1))
			for i := range n {
				msgs := []map[string]string{{"role": "user", "content": promptOf(rng, size)}}
				d, err := ttftOf(ctx, client, f.urls[0], c.Model, msgs)
				if err != nil {
					f.close()
					return nil, fmt.Errorf("%d tokens, request %d: %w", size, i, err)
				}
				ds = append(ds, d)
			}
			if b, err := fetch(ctx, f.urls[0]+"/metrics"); err == nil && events {
				if k := metricSum(b, "tlgate_tokenize_seconds_count", "") - before["n"]; k > 0 {
					tokMean = time.Duration((metricSum(b, "tlgate_tokenize_seconds_sum", "") - before["sum"]) / k * float64(time.Second))
				}
			}
			if events { // a conversation growing turn after turn: its turns reuse
				convo := []map[string]string{{"role": "system", "content": promptOf(rng, size)}}
				b0, _ := fetch(ctx, f.urls[0]+"/metrics")
				for turn := range 8 {
					convo = append(convo, map[string]string{"role": "user", "content": promptOf(rng, 40)})
					if _, err := ttftOf(ctx, client, f.urls[0], c.Model, convo); err != nil {
						f.close()
						return nil, fmt.Errorf("turn %d: %w", turn, err)
					}
					convo = append(convo, map[string]string{"role": "assistant", "content": promptOf(rng, 40)})
				}
				if b1, err := fetch(ctx, f.urls[0]+"/metrics"); err == nil {
					if k := metricSum(b1, "tlgate_tokenize_seconds_count", "") - metricSum(b0, "tlgate_tokenize_seconds_count", ""); k > 0 {
						nextMean = time.Duration((metricSum(b1, "tlgate_tokenize_seconds_sum", "") - metricSum(b0, "tlgate_tokenize_seconds_sum", "")) / k * float64(time.Second))
					}
				}
			}
			client.CloseIdleConnections()
			f.close()
			ttft[arm] = loadgen.Summarize(ds).P50
		}
		t.add(strconv.Itoa(size), fmt.Sprintf("%.2f", msf(tokMean)), fmt.Sprintf("%.2f", msf(ttft[0])), fmt.Sprintf("%.2f", msf(ttft[1])),
			fmt.Sprintf("%+.2f", msf(ttft[0]-ttft[1])), fmt.Sprintf("%.2f", msf(nextMean)))
	}
	return t, nil
}

// promptOf is about tokens reference-engine tokens of English words.
func promptOf(rng *rand.Rand, tokens int) string {
	words := []string{"the", "gateway", "routes", "every", "request", "to", "an", "engine", "whose", "cache", "holds", "its", "prefix", "and", "answers", "faster"}
	var b strings.Builder
	for b.Len() < 4*tokens {
		b.WriteString(words[rng.IntN(len(words))])
		b.WriteByte(' ')
	}
	return b.String()
}

// ttftOf sends one streamed chat request (max_tokens 1) and returns its
// time to first token.
func ttftOf(ctx context.Context, client *http.Client, url, model string, msgs []map[string]string) (time.Duration, error) {
	body, err := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": 1, "stream": true})
	if err != nil {
		return 0, err
	}
	_, ttft, err := loadgen.Do(ctx, client, url, loadgen.Request{Path: "/v1/chat/completions", Body: body, Stream: true})
	return ttft, err
}

// warmViews makes every engine of f publish a batch, so that the
// gateways' views of them are exact.
func warmViews(ctx context.Context, f *replicaFleet, model string) error {
	client := loadgen.NewClient(4)
	defer client.CloseIdleConnections()
	rng := rand.New(rand.NewPCG(9, 9))
	for _, e := range f.engines {
		if _, err := ttftOf(ctx, client, e.URL(), model, []map[string]string{{"role": "user", "content": promptOf(rng, 64)}}); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		exact := 0.0
		for _, u := range f.urls {
			if b, err := fetch(ctx, u+"/metrics"); err == nil {
				exact += metricSum(b, "tlgate_kv_events_workers", `view="exact"`)
			}
		}
		if int(exact) >= len(f.engines)*len(f.urls) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the views of %d engines were not exact within 10s", len(f.engines))
}

// kvSubscriberCPU measures the gateway's CPU per KV event: one engine
// publishes synthetic batches (a step's worth: a block stored, one
// evicted) as fast as the gateway takes them, for a few seconds, and the
// gateway process's CPU over them is divided by the events.
func kvSubscriberCPU(ctx context.Context, c Config, spec func(int, bool, string) replicaSpec) (string, error) {
	engines := kvEngines(c, loadgen.RAG, 64, true)[:1]
	f, err := startReplicas(ctx, spec(1, false, config.PolicyCacheAware), engines)
	if err != nil {
		return "", err
	}
	defer f.close()
	if err := warmViews(ctx, f, c.Model); err != nil {
		return "", err
	}
	pub := f.engines[0].KVEventsPublisher()
	readEvents := func() float64 {
		b, err := fetch(ctx, f.urls[0]+"/metrics")
		if err != nil {
			return 0
		}
		return metricSum(b, "tlgate_kv_events_total", "")
	}
	e0 := readEvents()
	cpu0, _ := f.cpu()
	// Chunks of batches, each taken in whole before the next is sent: the
	// gateway is measured at the rate it keeps up with, with no batch lost
	// (a loss would be replayed, which costs more).
	const chunks, perChunk = 20, 1000
	var parent *ekv.Hash
	sent := 0.0
	for ch := range chunks {
		for i := range perChunk {
			k := ch*perChunk + i
			tokens := make([]uint32, 16)
			for j := range tokens {
				tokens[j] = uint32(k*16 + j)
			}
			var h ekv.Hash
			binary.BigEndian.PutUint64(h[:], uint64(k+1000))
			ev := []ekv.Event{&ekv.BlockStored{BlockHashes: []ekv.Hash{h}, Parent: parent, TokenIDs: tokens, BlockSize: 16, Medium: "GPU", SpecKind: ekv.SpecFullAttention}}
			if parent != nil {
				ev = append(ev, &ekv.BlockRemoved{BlockHashes: []ekv.Hash{*parent}, Medium: "GPU"})
			}
			hp := h
			parent = &hp
			pub.Publish(ev)
			sent += float64(len(ev))
		}
		deadline := time.Now().Add(30 * time.Second)
		for readEvents()-e0 < sent && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
	got := readEvents()
	cpu1, _ := f.cpu()
	n := got - e0
	if n <= 0 {
		return "", fmt.Errorf("the gateway counted no event")
	}
	const batches = chunks * perChunk
	return fmt.Sprintf("Subscriber CPU: one gateway process took %.0f events (%d batches of a block stored and one removed) from one engine's PUB socket: %.2f µs of CPU per event, "+
		"everything in (ZMQ, decoding, the router applying them, and the process's other work meanwhile: its metrics scraped every 50 ms); %.0f of the %.0f events sent reached it. "+
		"Past the socket, decoding a batch and applying it to the exact view costs about 1.5 µs per event (BenchmarkKVEventsDecodeApply).",
		n, batches, float64(cpu1-cpu0)/float64(time.Microsecond)/n, n, sent), nil
}

// kvAgreement runs three replicas synced over NATS, following the same
// engines' events, under an open loop at rate, and compares their views
// of every engine every 250 ms: the share of samples where the three
// hold the same blocks, and the mean difference otherwise.
func kvAgreement(ctx context.Context, c Config, kind loadgen.Kind, spec replicaSpec, engines []enginesim.Config, rate float64) (string, error) {
	sessions, err := openSessions(c, kind, rate, c.Seed+8000)
	if err != nil {
		return "", err
	}
	var mu sync.Mutex
	samples, agree := 0, 0
	var diffs []float64
	o := openOpts{sessionRate: rate / float64(sessionTurns(c, kind)), seed: c.Seed + 8000, engines: engines}
	o.during = func(dctx context.Context, f *replicaFleet) {
		for dctx.Err() == nil {
			time.Sleep(250 * time.Millisecond)
			var views []map[string]float64
			for _, u := range f.urls {
				b, err := fetch(ctx, u+"/metrics")
				if err != nil {
					return
				}
				views = append(views, blocksByWorker(b))
			}
			mu.Lock()
			for id, n0 := range views[0] {
				samples++
				same := true
				for _, v := range views[1:] {
					if v[id] != n0 {
						same = false
						diffs = append(diffs, math.Abs(v[id]-n0)/math.Max(1, n0))
					}
				}
				if same {
					agree++
				}
			}
			mu.Unlock()
		}
	}
	r, err := openOne(ctx, c, kind, spec, sessions, o)
	if err != nil {
		return "", err
	}
	mu.Lock()
	defer mu.Unlock()
	mean := 0.0
	for _, d := range diffs {
		mean += d
	}
	if len(diffs) > 0 {
		mean /= float64(len(diffs))
	}
	share := 0.0
	if samples > 0 {
		share = float64(agree) / float64(samples)
	}
	return fmt.Sprintf("Agreement, 3 replicas with fleet sync on, each following the engines' events, %s at 70%% of capacity (%.1f req/s, %d answered, %d failed): "+
		"in %.1f%% of %d samples (every 250 ms, every engine) the three replicas' views held exactly the same number of blocks; where they differed, by %.2f%% of the blocks on average "+
		"(the samples are not simultaneous: a batch applied by one replica between two reads shows as a difference).",
		kind, rate, r.ok, r.failed+r.dropped, 100*share, samples, 100*mean), nil
}

// blocksByWorker reads tlgate_kv_index_blocks per worker (every tier) of
// an exposition.
func blocksByWorker(exposition []byte) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(string(exposition), "\n") {
		rest, ok := strings.CutPrefix(line, "tlgate_kv_index_blocks{")
		if !ok {
			continue
		}
		i := strings.Index(rest, `worker="`)
		if i < 0 {
			continue
		}
		w := rest[i+len(`worker="`):]
		w = w[:strings.IndexByte(w, '"')]
		fields := strings.Fields(rest)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			out[w] += v
		}
	}
	return out
}
