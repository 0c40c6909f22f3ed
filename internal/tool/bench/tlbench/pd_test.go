package tlbench

import (
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
)

// TestPDJointSLO checks DistServe's goodput: a request counts when its
// TTFT and its TPOT both meet their objectives; failed and dropped
// requests count against the shares.
func TestPDJointSLO(t *testing.T) {
	ms := time.Millisecond
	res := &loadgen.Result{OK: 4, Failed: 1, Dropped: 1, Elapsed: 2 * time.Second,
		TTFT: []time.Duration{100 * ms, 900 * ms, 1500 * ms, 200 * ms},
		TPOT: []time.Duration{10 * ms, 15 * ms, 10 * ms, 40 * ms},
		ITL:  []time.Duration{5 * ms, 10 * ms, 200 * ms}}
	r := pdFigures(res, time.Second, 15*ms)
	// Both met: the first two; TPOT met: the first three.
	if r.goodput != 1 || r.attained != 2.0/6 || r.tpotMet != 3.0/6 || r.ok != 4 || r.failed != 1 || r.dropped != 1 || r.itl.P99 != 200*ms {
		t.Errorf("figures %+v", r)
	}
	if both, tpot := jointSLO(nil, nil, time.Second, ms); both != 0 || tpot != 0 {
		t.Errorf("no samples: %d, %d", both, tpot)
	}
	if r := pdFigures(&loadgen.Result{}, time.Second, ms); r.goodput != 0 || r.attained != 0 {
		t.Errorf("empty result: %+v", r)
	}
}

// pdRunOf is a run with the figures the tables read.
func pdRunOf(f pdFleet, rate float64, ttft50, itl99, good, tpotMet float64) pdRun {
	d := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	return pdRun{fleet: f, rate: rate, ttft: loadgen.Summary{P50: d(ttft50), P99: d(2 * ttft50)}, itl: loadgen.Summary{P50: d(itl99 / 4), P99: d(itl99)},
		tpot: loadgen.Summary{P99: d(itl99 / 2)}, goodput: good, attained: tpotMet, tpotMet: tpotMet, load: 1.5}
}

// TestPDTables checks the grouping of the runs (medians and ranges per
// fleet and rate) and the acceptance: checked only where the unified
// fleet missed the inter-token objective, each disaggregated fleet
// against it.
func TestPDTables(t *testing.T) {
	c := Preset(false)
	fleets := pdFleets(c)
	if len(fleets) != 5 || !fleets[0].unified() || fleets[1].name() != "2P + 2D" || fleets[1].protocol != protocolVLLM ||
		fleets[2].protocol != protocolSGLang || fleets[4].name() != "1P + 3D" || fleets[0].name() != "4 unified" {
		t.Fatalf("fleets %+v", fleets)
	}
	u, vl, sg := fleets[0], fleets[1], fleets[2]
	var runs []pdRun
	for rep := range 3 {
		x := float64(rep)
		runs = append(runs,
			pdRunOf(u, 10, 50+x, 20+x, 10, 0.99),
			pdRunOf(vl, 10, 60+x, 12, 10, 1),
			pdRunOf(u, 20, 80+x, 200+10*x, 8+x, 0.5),
			pdRunOf(vl, 20, 90, 30+x, 19, 0.97),
			pdRunOf(sg, 20, 95, 150, 12, 0.8))
	}
	groups := groupPD(runs)
	if len(groups) != 5 {
		t.Fatalf("%d groups, want 5", len(groups))
	}
	g := groups[2] // unified at 20
	if g.n != 3 || g.itl99.med != 210 || g.itl99.lo != 200 || g.itl99.hi != 220 || g.good.med != 9 || g.loadLo != 1.5 || g.loadHi != 1.5 {
		t.Errorf("unified at 20: %+v", g)
	}
	targets, held := pdTargets(groups, 0.9)
	if len(held) != 1 || held[0] != 10 || len(targets) != 2 {
		t.Fatalf("held %v, targets %+v", held, targets)
	}
	if x := targets[0]; x.fleet != vl || !x.met || x.itlRatio != 31.0/210 || x.goodRatio != 19.0/9 {
		t.Errorf("vLLM target %+v", x)
	}
	if x := targets[1]; x.fleet != sg || x.met {
		t.Errorf("SGLang target %+v: ITL p99 150 of 210 and goodput 12 of 9 miss both", x)
	}
	tab, acc, _ := pdTables(groups, 0.9)
	var md strings.Builder
	sec := section{title: "T", tables: []*table{tab, acc}}
	sec.markdown(&md)
	rows := tableRows(t, md.String(), "T")
	if r := rows["20.0 4 unified"]; len(r) != 13 || r[2] != "–" || r[6] != "210.0 (200.0–220.0)" || r[10] != "9.0 (8.0–10.0)" {
		t.Errorf("unified row %q", r)
	}
	if r := rows["20.0 2P + 2D"]; len(r) == 0 {
		t.Errorf("no 2P + 2D row at 20:\n%s", md.String())
	}
	if !strings.Contains(md.String(), "| 20.0 | 2P + 2D | vLLM kv_transfer_params | 50.0% | 0.15 (31.0 / 210.0 ms) | 2.11 (19.0 / 9.0 req/s) | met |") ||
		!strings.Contains(md.String(), "| 20.0 | 2P + 2D | SGLang bootstrap rooms | 50.0% | 0.71 (150.0 / 210.0 ms) | 1.33 (12.0 / 9.0 req/s) | MISSED |") {
		t.Errorf("acceptance table:\n%s", md.String())
	}
	// The section says where no acceptance applied.
	s := pdSection(c, nil, runs)
	if len(s.tables) != 2 || !strings.Contains(strings.Join(s.notes, "\n"), "At 10.0 req/s the unified fleet held") {
		t.Errorf("section notes %q", s.notes)
	}
	if s := pdSection(c, nil, runs[:2]); len(s.tables) != 1 || !strings.Contains(s.notes[0], "Acceptance not measured") {
		t.Errorf("no miss: %d tables, notes %q", len(s.tables), s.notes)
	}
}

// TestPDTOML: the gateway's configuration of each fleet.
func TestPDTOML(t *testing.T) {
	c := Preset(false)
	u := pdTOML(c, pdFleet{decode: 2, protocol: protocolVLLM}, []pdProbed{{id: "unified-0", role: "unified", addr: "127.0.0.1:1"}})
	for _, w := range []string{"enabled = false", `model = "bench-pd"`, `backends = [{ model = "bench", weight = 1 }]`, `targets = ["unified"]`,
		`id = "unified-0"`, `http_address = "127.0.0.1:1"`, `kind = "vllm"`, `probe_interval = "1s"`} {
		if !strings.Contains(u, w) {
			t.Errorf("unified: %q lacks %q", u, w)
		}
	}
	if strings.Contains(u, "role =") || strings.Contains(u, "bootstrap_port") {
		t.Errorf("unified: %q", u)
	}
	d := pdTOML(c, pdFleet{prefill: 1, decode: 1, protocol: protocolSGLang}, []pdProbed{
		{id: "prefill-0", role: "prefill", addr: "127.0.0.1:1", bootstrapPort: "9000"}, {id: "decode-0", role: "decode", addr: "127.0.0.1:2"}})
	for _, w := range []string{`targets = ["disaggregated"]`, `kind = "sglang"`, "role = \"prefill\"\nbootstrap_port = 9000\n", `role = "decode"`} {
		if !strings.Contains(d, w) {
			t.Errorf("disaggregated: %q lacks %q", d, w)
		}
	}
	cfgs, err := pdEngineConfigs(c, pdFleet{prefill: 1, decode: 3, protocol: protocolSGLang})
	if err != nil || len(cfgs) != 4 || cfgs[0].Role != "prefill" || cfgs[0].BootstrapAddr == "" || cfgs[1].Role != "decode" || cfgs[1].BootstrapAddr != "" ||
		cfgs[3].Step == nil || cfgs[3].KVBlocks != 25600 {
		t.Errorf("engines %+v, %v", cfgs, err)
	}
}

// TestPDRun runs the experiment's smallest configuration: a row per
// fleet, every protocol through a real gateway process.
func TestPDRun(t *testing.T) {
	c := smallest("")
	c.Timeout = 3 * time.Minute
	c.Only = []string{ExpPD}
	c.PDRates, c.PDRepeats, c.PDDuration, c.PDWarmup, c.PDSplits = []float64{4}, 1, 1500*time.Millisecond, 500*time.Millisecond, []int{2, 1}
	c.PDLongTokens, c.PDChatTokens, c.PDLongOutput, c.PDChatOutput = [2]int{1024, 2048}, [2]int{32, 64}, 4, 8
	var out, log strings.Builder
	if err := Run(t.Context(), c, &out, &log); err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	md := out.String()
	for _, f := range pdFleets(c) {
		prefix := "| 4.0 | " + f.name() + " | " + f.protocolName() + " | "
		found := false
		for _, line := range strings.Split(md, "\n") {
			cells := strings.Split(strings.Trim(line, "| "), " | ")
			if strings.HasPrefix(line, prefix) && len(cells) == 13 {
				found = true
				if cells[11] != "0" {
					t.Errorf("%s: %s failed\n%s", prefix, cells[11], log.String())
				}
			}
		}
		if !found {
			t.Errorf("no row %q:\n%s", prefix, md)
		}
	}
}
