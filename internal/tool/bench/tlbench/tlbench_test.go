package tlbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
	"github.com/tlgate/tlgate/internal/tool/bench/nginxproxy"
)

func TestMain(m *testing.M) {
	// The overhead experiment starts this binary again as its Go reverse
	// proxy (roleEnv): serve that role instead of running the tests.
	if ran, err := RunRole(); ran {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	leakcheck.VerifyTestMain(m)
}

// smallest is the least configuration that runs every experiment: a few
// requests per run, tiny engine costs, two fleet sizes, a few streams.
func smallest(out string) Config {
	c := Preset(true)
	c.Out = out
	c.Timeout = time.Minute
	c.BuildFlags = raceBuildFlags
	c.Engines, c.Requests, c.Concurrency = 2, 12, 4
	c.Prefill, c.Decode, c.MaxTokens = 10*time.Microsecond, 200*time.Microsecond, 4
	c.SystemPrompts, c.SystemBytes, c.UserBytes = 2, 200, 40
	c.KVBlocks, c.KVBlocksLong, c.KVBlocksTurns, c.TurnRequests = 64, 96, 96, 12
	c.Conversations, c.TurnSystemBytes, c.TurnUserBytes, c.AnswerBytes = 3, 100, 40, 30
	c.Documents, c.DocumentBytes, c.RAGSystemBytes = 3, 300, 60
	c.Heartbeat = 500 * time.Millisecond
	c.SweepPrompts = []int{4}
	c.Rate, c.RateDuration, c.Rounds = 100, 100*time.Millisecond, 1
	c.TputConcurrency, c.TputDuration = 4, 100*time.Millisecond
	c.Workers, c.PickBudget, c.PickMinOps = []int{4, 16}, time.Millisecond, 200
	c.Streams = []int{20}
	c.OverloadDecode, c.OverloadTokens = time.Millisecond, 4
	c.OverloadDuration, c.OverloadClientTimeout = 300*time.Millisecond, 5*time.Second
	return c
}

// tableRows returns the rows of the markdown tables under the heading,
// keyed by their first two cells.
func tableRows(t *testing.T, md, heading string) map[string][]string {
	t.Helper()
	i := strings.Index(md, "## "+heading+"\n")
	if i < 0 {
		t.Fatalf("no section %q in:\n%s", heading, md)
	}
	sec := md[i+len(heading)+4:]
	if j := strings.Index(sec, "\n## "); j >= 0 {
		sec = sec[:j]
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(sec, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| ---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) >= 2 {
			rows[cells[0]+" "+cells[1]] = cells
		}
	}
	return rows
}

func TestQuickRun(t *testing.T) {
	dir := t.TempDir()
	var out, log bytes.Buffer
	if err := Run(context.Background(), smallest(dir), &out, &log); err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	md := out.String()

	routing := tableRows(t, md, "Routing quality")
	for _, k := range loadgen.Kinds {
		for _, p := range Policies {
			row := routing[string(k)+" "+p]
			if row == nil {
				t.Errorf("routing table has no row %s %s", k, p)
				continue
			}
			// Twelve requests over two shared prompts and two engines repeat
			// a (prompt, engine) pair: the shared workload must hit the
			// prefix cache whatever the policy; distinct prompts never do.
			if hit := row[2]; k == loadgen.Shared && hit == "0.0%" || k == loadgen.Distinct && hit != "0.0%" {
				t.Errorf("%s %s: hit rate %s", k, p, hit)
			}
		}
	}
	for _, p := range sweepPolicies {
		if routing["4 "+p] == nil {
			t.Errorf("sweep table has no row for 4 prompts, %s", p)
		}
	}

	overhead := tableRows(t, md, "Gateway overhead")
	paths := []string{pathDirect, pathGoProxy, pathGateway}
	if _, err := nginxproxy.Lookup(""); err == nil {
		paths = append(paths, pathNginx)
	} else if !strings.Contains(md, "nginx is not installed") {
		t.Error("nginx is missing and the report does not say so")
	}
	for _, m := range overheadModes {
		for _, p := range paths {
			if overhead[m.name+" "+p] == nil {
				t.Errorf("overhead table has no row %s %s", m.name, p)
			}
		}
	}

	scale := tableRows(t, md, "Route decision time")
	for _, n := range []string{"4", "16"} {
		for _, p := range scalePolicies {
			if scale[n+" "+string(p)] == nil {
				t.Errorf("route decision table has no row %s %s", n, p)
			}
		}
	}
	memory := tableRows(t, md, "Gateway memory per open stream")
	if len(memory) != 2 { // the header and the row of 20 streams
		t.Errorf("memory table rows %v", memory)
	}
	overload := tableRows(t, md, "Overload: admission control")
	for _, k := range []string{"2× off", "2× on", "5× off", "5× on"} {
		if overload[k] == nil {
			t.Errorf("overload table has no row %s", k)
		}
	}
	for _, want := range []string{"## Machine", "Target: affinity ≥ 2×", "Target: under 50 KiB per open stream at 20 streams"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}

	results, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(results), md) {
		t.Error("results.md does not hold the printed report")
	}
	for _, name := range []string{"routing", "routing-sweep", "overhead", "route-decision", "memory"} {
		b, err := os.ReadFile(filepath.Join(dir, name+".svg"))
		if err != nil {
			t.Errorf("plot %s: %v", name, err)
			continue
		}
		if !bytes.HasPrefix(b, []byte("<svg")) && !bytes.Contains(b[:min(len(b), 200)], []byte("<svg")) {
			t.Errorf("%s.svg is not an SVG document", name)
		}
	}
}

func TestMaxOverMean(t *testing.T) {
	for _, tc := range []struct {
		counts []uint64
		want   float64
	}{
		{nil, 0},
		{[]uint64{0, 0}, 0},
		{[]uint64{10, 10, 10, 10}, 1},
		{[]uint64{20, 10, 5, 5}, 2},
		{[]uint64{3}, 1},
	} {
		if got := maxOverMean(tc.counts); got != tc.want {
			t.Errorf("maxOverMean(%v) = %v, want %v", tc.counts, got, tc.want)
		}
	}
}

// TestCacheAwareTargetsAgainstRoutePolicies: cache_aware is held to the
// gateway's other route policies; a client-side baseline's faster TTFT is
// reported beside the verdict, not counted in it.
func TestCacheAwareTargetsAgainstRoutePolicies(t *testing.T) {
	row := func(p string, hit float64, p50, p99 time.Duration) routingRow {
		return routingRow{workload: loadgen.Distinct, policy: p, hitRate: hit, maxMean: 1,
			ttft: loadgen.Summary{Count: 10, P50: p50, P99: p99}, res: &loadgen.Result{}}
	}
	ms := time.Millisecond
	rows := []routingRow{
		row(config.PolicyLeastOutstanding, 0, 100*ms, 200*ms),
		row(config.PolicyWeighted, 0, 100*ms, 200*ms),
		row(config.PolicyAffinity, 0, 100*ms, 200*ms),
		row(config.PolicyCacheAware, 0, 105*ms, 210*ms),
		row(baseRandom, 0, 50*ms, 400*ms),
		row(baseRoundRobin, 0, 99*ms, 150*ms),
	}
	tb, notes := cacheAwareTargets(rows, nil)
	if len(tb.rows) != 1 {
		t.Fatalf("rows %v", tb.rows)
	}
	r := tb.rows[0]
	if verdict := r[len(r)-2]; verdict != "met" {
		t.Fatalf("verdict %q, want met (notes %v)", verdict, notes)
	}
	if base := r[len(r)-1]; base != "50.0 / 150.0" {
		t.Fatalf("baselines %q, want 50.0 / 150.0", base)
	}
	// 11% slower than least_outstanding misses.
	rows[3] = row(config.PolicyCacheAware, 0, 111*ms, 210*ms)
	tb, _ = cacheAwareTargets(rows, nil)
	if verdict := tb.rows[0][len(tb.rows[0])-2]; verdict != "MISSED: TTFT p50" {
		t.Fatalf("verdict %q, want MISSED: TTFT p50", verdict)
	}
}

// TestBuildBinariesOnlyWhatTheRunStarts: experiments that run in this
// process build nothing (and leave no directory to remove).
func TestBuildBinariesOnlyWhatTheRunStarts(t *testing.T) {
	c := smallest("")
	c.Only = []string{ExpRouting, ExpScale, ExpMemory, ExpOverload}
	b, err := buildBinaries(context.Background(), c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if b != (binaries{}) {
		t.Errorf("built %+v for experiments that start no process", b)
	}
}
