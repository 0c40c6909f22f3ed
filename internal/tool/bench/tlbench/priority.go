package tlbench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
)

// The priority experiment: two tenants share one fleet at more than its
// capacity together. The interactive tenant holds multi-turn
// conversations (streamed, a TTFT objective); the batch tenant sends long
// prompts of its own (sheddable, no objective). Each run is one gateway
// process (the real binary) in front of fresh engines, in one of three
// modes: admission control off; on with limits per worker and the fair
// queue alone (every request in one band, no objective: the queue as it
// was before priorities); and priorities on (the interactive key priority
// 10 with its objective, the batch key sheddable, limits per pool).

// Modes of the priority experiment.
const (
	PriorityOff      = "off"
	PriorityFair     = "fair"
	PriorityPriority = "priority"
)

// PriorityModes are the modes a run compares, in order.
var PriorityModes = []string{PriorityOff, PriorityFair, PriorityPriority}

// Tenants of the priority experiment (their API key names).
const (
	tenantChat  = "interactive"
	tenantBatch = "batch"
)

// priorityRun is one tenant pair's run in one mode.
type priorityRun struct {
	mode   string
	repeat int
	chat   tenantResult
	batch  tenantResult
	load   float64 // the machine's 1-minute load average at the end
}

// tenantResult is what one tenant saw over the run's window.
type tenantResult struct {
	rate             float64 // offered requests per second
	ttft             loadgen.Summary
	ok, failed, drop int
	refused          int // answered 429 or 503 by admission control
	within           int // answered with TTFT within the objective
	// served is the requests (of any send time) answered within the
	// recorded window, per second: the tenant's share of the fleet while
	// the load lasts.
	served float64
}

// attainment is the share of the tenant's requests answered within the
// objective (failed, refused and dropped requests miss it).
func (t tenantResult) attainment() float64 {
	if all := t.ok + t.failed + t.drop; all > 0 {
		return float64(t.within) / float64(all)
	}
	return 0
}

// priorityEngines are the fleet of the experiment.
func priorityEngines(c Config) []enginesim.Config {
	out := make([]enginesim.Config, c.PriorityEngines)
	for i := range out {
		out[i] = enginesim.Config{
			ID: fmt.Sprintf("engine-%d", i), Model: c.Model,
			PrefillPerToken: c.Prefill, DecodePerToken: c.OpenDecode,
			KVBlocks: c.PriorityKVBlocks, MaxRunning: c.MaxRunning,
			HeartbeatInterval: c.Heartbeat,
		}
	}
	return out
}

// priorityTOML is the gateway's configuration for mode: the two keys,
// and admission control as the mode has it.
func priorityTOML(c Config, mode string) string {
	var b strings.Builder
	chat, batch := "", ""
	switch mode {
	case PriorityOff:
		b.WriteString("\n[gateway.admission]\nenabled = false\n")
	case PriorityFair:
		b.WriteString("\n[gateway.admission]\nenabled = true\nlimit_scope = \"worker\"\n")
	default:
		b.WriteString("\n[gateway.admission]\nenabled = true\nlimit_scope = \"pool\"\n")
		chat = fmt.Sprintf("priority = 10\nttft_objective_ms = %d\n", c.PriorityObjective.Milliseconds())
		batch = "priority = -1\n"
	}
	for _, k := range []struct{ name, extra string }{{tenantChat, chat}, {tenantBatch, batch}} {
		fmt.Fprintf(&b, "\n[[gateway.api_keys]]\nname = %q\nkey = %q\nscopes = [\"inference\"]\n%s", k.name, "tlbench-"+k.name, k.extra)
	}
	return b.String()
}

// tenantSessions are a tenant's sessions at rate requests per second,
// each request carrying the tenant's key.
func tenantSessions(c Config, tenant string, rate float64, seed uint64) ([]loadgen.Session, error) {
	var ss []loadgen.Session
	if tenant == tenantChat {
		var err error
		cc := c
		cc.OpenMaxTokens = c.PriorityChatTokens
		if ss, err = openSessions(cc, loadgen.MultiTurn, rate, seed); err != nil {
			return nil, err
		}
	} else {
		n := int(rate*c.PriorityDuration.Seconds()*1.5) + 16
		w := workloadConfig(c, loadgen.Distinct, 1, seed)
		w.Requests, w.SystemBytes, w.MaxTokens, w.StreamFraction = n, c.PriorityBatchBytes, c.PriorityBatchTokens, 1
		built, err := loadgen.Build(w)
		if err != nil {
			return nil, err
		}
		ss = loadgen.SessionsOf(built)
	}
	h := http.Header{"Authorization": {"Bearer tlbench-" + tenant}}
	for i := range ss {
		for j := range ss[i].Turns {
			ss[i].Turns[j].Header = h
		}
	}
	return ss, nil
}

// priorityCapacity measures one tenant's capacity alone, in requests per
// second: closed-loop sessions enough to keep every slot busy, through a
// gateway with admission control off.
func priorityCapacity(ctx context.Context, c Config, bin, tenant string, seed uint64) (float64, error) {
	users := 4 * c.PriorityEngines * c.MaxRunning
	sessions, err := tenantSessions(c, tenant, float64(users)*20, seed)
	if err != nil {
		return 0, err
	}
	f, err := startReplicas(ctx, replicaSpec{bin: bin, replicas: 1, policy: config.PolicyCacheAware, heartbeat: c.Heartbeat,
		extra: priorityTOML(c, PriorityOff)}, priorityEngines(c))
	if err != nil {
		return 0, err
	}
	defer f.close()
	client := loadgen.NewClient(512)
	defer client.CloseIdleConnections()
	res := loadgen.RunSessions(ctx, client, loadgen.Fixed(f.urls[0]), loadgen.Sessions{Users: users, Duration: c.PriorityDuration,
		Warmup: c.PriorityWarmup, Sessions: sessions, Seed: seed}) // no think time: every slot stays busy
	if res.OK == 0 {
		return 0, fmt.Errorf("no request succeeded (%d failed: %s)", res.Failed, res.FirstError())
	}
	return float64(res.OK) / res.Elapsed.Seconds(), nil
}

// priorityOne runs both tenants at their rates through a fresh gateway in
// mode.
func priorityOne(ctx context.Context, c Config, bin, mode string, rates map[string]float64, seed uint64) (priorityRun, error) {
	f, err := startReplicas(ctx, replicaSpec{bin: bin, replicas: 1, policy: config.PolicyCacheAware, heartbeat: c.Heartbeat,
		extra: priorityTOML(c, mode)}, priorityEngines(c))
	if err != nil {
		return priorityRun{}, err
	}
	defer f.close()
	client := loadgen.NewClient(1024)
	defer client.CloseIdleConnections()
	run := priorityRun{mode: mode}
	var wg sync.WaitGroup
	var errs [2]error
	for i, tenant := range []string{tenantChat, tenantBatch} {
		sessions, err := tenantSessions(c, tenant, rates[tenant], seed+uint64(i))
		if err != nil {
			return priorityRun{}, err
		}
		sessionRate := rates[tenant]
		if tenant == tenantChat {
			sessionRate /= float64(sessionTurns(c, loadgen.MultiTurn))
		}
		var mu sync.Mutex
		refused, served := 0, 0
		cfg := loadgen.Sessions{Rate: sessionRate, Duration: c.PriorityDuration, Warmup: c.PriorityWarmup, Think: c.Think,
			Sessions: sessions, Seed: seed + uint64(i),
			Observe: func(_, _ time.Duration, err error) {
				if err != nil && (strings.HasSuffix(err.Error(), ": 429") || strings.HasSuffix(err.Error(), ": 503")) {
					mu.Lock()
					refused++
					mu.Unlock()
				}
			},
			Answered: func(_, done time.Duration, err error) {
				if err == nil && done >= c.PriorityWarmup && done < c.PriorityDuration {
					mu.Lock()
					served++
					mu.Unlock()
				}
			}}
		wg.Go(func() {
			res := loadgen.RunSessions(ctx, client, loadgen.Fixed(f.urls[0]), cfg)
			if res.OK == 0 {
				errs[i] = fmt.Errorf("%s: no request succeeded (%d failed: %s)", tenant, res.Failed, res.FirstError())
			}
			t := tenantResult{rate: rates[tenant], ttft: loadgen.Summarize(res.TTFT), ok: res.OK, failed: res.Failed, drop: res.Dropped,
				within: loadgen.WithinSLO(res.TTFT, c.PriorityObjective)}
			mu.Lock()
			t.refused = refused
			t.served = float64(served) / (c.PriorityDuration - c.PriorityWarmup).Seconds()
			mu.Unlock()
			if tenant == tenantChat {
				run.chat = t
			} else {
				run.batch = t
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return priorityRun{}, err
	}
	for _, err := range errs {
		if err != nil && run.batch.ok+run.chat.ok == 0 {
			return priorityRun{}, err
		}
	}
	run.load = loadAverage()
	return run, nil
}

func priorityExperiment(ctx context.Context, c Config, bins binaries, logOut io.Writer) (section, []plotFile, error) {
	capacity := map[string]float64{}
	for i, tenant := range []string{tenantChat, tenantBatch} {
		cp, err := priorityCapacity(ctx, c, bins.gateway, tenant, c.Seed+uint64(i))
		if err != nil {
			return section{}, nil, fmt.Errorf("%s capacity: %w", tenant, err)
		}
		capacity[tenant] = cp
		fmt.Fprintf(logOut, "tlbench:   %s capacity alone: %.1f req/s\n", tenant, cp)
	}
	rates := map[string]float64{tenantChat: c.PriorityInteractive * capacity[tenantChat], tenantBatch: c.PriorityBatch * capacity[tenantBatch]}
	var runs []priorityRun
	for rep := range c.PriorityRepeats {
		for _, mode := range c.PriorityModes {
			r, err := priorityOne(ctx, c, bins.gateway, mode, rates, c.Seed+uint64(100*(rep+1)))
			if err != nil {
				return section{}, nil, fmt.Errorf("%s, repeat %d: %w", mode, rep, err)
			}
			r.repeat = rep
			fmt.Fprintf(logOut, "tlbench:   %-8s #%d interactive ttft p50 %6s p99 %7s ms within %5.1f%% refused %d | batch ttft p50 %7s p99 %7s ms %5.1f req/s refused %d\n",
				mode, rep, ms(r.chat.ttft.P50), ms(r.chat.ttft.P99), 100*r.chat.attainment(), r.chat.refused,
				ms(r.batch.ttft.P50), ms(r.batch.ttft.P99), r.batch.served, r.batch.refused)
			runs = append(runs, r)
		}
	}
	return prioritySection(c, capacity, rates, runs), nil, nil
}

func prioritySection(c Config, capacity, rates map[string]float64, runs []priorityRun) section {
	t := &table{header: []string{"mode", "interactive TTFT p50 ms", "interactive TTFT p99 ms", "interactive within objective",
		"interactive refused", "batch TTFT p50 ms", "batch TTFT p99 ms", "batch served req/s", "batch / capacity left", "batch refused", "runs", "load average"}}
	left := (1 - c.PriorityInteractive) * capacity[tenantBatch]
	type agg struct{ cp50, cp99, att, cref, bp50, bp99, tput, share, bref, load []float64 }
	by := map[string]*agg{}
	for _, r := range runs {
		a := by[r.mode]
		if a == nil {
			a = &agg{}
			by[r.mode] = a
		}
		a.cp50 = append(a.cp50, msf(r.chat.ttft.P50))
		a.cp99 = append(a.cp99, msf(r.chat.ttft.P99))
		a.att = append(a.att, r.chat.attainment())
		a.cref = append(a.cref, float64(r.chat.refused))
		a.bp50 = append(a.bp50, msf(r.batch.ttft.P50))
		a.bp99 = append(a.bp99, msf(r.batch.ttft.P99))
		a.tput = append(a.tput, r.batch.served)
		if left > 0 {
			a.share = append(a.share, r.batch.served/left)
		}
		a.bref = append(a.bref, float64(r.batch.refused))
		a.load = append(a.load, r.load)
	}
	var verdict string
	for _, mode := range c.PriorityModes {
		a := by[mode]
		if a == nil {
			continue
		}
		n := len(a.cp50)
		t.add(mode, spreadOf(a.cp50).format(f1, n), spreadOf(a.cp99).format(f1, n), spreadOf(a.att).format(pct, n), spreadOf(a.cref).format(f0, n),
			spreadOf(a.bp50).format(f1, n), spreadOf(a.bp99).format(f1, n), spreadOf(a.tput).format(f1, n), spreadOf(a.share).format(pct, n),
			spreadOf(a.bref).format(f0, n), fmt.Sprint(n), spreadOf(a.load).format(f1, n))
		if mode == PriorityPriority {
			att, share := spreadOf(a.att).med, spreadOf(a.share).med
			verdict = fmt.Sprintf("With priorities on, the interactive tenant met its objective for %s of its requests (target ≥ 99%%: %s) and the batch tenant got %s of the capacity left over (target ≥ 90%%: %s), medians of %d runs.",
				pct(att), metOrMissed(att >= 0.99), pct(share), metOrMissed(share >= 0.9), n)
		}
	}
	lead := fmt.Sprintf("%d engines of at most %d running sequences (%s; %d KV blocks of %d tokens), one gateway process (cache_aware) in front. "+
		"Capacity of each tenant alone, closed loop through the gateway with admission control off: interactive %.1f req/s, batch %.1f req/s. "+
		"Open loop for %v (the first %v not recorded): the interactive tenant at %.0f%% of its capacity (%.1f req/s: multi-turn conversations of %d turns, %d-token answers, streamed) "+
		"and the batch tenant at %.0f%% of its (%.1f req/s: prompts of %d bytes of their own, %d-token answers, streamed), %.0f%% of the fleet together. "+
		"Modes: off ([gateway.admission] enabled = false); fair (on, limit_scope = \"worker\", both keys in one band without objectives: the fair queue alone); "+
		"priority (on, limit_scope = \"pool\", the interactive key priority = 10 with ttft_objective_ms = %d, the batch key priority = -1). "+
		"Within objective: the interactive requests whose first token came within %v of sending, over all its requests of the window (refused and failed ones miss). "+
		"Batch served req/s: the batch requests answered within the recorded window, per second (sent earlier or later alike); batch / capacity left: that over (1 − %.0f%%) × its capacity alone. "+
		"Medians of the runs, (min–max) beside.",
		c.PriorityEngines, c.MaxRunning, flatModel(c.Prefill, c.OpenDecode), c.PriorityKVBlocks, enginesim.BlockTokens,
		capacity[tenantChat], capacity[tenantBatch], c.PriorityDuration, c.PriorityWarmup,
		100*c.PriorityInteractive, rates[tenantChat], sessionTurns(c, loadgen.MultiTurn), c.PriorityChatTokens,
		100*c.PriorityBatch, rates[tenantBatch], c.PriorityBatchBytes, c.PriorityBatchTokens, 100*(c.PriorityInteractive+c.PriorityBatch),
		c.PriorityObjective.Milliseconds(), c.PriorityObjective, 100*c.PriorityInteractive)
	sec := section{title: "Priorities and TTFT objectives at 120% load", lead: lead, tables: []*table{t}}
	if verdict != "" {
		sec.notes = append(sec.notes, verdict)
	}
	return sec
}
