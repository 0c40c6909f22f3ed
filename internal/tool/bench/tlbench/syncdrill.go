package tlbench

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
)

// drillPhase is one stretch of the NATS kill drill.
type drillPhase struct {
	name        string
	from, to    time.Duration // from the run's start
	ttft        []time.Duration
	ok, failed  int
	hits, total uint64 // the engines' prefix-cache tokens over the phase
}

// drillResult is what the NATS kill drill measured.
type drillResult struct {
	kind   loadgen.Kind
	rate   float64
	phases []*drillPhase
	// agree is the time from NATS being back to every replica connected
	// again with a load report from each peer applied; -1 if not within
	// the run.
	agree  time.Duration
	failed int
}

// phaseOf returns the phase holding at (nil before the first).
func phaseOf(phases []*drillPhase, at time.Duration) *drillPhase {
	for _, p := range phases {
		if at >= p.from && at < p.to {
			return p
		}
	}
	return nil
}

// syncAgreed reports whether every replica's metrics say it is connected
// (tlgate_sync_up 1) and has applied at least peers load reports more
// than base holds (its count when NATS came back).
func syncAgreed(expositions [][]byte, base []float64, peers int) bool {
	for i, b := range expositions {
		if metricSum(b, "tlgate_sync_up", "") != 1 {
			return false
		}
		if metricSum(b, "tlgate_sync_messages_received_total", `kind="load"`)-base[i] < float64(peers) {
			return false
		}
	}
	return len(expositions) > 0
}

// natsDrill runs kind at rate through 3 replicas with sync on under
// cache_aware, stops the NATS server for the middle third of the run and
// starts it again.
func natsDrill(ctx context.Context, c Config, kind loadgen.Kind, spec replicaSpec, nats *natsServer, rate float64, seed uint64) (drillResult, error) {
	third := c.OpenDuration
	dc := c
	dc.OpenDuration = 3 * third
	sessions, err := openSessions(dc, kind, rate, seed)
	if err != nil {
		return drillResult{}, err
	}
	d := drillResult{kind: kind, rate: rate, agree: -1, phases: []*drillPhase{
		{name: "before", from: c.OpenWarmup, to: third},
		{name: "NATS down", from: third, to: 2 * third},
		{name: "NATS back", from: 2 * third, to: 3 * third},
	}}
	var mu sync.Mutex
	observe := func(at, ttft time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		p := phaseOf(d.phases, at)
		if p == nil {
			return
		}
		if err != nil {
			p.failed++
			return
		}
		p.ok++
		p.ttft = append(p.ttft, ttft)
	}
	var drillErr error
	during := func(ctx context.Context, f *replicaFleet) {
		start := time.Now()
		engineMark := func() (hits, total uint64) {
			for _, s := range f.stats() {
				hits, total = hits+s.PrefixHits, total+s.PrefixQueries
			}
			return hits, total
		}
		var marks [4][2]uint64
		wait := func(at time.Duration) bool { return sleepFor(ctx, time.Until(start.Add(at))) }
		if !wait(c.OpenWarmup) {
			return
		}
		marks[0][0], marks[0][1] = engineMark()
		if !wait(third) {
			return
		}
		marks[1][0], marks[1][1] = engineMark()
		nats.stop()
		if !wait(2 * third) {
			return
		}
		marks[2][0], marks[2][1] = engineMark()
		base := make([]float64, len(f.urls))
		for i, u := range f.urls {
			if b, err := fetch(ctx, u+"/metrics"); err == nil {
				base[i] = metricSum(b, "tlgate_sync_messages_received_total", `kind="load"`)
			}
		}
		if err := nats.start(ctx); err != nil {
			drillErr = err
			return
		}
		back := time.Now()
		for time.Since(start) < 3*third {
			var exps [][]byte
			for _, u := range f.urls {
				if b, err := fetch(ctx, u+"/metrics"); err == nil {
					exps = append(exps, b)
				}
			}
			if len(exps) == len(f.urls) && syncAgreed(exps, base, len(f.urls)-1) {
				d.agree = time.Since(back)
				break
			}
			if !sleepFor(ctx, 20*time.Millisecond) {
				break
			}
		}
		_ = wait(3 * third) // or the run ended: read the engines now
		marks[3][0], marks[3][1] = engineMark()
		for i, p := range d.phases {
			p.hits, p.total = marks[i+1][0]-marks[i][0], marks[i+1][1]-marks[i][1]
		}
	}
	r, err := openOne(ctx, dc, kind, spec, sessions, openOpts{sessionRate: rate / float64(sessionTurns(c, kind)), seed: seed, observe: observe, during: during})
	if err != nil {
		return drillResult{}, err
	}
	if drillErr != nil {
		return drillResult{}, fmt.Errorf("restart NATS: %w", drillErr)
	}
	d.failed = r.failed + r.dropped
	return d, nil
}

// sleepFor waits d; false if ctx ended first.
func sleepFor(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func drillTable(d drillResult) *table {
	t := &table{header: []string{"phase", "requests", "failed", "TTFT p50 ms", "TTFT p99 ms", "hit rate"}}
	for _, p := range d.phases {
		s := loadgen.Summarize(p.ttft)
		hit := 0.0
		if p.total > 0 {
			hit = float64(p.hits) / float64(p.total)
		}
		t.add(fmt.Sprintf("%s (%.0f–%.0f s)", p.name, p.from.Seconds(), p.to.Seconds()), strconv.Itoa(p.ok+p.failed), strconv.Itoa(p.failed),
			ms(s.P50), ms(s.P99), pct(hit))
	}
	return t
}

// costRun is one run of the sync cost measurement.
type costRun struct {
	sync bool
	r    openRun
	// profile is the gateway's CPU profile over the run (syncShare with
	// Config.ShareProfile), else nil.
	profile *cpuProfile
}

// syncCost measures the gateways' CPU per request at c.Rate requests per
// second through 3 replicas (cache_aware, rag questions on engines that
// answer at once), sync off and on in turn, OpenRepeats times each.
func syncCost(ctx context.Context, c Config, spec func(replicas int, sync bool, policy string) replicaSpec, logOut io.Writer) ([]costRun, error) {
	engines := costEngines(c)
	return costRuns(c, logOut, func(sessions []loadgen.Session, seed uint64, on bool) (openRun, *cpuProfile, error) {
		r, err := openOne(ctx, c, loadgen.RAG, spec(3, on, config.PolicyCacheAware), sessions, openOpts{sessionRate: c.Rate, seed: seed, engines: engines})
		if err != nil {
			return openRun{}, nil, fmt.Errorf("sync cost, sync %s: %w", onOff(on), err)
		}
		fmt.Fprintf(logOut, "tlbench:   cost at %.0f req/s, 3 replicas, sync %-3s: %v CPU per request, %.2f messages and %.0f bytes per request, ttft p50 %s p99 %s ms, failed %d, not sent (load generator at its in-flight bound) %d, load %.1f\n",
			c.Rate, onOff(on), r.cpuPerRequest, r.syncMsgsPerRequest, r.syncBytesPerRequest, ms(r.ttft.P50), ms(r.ttft.P99), r.failed, r.dropped, r.load)
		return r, nil, nil
	})
}

// costRuns runs measure on rag sessions at c.Rate, sync off then on, with
// new sessions for each of OpenRepeats repeats (the same ones for every
// measurement of a repeat's seed), logging each run's most frequent
// failure.
func costRuns(c Config, logOut io.Writer, measure func(sessions []loadgen.Session, seed uint64, on bool) (openRun, *cpuProfile, error)) ([]costRun, error) {
	var out []costRun
	for rep := range c.OpenRepeats {
		seed := c.Seed + uint64(5000+rep)
		sessions, err := openSessions(c, loadgen.RAG, c.Rate, seed)
		if err != nil {
			return nil, err
		}
		for _, on := range []bool{false, true} {
			r, p, err := measure(sessions, seed, on)
			if err != nil {
				return nil, err
			}
			r.rate = c.Rate
			if r.topError != "" {
				fmt.Fprintf(logOut, "tlbench:     most frequent failure: %s\n", r.topError)
			}
			out = append(out, costRun{sync: on, r: r, profile: p})
		}
	}
	return out, nil
}

// costEngines are the sync cost measurements' engines: they answer at
// once, so that the gateways' work is all there is to measure.
func costEngines(c Config) []enginesim.Config {
	engines := make([]enginesim.Config, c.Engines)
	for i := range engines {
		engines[i] = enginesim.Config{ID: fmt.Sprintf("engine-%d", i), Model: c.Model, KVBlocks: c.KVBlocksLong, MaxRunning: 256, HeartbeatInterval: c.Heartbeat}
	}
	return engines
}

// costTable tabulates sync cost runs, off then on, with the verdict on
// the CPU target. share says the runs are syncShare's: their TTFTs
// include the mirror peers' instant answers and are left out.
func costTable(runs []costRun, share bool) (*table, string) {
	header := []string{"sync", "runs", "gateway CPU µs/req", "context switches/req", "NATS messages sent/req", "NATS messages received/req", "NATS bytes sent/req"}
	if !share {
		header = append(header, "TTFT p50 ms", "TTFT p99 ms")
	}
	t := &table{header: append(header, "failed", "not sent", "load avg")}
	var cpu, sws [2]spread
	for i, on := range []bool{false, true} {
		var c, sw, m, recv, b, p50, p99 []float64
		failed, notSent, lo, hi := 0, 0, math.Inf(1), 0.0
		for _, r := range runs {
			if r.sync != on {
				continue
			}
			c = append(c, float64(r.r.cpuPerRequest)/float64(time.Microsecond))
			sw = append(sw, r.r.switchesPerRequest)
			m, recv = append(m, r.r.syncMsgsPerRequest), append(recv, r.r.syncRecvPerRequest)
			b = append(b, r.r.syncBytesPerRequest)
			p50, p99 = append(p50, msf(r.r.ttft.P50)), append(p99, msf(r.r.ttft.P99))
			failed, notSent = failed+r.r.failed, notSent+r.r.dropped
			lo, hi = math.Min(lo, r.r.load), math.Max(hi, r.r.load)
		}
		if len(c) == 0 {
			continue
		}
		cpu[i], sws[i] = spreadOf(c), spreadOf(sw)
		us := func(v float64) string { return fmt.Sprintf("%.0f", v) }
		row := []string{onOff(on), strconv.Itoa(len(c)), cpu[i].format(us, len(c)), sws[i].format(f1, len(c)), spreadOf(m).format(f2, len(c)), spreadOf(recv).format(f2, len(c)), spreadOf(b).format(us, len(c))}
		if !share {
			row = append(row, spreadOf(p50).format(f1, len(c)), spreadOf(p99).format(f1, len(c)))
		}
		t.add(append(row, strconv.Itoa(failed), strconv.Itoa(notSent), fmt.Sprintf("%.1f–%.1f", lo, hi))...)
	}
	verdict := "not measured"
	if cpu[0].med > 0 && cpu[1].med > 0 {
		x := cpu[1].med / cpu[0].med
		verdict = fmt.Sprintf("sync on costs %+.1f%% gateway CPU per request (medians); target ≤ +5%%: %s", 100*(x-1), metOrMissed(x <= 1.05))
		if d := sws[1].med - sws[0].med; d > 0 {
			verdict += fmt.Sprintf(". It adds %.1f context switches per request, %.0f µs of CPU for each", d, (cpu[1].med-cpu[0].med)/d)
		}
	}
	return t, verdict
}

// syncCostReport measures what sync costs at c.Rate, through the whole
// fleet (syncCost) and for one replica's share (syncShare), and returns
// their tables and notes.
func syncCostReport(ctx context.Context, c Config, spec func(replicas int, sync bool, policy string) replicaSpec, logOut io.Writer) ([]*table, []string, error) {
	var secs int // the share's profiles, when taken
	if c.ShareProfile {
		var err error
		if secs, err = profileSeconds(c.OpenDuration - c.OpenWarmup); err != nil {
			return nil, nil, err
		}
	}
	wake, err := wakeCost(ctx, wakeSleeps)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(logOut, "tlbench:   an idle Go process here spends %v of CPU per timer wakeup\n", wake)
	fmt.Fprintf(logOut, "tlbench:   sync cost at %.0f req/s\n", c.Rate)
	cost, err := syncCost(ctx, c, spec, logOut)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(logOut, "tlbench:   one replica's share of the sync cost at %.0f req/s\n", c.Rate)
	share, err := syncShare(ctx, c, spec, secs, logOut)
	if err != nil {
		return nil, nil, err
	}
	ct, verdict := costTable(cost, false)
	st, shareVerdict := costTable(share, true)
	peers := fmt.Sprintf("with sync on, publish through fleet sync's own client what a replica's router would (each pick with its prompt's chunk hashes, the release, their in-flight counts). "+
		"The gateway so serves a third of %.0f req/s and applies the other two thirds' events, as a replica of 3 does", c.Rate)
	if c.SharePeersSilent {
		peers = fmt.Sprintf("publish nothing (-share-peers-silent). The gateway so serves a third of %.0f req/s and publishes its own events, but receives none: the figure prices its sending alone", c.Rate)
	}
	notes := []string{
		fmt.Sprintf("Sync cost, whole fleet (the first of these two tables): rag questions at %.0f req/s (open loop) through 3 replicas under cache_aware, on %d engines that answer at once (max_tokens %d), sync off and on in turn, %d runs each; "+
			"NATS messages and bytes are the batches all replicas published (and received) over the window, per request; not sent: arrivals the load generator skipped at its bound on outstanding requests. %s.", c.Rate, c.Engines, c.OpenMaxTokens, c.OpenRepeats, verdict),
		fmt.Sprintf("Sync cost, one replica's share (the second): the same sessions, each request sent at random to one gateway or to one of %d mirror peers in tlbench's process. The peers stand in for the fleet's other replicas: they answer at once without engines "+
			"and, %s, while the machine runs one gateway instead of three. CPU, messages and bytes are the gateway's, per request it served. %s.", mirrorPeers, peers, shareVerdict),
		fmt.Sprintf("What a wakeup costs here: an idle Go process on this machine spends %.0f µs of CPU each time a timer wakes it (%d sleeps of 1 ms in tlbench's process before these runs). "+
			"Each sync message wakes the goroutines that send or receive it.", float64(wake)/float64(time.Microsecond), wakeSleeps),
	}
	tables := []*table{ct, st}
	if secs > 0 {
		tables = append(tables, profileTable(share))
		kept := ""
		if c.Out != "" {
			kept = " The profiles are kept beside results.md (synccost-share-N-sync-off.pprof and -on.pprof; `go tool pprof` reads them)."
		}
		notes = append(notes, fmt.Sprintf("Where the share's CPU goes (the third table): a CPU profile of the gateway over %d s of each run's recorded window (-share-profile), its samples summed over the runs of each sync setting and split by the functions on their stacks, "+
			"each sample to the first line whose functions it holds: sync's own paths, then the Go runtime's scheduling and background collection, then the rest. µs/req is per request the gateway served while profiled; "+
			"the profiler's own sampling costs alike with sync off and on.%s", secs, kept))
	}
	return tables, notes, nil
}

// syncCostExperiment measures what fleet sync costs (syncCostReport)
// without the open loop's sweep and drills.
func syncCostExperiment(ctx context.Context, c Config, bins binaries, logOut io.Writer) (section, error) {
	nats, err := startNATS(ctx, bins.nats)
	if err != nil {
		return section{}, err
	}
	defer nats.close()
	tables, notes, err := syncCostReport(ctx, c, fleetSpec(c, bins.gateway, nats), logOut)
	if err != nil {
		return section{}, err
	}
	lead := fmt.Sprintf("What fleet sync costs in gateway CPU at %.0f req/s, measured two ways. Each run starts fresh engines and gateways (each gateway the gateway binary in a process of its own, sharing one nats-server), "+
		"sends for %v and records the requests sent after the first %v. Figures are the median of %d runs with their range. "+
		"The engines answer at once (flat timing with no prefill or decode time), so that the gateways' work is all there is to measure.",
		c.Rate, c.OpenDuration, c.OpenWarmup, c.OpenRepeats)
	return section{title: "Fleet sync cost", lead: lead, tables: tables, notes: notes}, nil
}
