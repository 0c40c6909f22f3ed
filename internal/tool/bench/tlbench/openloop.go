package tlbench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
)

// openRun is one open-loop run: a workload at a rate, through some
// replicas with sync off or on, under one policy.
type openRun struct {
	workload loadgen.Kind
	fraction float64 // of least_outstanding's single-replica capacity
	rate     float64 // offered requests per second
	replicas int
	sync     bool
	policy   string
	repeat   int

	ttft, e2e loadgen.Summary
	hitRate   float64
	// predicted is the share of prompt tokens the replicas' prefix
	// indexes expected to be cached where they sent them (cache_aware
	// only): above hitRate, the indexes believe in prefixes the engines
	// no longer hold.
	predicted           float64
	goodput             float64 // requests per second answered with TTFT within the SLO
	attained            float64 // share of the window's requests answered within the SLO
	ok, failed, dropped int
	topError            string        // the most frequent failure's error ("" when none failed)
	cpuPerRequest       time.Duration // the gateways' CPU over the window, per request
	switchesPerRequest  float64       // the gateways' context switches over the window, per request
	load                float64       // the machine's 1-minute load average at the end
	// The NATS messages (batches) and bytes all replicas published over
	// the window, and the messages they received, per request.
	syncMsgsPerRequest, syncBytesPerRequest, syncRecvPerRequest float64
	// lag is the mean sync lag over the window: a peer's batch published
	// to applied here (tlgate_sync_lag_seconds), across the replicas.
	lag time.Duration
}

// openKey groups the repeats of one configuration.
type openKey struct {
	workload loadgen.Kind
	fraction float64
	replicas int
	sync     bool
	policy   string
}

func (r openRun) key() openKey {
	return openKey{r.workload, r.fraction, r.replicas, r.sync, r.policy}
}

// goodputOf is DistServe's goodput of one run: the requests answered with
// a time to first token within slo, per second of the window. Failed and
// dropped requests count against the attainment (the share of all the
// window's requests that met the SLO).
func goodputOf(res *loadgen.Result, slo time.Duration) (goodput, attained float64) {
	within := loadgen.WithinSLO(res.TTFT, slo)
	if res.Elapsed > 0 {
		goodput = float64(within) / res.Elapsed.Seconds()
	}
	if all := res.OK + res.Failed + res.Dropped; all > 0 {
		attained = float64(within) / float64(all)
	}
	return goodput, attained
}

// capacityLoad returns the closed-loop users of a capacity run, enough to
// keep every slot busy (OpenCapacityUsers, when set), and the sessions
// they draw from.
func capacityLoad(c Config, kind loadgen.Kind, seed uint64) (int, []loadgen.Session, error) {
	users := c.OpenCapacityUsers
	if users < 1 {
		users = 4 * c.Engines * c.MaxRunning
	}
	// Enough sessions that the users never run out of them: no request
	// is answered faster than its max_tokens of decode.
	rate := float64(users) * 20
	if floor := time.Duration(c.OpenMaxTokens) * c.OpenDecode; floor > 0 {
		rate = max(rate, float64(users)/floor.Seconds())
	}
	sessions, err := openSessions(c, kind, rate, seed)
	return users, sessions, err
}

// openSessions builds the sessions of one workload at rate: enough
// conversations (or questions) to start at that rate for the whole run.
func openSessions(c Config, kind loadgen.Kind, rate float64, seed uint64) ([]loadgen.Session, error) {
	per := sessionTurns(c, kind)
	n := int(math.Ceil(rate/float64(per)*c.OpenDuration.Seconds()*1.5)) + 16
	w := workloadConfig(c, kind, c.SystemPrompts, seed)
	w.StreamFraction = 1 // every request has a time to first token
	w.MaxTokens = c.OpenMaxTokens
	switch kind {
	case loadgen.MultiTurn:
		w.Conversations, w.Requests = n, n*per
	default:
		w.Requests = n
	}
	built, err := loadgen.Build(w)
	if err != nil {
		return nil, err
	}
	return loadgen.SessionsOf(built), nil
}

// openEngines are the engines of an open-loop run: the routing runs',
// with the open loop's decode time per token on the flat model.
func openEngines(c Config, kind loadgen.Kind) []enginesim.Config {
	out := routingEngines(c, kind)
	for i := range out {
		timeEngine(c, &out[i], c.OpenDecode)
	}
	return out
}

// sessionTurns is the requests of one session of the workload.
func sessionTurns(c Config, kind loadgen.Kind) int {
	if kind == loadgen.MultiTurn {
		return c.OpenTurns
	}
	return 1
}

// loadAverage is the machine's 1-minute load average (0 if unknown).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// openOpts are how openOne drives a run: open loop at sessionRate
// sessions per second, or closed with users.
type openOpts struct {
	sessionRate float64
	users       int
	seed        uint64
	// engines replaces openEngines' when set.
	engines []enginesim.Config
	// observe sees every recorded request (loadgen.Sessions.Observe).
	observe func(at, ttft time.Duration, err error)
	// during, when set, runs beside the load, from its start.
	during func(ctx context.Context, f *replicaFleet)
	// mirror, when set, answers for replicas beyond the fleet's own
	// (syncshare.go): its peers are entries too, and the per-request
	// figures count only the requests sent to the fleet's replicas.
	mirror *mirrorTransport
}

// openOne runs the sessions through a fresh fleet of spec's replicas.
func openOne(ctx context.Context, c Config, kind loadgen.Kind, spec replicaSpec, sessions []loadgen.Session, o openOpts) (openRun, error) {
	engines := o.engines
	if engines == nil {
		engines = openEngines(c, kind)
	}
	f, err := startReplicas(ctx, spec, engines)
	if err != nil {
		return openRun{}, err
	}
	defer f.close()
	client := loadgen.NewClient(512)
	defer client.CloseIdleConnections()
	if o.mirror != nil {
		o.mirror.next, client.Transport = client.Transport, o.mirror
	}
	run := loadgen.Sessions{Rate: o.sessionRate, Users: o.users, Duration: c.OpenDuration, Warmup: c.OpenWarmup,
		Think: c.Think, Sessions: sessions, Seed: o.seed, Observe: o.observe}
	// The engines' and the gateways' counters are read when the warmup
	// ends and when the run does.
	type mark struct {
		stats            []uint64
		cpu              time.Duration
		switches         int64
		own              int64 // requests sent to the fleet's replicas (with a mirror)
		syncMsgs, syncBy float64
		syncRecv         float64
		matched, prompt  float64
		lagSum, lagN     float64
	}
	read := func() (m mark) {
		for _, s := range f.stats() {
			m.stats = append(m.stats, s.PrefixHits, s.PrefixQueries)
		}
		m.cpu, _ = f.cpu()
		m.switches, _ = f.switches()
		if o.mirror != nil {
			m.own = o.mirror.own.Load()
		}
		for _, u := range f.urls {
			if b, err := fetch(ctx, u+"/metrics"); err == nil {
				m.syncMsgs += metricSum(b, "tlgate_sync_messages_sent_total", `kind="batch"`)
				m.syncRecv += metricSum(b, "tlgate_sync_messages_received_total", `kind="batch"`)
				m.syncBy += metricSum(b, "tlgate_sync_sent_bytes_total", "")
				m.matched += metricSum(b, "tlgate_cache_aware_matched_tokens_total", "")
				m.prompt += metricSum(b, "tlgate_cache_aware_prompt_tokens_total", "")
				m.lagSum += metricSum(b, "tlgate_sync_lag_seconds_sum", "")
				m.lagN += metricSum(b, "tlgate_sync_lag_seconds_count", "")
			}
		}
		return m
	}
	warm := make(chan mark, 1)
	timer := time.AfterFunc(c.OpenWarmup, func() { warm <- read() })
	duringDone := make(chan struct{})
	dctx, stopDuring := context.WithCancel(ctx)
	if o.during != nil {
		go func() { defer close(duringDone); o.during(dctx, f) }()
	} else {
		close(duringDone)
	}
	entries := f.urls
	if c.OpenOneEntry {
		entries = entries[:1]
	}
	if o.mirror != nil {
		entries = append(slices.Clone(entries), o.mirror.urls()...)
	}
	res := loadgen.RunSessions(ctx, client, loadgen.Random(entries, o.seed), run)
	stopDuring()
	<-duringDone
	warmedUp := !timer.Stop() // the warmup's reading began, and may still be under way
	if err := ctx.Err(); err != nil {
		return openRun{}, err
	}
	if !warmedUp {
		return openRun{}, fmt.Errorf("the run ended before its warmup of %v", c.OpenWarmup)
	}
	before := <-warm
	after := read()
	if res.OK == 0 {
		return openRun{}, fmt.Errorf("no request succeeded (%d failed: %s)", res.Failed, res.FirstError())
	}
	r := openRun{workload: kind, replicas: spec.replicas, sync: spec.syncURL != "", policy: spec.policy,
		ttft: loadgen.Summarize(res.TTFT), e2e: loadgen.Summarize(res.Latency),
		ok: res.OK, failed: res.Failed, dropped: res.Dropped, topError: res.FirstError(), load: loadAverage()}
	var hits, queries uint64
	for i := 0; i < len(after.stats); i += 2 {
		hits += after.stats[i] - before.stats[i]
		queries += after.stats[i+1] - before.stats[i+1]
	}
	if queries > 0 {
		r.hitRate = float64(hits) / float64(queries)
	}
	if p := after.prompt - before.prompt; p > 0 {
		r.predicted = (after.matched - before.matched) / p
	}
	if n := after.lagN - before.lagN; n > 0 {
		r.lag = time.Duration((after.lagSum - before.lagSum) / n * float64(time.Second))
	}
	n := res.OK + res.Failed
	if o.mirror != nil {
		n = int(after.own - before.own)
	}
	if n > 0 {
		r.cpuPerRequest = (after.cpu - before.cpu) / time.Duration(n)
		r.switchesPerRequest = float64(after.switches-before.switches) / float64(n)
		r.syncMsgsPerRequest = (after.syncMsgs - before.syncMsgs) / float64(n)
		r.syncRecvPerRequest = (after.syncRecv - before.syncRecv) / float64(n)
		r.syncBytesPerRequest = (after.syncBy - before.syncBy) / float64(n)
	}
	r.goodput, r.attained = goodputOf(res, c.OpenSLO)
	return r, nil
}

// metricSum sums the samples of the named series in a Prometheus text
// exposition whose line contains filter (every sample when it is "").
func metricSum(exposition []byte, name, filter string) float64 {
	var sum float64
	for _, line := range strings.Split(string(exposition), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || rest[0] != '{' && rest[0] != ' ' || !strings.Contains(rest, filter) {
			continue
		}
		fields := strings.Fields(rest)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// openLoopExperiment measures least_outstanding's single-replica capacity
// on each workload, then sweeps Poisson arrivals from OpenFractions of it
// through 1, 2 and 3 replicas with sync off and on, under each policy.
func openLoopExperiment(ctx context.Context, c Config, bins binaries, logOut io.Writer) (section, []plotFile, error) {
	bin := bins.gateway
	var (
		nats *natsServer
		err  error
	)
	if slices.Contains(c.OpenSync, true) {
		if nats, err = startNATS(ctx, bins.nats); err != nil {
			return section{}, nil, fmt.Errorf("sync on: %w", err)
		}
		defer nats.close()
	}
	spec := fleetSpec(c, bin, nats)
	capacity := map[loadgen.Kind]float64{}
	var capRuns []openRun
	var runs []openRun
	for wi, kind := range c.OpenWorkloads {
		// Capacity: closed-loop users enough to keep every slot busy.
		seed := c.Seed + uint64(wi)
		users, sessions, err := capacityLoad(c, kind, seed)
		if err != nil {
			return section{}, nil, err
		}
		cr, err := openOne(ctx, c, kind, spec(1, false, config.PolicyLeastOutstanding), sessions, openOpts{users: users, seed: seed})
		if err != nil {
			return section{}, nil, fmt.Errorf("%s capacity: %w", kind, err)
		}
		capacity[kind] = float64(cr.ok) / (c.OpenDuration - c.OpenWarmup).Seconds()
		capRuns = append(capRuns, cr)
		fmt.Fprintf(logOut, "tlbench:   %-10s least_outstanding capacity through 1 replica: %.1f req/s (%d users)\n", kind, capacity[kind], users)
	}
	for rep := range c.OpenRepeats {
		for wi, kind := range c.OpenWorkloads {
			for _, step := range sweepSteps(c) {
				frac := step.fraction
				rate := frac * capacity[kind]
				seed := c.Seed + uint64(1000*(rep+1)+wi)
				sessions, err := openSessions(c, kind, rate, seed)
				if err != nil {
					return section{}, nil, err
				}
				for _, n := range step.replicas {
					for _, sync := range c.OpenSync {
						if sync && n == 1 {
							continue // one replica has no peer: sync on is sync off
						}
						for _, p := range c.OpenPolicies {
							r, err := openOne(ctx, c, kind, spec(n, sync, p), sessions, openOpts{sessionRate: rate / float64(sessionTurns(c, kind)), seed: seed})
							if err != nil {
								return section{}, nil, fmt.Errorf("%s at %.0f%% through %d replicas, sync %s, %s: %w", kind, 100*frac, n, onOff(sync), p, err)
							}
							r.fraction, r.rate, r.repeat = frac, rate, rep
							logOpen(logOut, r)
							runs = append(runs, r)
						}
					}
				}
			}
		}
	}
	sec := openSection(c, capacity, capRuns, runs)
	if nats == nil || !slices.Contains(c.OpenReplicas, 3) {
		return sec, nil, nil
	}
	for wi, kind := range c.OpenWorkloads {
		rate := drillFraction * capacity[kind]
		fmt.Fprintf(logOut, "tlbench:   NATS kill drill, %s at %.1f req/s\n", kind, rate)
		d, err := natsDrill(ctx, c, kind, spec(3, true, config.PolicyCacheAware), nats, rate, c.Seed+uint64(9000+wi))
		if err != nil {
			return section{}, nil, fmt.Errorf("%s NATS drill: %w", kind, err)
		}
		agree := "not within the run"
		if d.agree >= 0 {
			agree = d.agree.Round(time.Millisecond).String()
		}
		sec.tables = append(sec.tables, drillTable(d))
		sec.notes = append(sec.notes, fmt.Sprintf("NATS kill drill, %s at %.0f%% of capacity (%.1f req/s), 3 replicas, cache_aware, sync on: NATS stopped at %v and started again at %v; "+
			"%d requests failed; the replicas agreed again (each connected, with a load report from each peer applied) %s after NATS was back (target: within 2 s: %s).",
			kind, 100*drillFraction, rate, c.OpenDuration, 2*c.OpenDuration, d.failed, agree, metOrMissed(d.agree >= 0 && d.agree <= 2*time.Second)))
	}
	tables, notes, err := syncCostReport(ctx, c, spec, logOut)
	if err != nil {
		return section{}, nil, err
	}
	sec.tables, sec.notes = append(sec.tables, tables...), append(sec.notes, notes...)
	return sec, nil, nil
}

// fleetSpec returns the replica fleets' specs: the gateway binary bin,
// synced over nats when asked.
func fleetSpec(c Config, bin string, nats *natsServer) func(replicas int, sync bool, policy string) replicaSpec {
	return func(replicas int, sync bool, policy string) replicaSpec {
		s := replicaSpec{bin: bin, replicas: replicas, policy: policy, heartbeat: c.Heartbeat}
		if sync {
			s.syncURL, s.syncToken, s.syncBatch, s.syncHold = nats.url(), nats.token, c.OpenSyncBatch, c.OpenReleaseHold
		}
		return s
	}
}

// sweepStep is one rate of the sweep and the replica counts run at it.
type sweepStep struct {
	fraction float64
	replicas []int
}

// sweepSteps are the sweep's rates: OpenFractions through every replica
// count, then OpenGoodputFractions through the most replicas only.
func sweepSteps(c Config) []sweepStep {
	var out []sweepStep
	for _, f := range c.OpenFractions {
		out = append(out, sweepStep{f, c.OpenReplicas})
	}
	if len(c.OpenReplicas) > 0 {
		most := []int{slices.Max(c.OpenReplicas)}
		for _, f := range c.OpenGoodputFractions {
			out = append(out, sweepStep{f, most})
		}
	}
	return out
}

// drillFraction is the share of capacity the NATS kill drill runs at.
const drillFraction = 0.7

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func logOpen(w io.Writer, r openRun) {
	fmt.Fprintf(w, "tlbench:   %-10s %3.0f%% %6.1f req/s %d replica(s) sync %-3s %-17s hit %5.1f%% (index %5.1f%%) ttft p50 %6s p99 %6s ms goodput %6.1f/s failed %d not sent %d lag %v load %.1f\n",
		r.workload, 100*r.fraction, r.rate, r.replicas, onOff(r.sync), r.policy, 100*r.hitRate, 100*r.predicted, ms(r.ttft.P50), ms(r.ttft.P99), r.goodput, r.failed, r.dropped, r.lag.Round(10*time.Microsecond), r.load)
	if r.topError != "" {
		fmt.Fprintf(w, "tlbench:     most frequent failure: %s\n", r.topError)
	}
}

// spread is the median of vs and their range.
type spread struct{ med, lo, hi float64 }

func spreadOf(vs []float64) spread {
	if len(vs) == 0 {
		return spread{}
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{med, s[0], s[len(s)-1]}
}

// format prints the median and, over more than one run, the range.
func (s spread) format(f func(float64) string, n int) string {
	if n < 2 {
		return f(s.med)
	}
	return f(s.med) + " (" + f(s.lo) + "–" + f(s.hi) + ")"
}

// openGroup is the repeats of one configuration, summarised.
type openGroup struct {
	openKey
	rate                            float64
	n                               int
	p50, p99, e2e99, hit, good, att spread
	cpu                             spread // µs per request
	failed                          int
	loadLo, loadHi                  float64
}

// groupOpen summarises the runs per configuration, in the runs' order.
func groupOpen(runs []openRun) []openGroup {
	var keys []openKey
	by := map[openKey][]openRun{}
	for _, r := range runs {
		k := r.key()
		if _, ok := by[k]; !ok {
			keys = append(keys, k)
		}
		by[k] = append(by[k], r)
	}
	out := make([]openGroup, 0, len(keys))
	for _, k := range keys {
		rs := by[k]
		g := openGroup{openKey: k, n: len(rs), loadLo: math.Inf(1)}
		var p50, p99, e2e, hit, good, att, cpu, rate []float64
		for _, r := range rs {
			p50 = append(p50, msf(r.ttft.P50))
			p99 = append(p99, msf(r.ttft.P99))
			e2e = append(e2e, msf(r.e2e.P99))
			hit = append(hit, r.hitRate)
			good = append(good, r.goodput)
			att = append(att, r.attained)
			cpu = append(cpu, float64(r.cpuPerRequest)/float64(time.Microsecond))
			rate = append(rate, r.rate)
			g.failed += r.failed + r.dropped
			g.loadLo, g.loadHi = math.Min(g.loadLo, r.load), math.Max(g.loadHi, r.load)
		}
		g.p50, g.p99, g.e2e99, g.hit, g.good, g.att, g.cpu = spreadOf(p50), spreadOf(p99), spreadOf(e2e), spreadOf(hit), spreadOf(good), spreadOf(att), spreadOf(cpu)
		g.rate = spreadOf(rate).med
		out = append(out, g)
	}
	return out
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// openTarget is one acceptance check over the groups.
type openTarget struct {
	// check is targetCALatency, targetLOP99 or targetGoodput, on workload
	// with sync on or off.
	check    string
	workload loadgen.Kind
	sync     bool

	what, result string
	met          bool
	measured     bool
}

// The open-loop targets.
const (
	targetCALatency = "cache_aware latency and hit rate"
	targetLOP99     = "least_outstanding p99"
	targetGoodput   = "goodput"
)

// openTargets checks the open-loop acceptance targets on the groups (3
// replicas with sync on against 1 replica, at every rate up to 90% of
// capacity; cache_aware's goodput against least_outstanding's).
func openTargets(c Config, groups []openGroup) []openTarget {
	find := func(kind loadgen.Kind, frac float64, replicas int, sync bool, p string) (openGroup, bool) {
		for _, g := range groups {
			if g.workload == kind && g.fraction == frac && g.replicas == replicas && g.sync == sync && g.policy == p {
				return g, true
			}
		}
		return openGroup{}, false
	}
	var out []openTarget
	for _, sync := range []bool{true, false} {
		for _, kind := range c.OpenWorkloads {
			ca := openTarget{check: targetCALatency, workload: kind, sync: sync, what: fmt.Sprintf("%s, sync %s: cache_aware at 3 replicas, TTFT p50 and p99 within 15%% of 1 replica's, hit rate within 3 points, every rate ≤ 90%%", kind, onOff(sync))}
			lo := openTarget{check: targetLOP99, workload: kind, sync: sync, what: fmt.Sprintf("%s, sync %s: least_outstanding at 3 replicas, TTFT p99 within 20%% of 1 replica's, every rate ≤ 90%%", kind, onOff(sync))}
			ca.met, lo.met = true, true
			var caRes, loRes []string
			for _, frac := range c.OpenFractions {
				if frac > 0.9+1e-9 {
					continue
				}
				if one, ok := find(kind, frac, 1, false, config.PolicyCacheAware); ok {
					if three, ok := find(kind, frac, 3, sync, config.PolicyCacheAware); ok {
						ca.measured = true
						p50, p99, hit := three.p50.med/one.p50.med, three.p99.med/one.p99.med, 100*(three.hit.med-one.hit.med)
						pass := p50 <= 1.15 && p99 <= 1.15 && hit >= -3
						ca.met = ca.met && pass
						caRes = append(caRes, fmt.Sprintf("%.0f%%: p50 %.2f×, p99 %.2f×, hit %+.1f pt%s", 100*frac, p50, p99, hit, missMark(pass)))
					}
				}
				if one, ok := find(kind, frac, 1, false, config.PolicyLeastOutstanding); ok {
					if three, ok := find(kind, frac, 3, sync, config.PolicyLeastOutstanding); ok {
						lo.measured = true
						p99 := three.p99.med / one.p99.med
						pass := p99 <= 1.2
						lo.met = lo.met && pass
						loRes = append(loRes, fmt.Sprintf("%.0f%%: p99 %.2f×%s", 100*frac, p99, missMark(pass)))
					}
				}
			}
			ca.result, lo.result = strings.Join(caRes, "; "), strings.Join(loRes, "; ")
			// Goodput (DistServe's): the highest rate of the sweep each policy
			// holds at 3 replicas, with at least OpenAttainment of its
			// requests within the SLO.
			gp := openTarget{check: targetGoodput, workload: kind, sync: sync, what: fmt.Sprintf("%s, sync %s: cache_aware's goodput at 3 replicas ≥ 1.3× least_outstanding's (the highest rate of the sweep with ≥ %.0f%% of requests within the SLO)", kind, onOff(sync), 100*c.OpenAttainment)}
			held := func(p string) (rate, frac float64, any bool) {
				for _, step := range sweepSteps(c) {
					if g, ok := find(kind, step.fraction, 3, sync, p); ok {
						any = true
						if g.att.med >= c.OpenAttainment && g.rate > rate {
							rate, frac = g.rate, step.fraction
						}
					}
				}
				return rate, frac, any
			}
			caG, caF, ok1 := held(config.PolicyCacheAware)
			loG, loF, ok2 := held(config.PolicyLeastOutstanding)
			if ok1 && ok2 {
				gp.measured = true
				gp.met = caG >= 1.3*loG
				gp.result = fmt.Sprintf("%s against %s: %.2f×", heldRate(caG, caF), heldRate(loG, loF), fratio(caG, loG))
				if maxF := slices.Max(append(slices.Clone(c.OpenFractions), c.OpenGoodputFractions...)); caF >= maxF {
					gp.result += " (cache_aware held the sweep's highest rate: at least that)"
				}
			}
			out = append(out, ca, lo, gp)
		}
	}
	return out
}

// heldRate is a held rate as the targets table writes it.
func heldRate(rate, frac float64) string {
	if rate == 0 {
		return "no rate of the sweep"
	}
	return fmt.Sprintf("%.0f%% (%.1f req/s)", 100*frac, rate)
}

func missMark(pass bool) string {
	if pass {
		return ""
	}
	return " (missed)"
}

func openSection(c Config, capacity map[loadgen.Kind]float64, capRuns []openRun, runs []openRun) section {
	ct := &table{header: []string{"workload", "least_outstanding capacity, 1 replica (req/s)", "TTFT p50 / p99 ms at capacity", "hit rate at capacity"}}
	for _, r := range capRuns {
		ct.add(string(r.workload), f1(capacity[r.workload]), ms(r.ttft.P50)+" / "+ms(r.ttft.P99), pct(r.hitRate))
	}
	groups := groupOpen(runs)
	t := &table{header: []string{"workload", "rate", "replicas", "sync", "policy", "TTFT p50 ms", "TTFT p99 ms", "latency p99 ms",
		"hit rate", "goodput req/s", "within SLO", "failed", "gateway CPU µs/req", "load avg"}}
	pctf := func(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }
	loLoad, hiLoad := math.Inf(1), 0.0
	for _, g := range groups {
		t.add(string(g.workload), fmt.Sprintf("%.0f%% (%.0f/s)", 100*g.fraction, g.rate), strconv.Itoa(g.replicas), onOff(g.sync), g.policy,
			g.p50.format(f1, g.n), g.p99.format(f1, g.n), g.e2e99.format(f1, g.n), g.hit.format(pctf, g.n),
			g.good.format(f1, g.n), g.att.format(pctf, g.n), strconv.Itoa(g.failed), g.cpu.format(func(v float64) string { return fmt.Sprintf("%.0f", v) }, g.n),
			fmt.Sprintf("%.1f–%.1f", g.loadLo, g.loadHi))
		loLoad, hiLoad = math.Min(loLoad, g.loadLo), math.Max(hiLoad, g.loadHi)
	}
	tt := &table{header: []string{"target", "measured", "verdict"}}
	for _, x := range openTargets(c, groups) {
		verdict := "not measured"
		switch {
		case x.measured && x.met:
			verdict = "met"
		case x.measured:
			verdict = "MISSED"
		}
		tt.add(x.what, x.result, verdict)
	}
	past := ""
	if len(c.OpenGoodputFractions) > 0 {
		past = fmt.Sprintf("; the rates past the last of the sweep (%s) run through %d replicas only, to find it", percents(c.OpenGoodputFractions), mostReplicas(c))
	}
	lead := fmt.Sprintf("Open loop: sessions arrive as a Poisson process and every request goes to one of the gateway replicas drawn at random "+
		"(a load balancer spreading requests), each replica the gateway binary in a process of its own, the %d in-process reference engines "+
		"(%s; %d running sequences, %d KV blocks for multi-turn and %d for rag) heartbeating to all of them every %v. "+
		"With sync on, the replicas share one nats-server, also a process of its own. "+
		"multi-turn: each new conversation sends %d turns, every turn a think time (%v on average, evenly from half to one and a half times) after the previous answer, "+
		"its prompt the previous prompt, the answer (%d bytes) and a new user message (%d bytes) after a %d-byte system prompt; rag: each arrival is one question over one of %d documents. "+
		"Every request is streamed (max_tokens %d). The rates are shares of least_outstanding's capacity through one replica on the same workload, "+
		"measured first in the same run with %s closed-loop users. Each run starts fresh engines and gateways, sends for %v and records the requests sent after the first %v. "+
		"The goodput column: requests per second answered with a TTFT within %v; within SLO is their share of every request of the window (failed ones count against it). "+
		"A policy's goodput (DistServe's) is the highest rate of the sweep it holds with at least %.0f%% of its requests within the SLO%s. "+
		"Hit rate: the engines' prefix-cache hits over queries, in tokens. Gateway CPU: all replicas' user+system time over the window per request. "+
		"Figures are the median of %d runs with their range; the machine's 1-minute load average during the runs was %.1f–%.1f (2 cores, shared).",
		c.Engines, engineModel(c, c.OpenDecode), c.MaxRunning, c.KVBlocksTurns, c.KVBlocksLong, c.Heartbeat,
		c.OpenTurns, c.Think, c.AnswerBytes, c.TurnUserBytes, c.TurnSystemBytes, c.Documents, c.OpenMaxTokens, capacityUsers(c), c.OpenDuration, c.OpenWarmup, c.OpenSLO,
		100*c.OpenAttainment, past, c.OpenRepeats, loLoad, hiLoad)
	var notes []string
	if c.OpenOneEntry {
		notes = append(notes, "Every request went to the first replica (-open-one-entry); the other replicas only heartbeated and synced. This is a control: it shows what running several gateway processes costs, apart from routing on partial views.")
	}
	if !slices.Contains(c.OpenSync, true) {
		notes = append(notes, "Sync was off in every run (-open-sync off): the sync-on rows and targets are not measured.")
	}
	return section{title: "Open loop: replicas and fleet sync", lead: lead, tables: []*table{ct, t, tt}, notes: notes}
}

// percents writes fractions as "130%, 160%" ("none" for none).
func percents(fs []float64) string {
	if len(fs) == 0 {
		return "none"
	}
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = fmt.Sprintf("%.0f%%", 100*f)
	}
	return strings.Join(out, ", ")
}

func mostReplicas(c Config) int {
	if len(c.OpenReplicas) == 0 {
		return 0
	}
	return slices.Max(c.OpenReplicas)
}

func capacityUsers(c Config) string {
	if c.OpenCapacityUsers > 0 {
		return strconv.Itoa(c.OpenCapacityUsers)
	}
	return strconv.Itoa(4 * c.Engines * c.MaxRunning)
}
