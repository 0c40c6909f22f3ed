package tlbench

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
)

func TestGoodputOf(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name              string
		res               loadgen.Result
		goodput, attained float64
	}{
		{"nothing", loadgen.Result{}, 0, 0},
		{"all within", loadgen.Result{OK: 4, Elapsed: 2 * time.Second, TTFT: []time.Duration{ms, 10 * ms, 100 * ms, 250 * ms}}, 2, 1},
		{"one late", loadgen.Result{OK: 4, Elapsed: time.Second, TTFT: []time.Duration{ms, ms, ms, 251 * ms}}, 3, 0.75},
		// Failed and dropped requests never meet the SLO.
		{"failures count against attainment", loadgen.Result{OK: 2, Failed: 1, Dropped: 1, Elapsed: time.Second, TTFT: []time.Duration{ms, ms}}, 2, 0.5},
		{"no window", loadgen.Result{OK: 1, TTFT: []time.Duration{ms}}, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, a := goodputOf(&tc.res, 250*ms)
			if g != tc.goodput || a != tc.attained {
				t.Errorf("goodput %v, attained %v; want %v, %v", g, a, tc.goodput, tc.attained)
			}
		})
	}
}

func TestSpreadOf(t *testing.T) {
	for _, tc := range []struct {
		vs   []float64
		want spread
		text string
	}{
		{nil, spread{}, "0.0"},
		{[]float64{5}, spread{5, 5, 5}, "5.0"},
		{[]float64{3, 1, 2}, spread{2, 1, 3}, "2.0 (1.0–3.0)"},
		{[]float64{4, 1, 2, 3}, spread{2.5, 1, 4}, "2.5 (1.0–4.0)"},
	} {
		got := spreadOf(tc.vs)
		if got != tc.want {
			t.Errorf("spreadOf(%v) = %+v, want %+v", tc.vs, got, tc.want)
		}
		if s := got.format(f1, len(tc.vs)); s != tc.text {
			t.Errorf("format %q, want %q", s, tc.text)
		}
	}
}

func TestOpenTargets(t *testing.T) {
	lo, ca := config.PolicyLeastOutstanding, config.PolicyCacheAware
	// rate: frac × 100 req/s; att: the share of requests within the SLO.
	g := func(frac float64, replicas int, sync bool, p string, p50, p99, hit, att float64) openGroup {
		return openGroup{openKey: openKey{loadgen.RAG, frac, replicas, sync, p}, n: 3, rate: 100 * frac,
			p50: spread{med: p50}, p99: spread{med: p99}, hit: spread{med: hit}, att: spread{med: att}}
	}
	c := Config{OpenWorkloads: []loadgen.Kind{loadgen.RAG}, OpenReplicas: []int{1, 3}, OpenFractions: []float64{0.5, 0.9, 1.1},
		OpenGoodputFractions: []float64{1.6}, OpenAttainment: 0.9}
	groups := []openGroup{
		g(0.5, 1, false, ca, 10, 50, 0.60, 1), g(0.5, 1, false, lo, 30, 60, 0.30, 1),
		g(0.9, 1, false, ca, 10, 50, 0.60, 1), g(0.9, 1, false, lo, 30, 60, 0.30, 1),
		g(1.1, 1, false, ca, 10, 50, 0.60, 1), g(1.1, 1, false, lo, 90, 900, 0.30, 0.5),
		// Sync on, 3 replicas: cache_aware within bounds at 50% and 90%
		// (1.1 is not held to it); least_outstanding's p99 21% over at 90%.
		// cache_aware holds 110% (95% within the SLO, not 160%), least_outstanding
		// 90% (89% within it at 110% is not enough).
		g(0.5, 3, true, ca, 11, 57, 0.58, 1), g(0.5, 3, true, lo, 30, 70, 0.30, 1),
		g(0.9, 3, true, ca, 11.4, 57.4, 0.575, 1), g(0.9, 3, true, lo, 30, 72.6, 0.30, 0.95),
		g(1.1, 3, true, ca, 99, 990, 0.1, 0.95), g(1.1, 3, true, lo, 90, 900, 0.30, 0.89),
		g(1.6, 3, true, ca, 99, 990, 0.1, 0.6), g(1.6, 3, true, lo, 90, 900, 0.30, 0.1),
		// Sync off, 3 replicas: cache_aware's hit rate 4 points down at 50%;
		// both hold 50% and nothing more.
		g(0.5, 3, false, ca, 10, 50, 0.56, 1), g(0.5, 3, false, lo, 30, 60, 0.30, 1),
		g(1.6, 3, false, ca, 99, 990, 0.1, 0.5), g(1.6, 3, false, lo, 90, 900, 0.30, 0.1),
	}
	type key struct {
		check string
		sync  bool
	}
	got := map[key]openTarget{}
	for _, x := range openTargets(c, groups) {
		if x.workload != loadgen.RAG {
			t.Errorf("target on %s", x.workload)
		}
		got[key{x.check, x.sync}] = x
	}
	for _, tc := range []struct {
		key            key
		measured, met  bool
		resultContains string
	}{
		{key{targetCALatency, true}, true, true, "90%: p50 1.14×, p99 1.15×, hit -2.5 pt"},
		{key{targetLOP99, true}, true, false, "90%: p99 1.21× (missed)"},
		{key{targetGoodput, true}, true, false, "110% (110.0 req/s) against 90% (90.0 req/s): 1.22×"},
		{key{targetCALatency, false}, true, false, "50%: p50 1.00×, p99 1.00×, hit -4.0 pt (missed)"},
		{key{targetLOP99, false}, true, true, "50%: p99 1.00×"},
		{key{targetGoodput, false}, true, false, "50% (50.0 req/s) against 50% (50.0 req/s): 1.00×"},
	} {
		x, ok := got[tc.key]
		if !ok {
			t.Fatalf("no target %v in %v", tc.key, got)
		}
		if x.measured != tc.measured || x.met != tc.met || !strings.Contains(x.result, tc.resultContains) {
			t.Errorf("%v: measured %v, met %v, %q; want %v, %v, containing %q", tc.key, x.measured, x.met, x.result, tc.measured, tc.met, tc.resultContains)
		}
	}
	// A cache_aware that holds the sweep's highest rate is said to hold at
	// least that.
	held := append(slices.Clone(groups), g(1.6, 3, true, ca, 99, 990, 0.1, 0.99))
	held = slices.DeleteFunc(held, func(x openGroup) bool { return x.fraction == 1.6 && x.sync && x.policy == ca && x.att.med < 0.9 })
	for _, x := range openTargets(c, held) {
		if x.check == targetGoodput && x.sync && (!x.met || !strings.Contains(x.result, "160% (160.0 req/s) against 90% (90.0 req/s): 1.78× (cache_aware held the sweep's highest rate: at least that)")) {
			t.Errorf("held the highest rate: met %v, %q", x.met, x.result)
		}
	}
	// Without any 3-replica run nothing is measured.
	for _, x := range openTargets(c, groups[:6]) {
		if x.measured {
			t.Errorf("%s measured from 1-replica runs only", x.what)
		}
	}
}

func TestRoutableWorkers(t *testing.T) {
	for _, tc := range []struct {
		text string
		want int
	}{
		{"", 0},
		{"# HELP tlgate_workers x\ntlgate_workers{model=\"m\",role=\"unified\",state=\"routable\"} 3\n", 3},
		{"tlgate_workers{model=\"a\",role=\"unified\",state=\"routable\"} 2\ntlgate_workers{model=\"b\",role=\"unified\",state=\"routable\"} 1\n" +
			"tlgate_workers{model=\"a\",role=\"unified\",state=\"draining\"} 5\ntlgate_workers_x{state=\"routable\"} 9\n", 3},
	} {
		if got := routableWorkers([]byte(tc.text)); got != tc.want {
			t.Errorf("routableWorkers(%q) = %d, want %d", tc.text, got, tc.want)
		}
	}
}

func TestReplicaTOML(t *testing.T) {
	s := replicaSpec{replicas: 2, policy: config.PolicyCacheAware, heartbeat: 500 * time.Millisecond}
	cfg, err := config.Parse([]byte(replicaTOML(s, 1, "127.0.0.1:1", "127.0.0.1:2", t.TempDir())))
	if err != nil {
		t.Fatal(err)
	}
	if g := cfg.Gateway; g.Listen != "127.0.0.1:1" || g.RegistryListen != "127.0.0.1:2" || g.RoutePolicy != config.PolicyCacheAware ||
		g.HeartbeatInterval.Duration != 500*time.Millisecond {
		t.Errorf("parsed %+v", g)
	}
	s.syncURL = "nats://127.0.0.1:4222"
	text := replicaTOML(s, 1, "127.0.0.1:1", "127.0.0.1:2", "/tmp/x")
	for _, want := range []string{"[gateway.sync]", `kind = "nats"`, `url = "nats://127.0.0.1:4222"`, `replica_id = "replica-1"`, `token_env = "` + syncTokenEnv + `"`} {
		if !strings.Contains(text, want) {
			t.Errorf("sync-on config lacks %s:\n%s", want, text)
		}
	}
	if strings.Contains(text, "batch_interval") {
		t.Errorf("sync-on config sets batch_interval without -open-sync-batch:\n%s", text)
	}
	s.syncBatch = 2 * time.Millisecond
	if text := replicaTOML(s, 1, "127.0.0.1:1", "127.0.0.1:2", "/tmp/x"); !strings.Contains(text, `batch_interval = "2ms"`) {
		t.Errorf("config with syncBatch 2ms:\n%s", text)
	}
	if strings.Contains(text, "release_hold") {
		t.Errorf("sync-on config sets release_hold without -open-release-hold:\n%s", text)
	}
	var zero time.Duration
	s.syncHold = &zero
	t.Setenv(syncTokenEnv, "token")
	cfg, err = config.Parse([]byte(replicaTOML(s, 1, "127.0.0.1:1", "127.0.0.1:2", t.TempDir())))
	if err != nil {
		t.Fatal(err)
	}
	if h := cfg.Gateway.Sync.ReleaseHold.Duration; h != 0 {
		t.Errorf("config with syncHold 0 parses to release_hold %v", h)
	}
}

// TestOpenLoopRun runs the open-loop experiment at its smallest: one
// workload, one rate, one and two replica processes, sync off.
func TestOpenLoopRun(t *testing.T) {
	c := smallest("")
	c.Timeout = 3 * time.Minute
	c.Only = []string{ExpOpenLoop}
	c.OpenWorkloads, c.OpenReplicas, c.OpenSync, c.OpenFractions = []loadgen.Kind{loadgen.RAG}, []int{1, 2}, []bool{false}, []float64{0.5}
	c.OpenDuration, c.OpenWarmup, c.OpenCapacityUsers, c.OpenMaxTokens, c.OpenDecode = 1500*time.Millisecond, 500*time.Millisecond, 8, 4, time.Millisecond
	var out, log strings.Builder
	if err := Run(context.Background(), c, &out, &log); err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	md := out.String()
	n := 0
	for _, line := range strings.Split(md, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) < 12 || cells[0] != "rag" || !strings.HasPrefix(cells[1], "50%") {
			continue
		}
		n++
		if cells[11] != "0" {
			t.Errorf("row %v: failed requests", cells)
		}
	}
	if n != 4 { // 1 and 2 replicas × 2 policies
		t.Errorf("%d rows at 50%%, want 4:\n%s", n, md)
	}
	for _, want := range []string{"least_outstanding capacity, 1 replica", "cache_aware's goodput at 3 replicas", "not measured"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
