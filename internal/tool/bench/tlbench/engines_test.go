package tlbench

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
)

// TestEngineTiming checks the engines the routing runs start, and the open
// loop's and the KV events runs' built on them: on the flat model with the
// runs' per-token times, or on a preset's step scheduler with no per-token
// time and the runs' own KV blocks and running sequences; enginesim
// accepts every one of them.
func TestEngineTiming(t *testing.T) {
	c := Preset(false)
	for _, tc := range []struct {
		name    string
		preset  string
		engines func(Config) []enginesim.Config
		blocks  int
		decode  time.Duration // flat model only
	}{
		{"routing shared, flat", "", func(c Config) []enginesim.Config { return routingEngines(c, loadgen.Shared) }, c.KVBlocks, c.Decode},
		{"routing multi-turn, flat", "", func(c Config) []enginesim.Config { return routingEngines(c, loadgen.MultiTurn) }, c.KVBlocksTurns, c.Decode},
		{"routing rag, flat", "", func(c Config) []enginesim.Config { return routingEngines(c, loadgen.RAG) }, c.KVBlocksLong, c.Decode},
		{"openloop rag, flat", "", func(c Config) []enginesim.Config { return openEngines(c, loadgen.RAG) }, c.KVBlocksLong, c.OpenDecode},
		{"kvevents, flat", "", func(c Config) []enginesim.Config { return kvEngines(c, loadgen.RAG, 77, true) }, 77, c.OpenDecode},
		{"routing shared, 8b", enginesim.PresetLlama8BH100.Name, func(c Config) []enginesim.Config { return routingEngines(c, loadgen.Shared) }, c.KVBlocks, 0},
		{"routing multi-turn, 8b", enginesim.PresetLlama8BH100.Name, func(c Config) []enginesim.Config { return routingEngines(c, loadgen.MultiTurn) }, c.KVBlocksTurns, 0},
		{"routing rag, 70b", enginesim.PresetLlama70BFP8H100.Name, func(c Config) []enginesim.Config { return routingEngines(c, loadgen.RAG) }, c.KVBlocksLong, 0},
		{"openloop multi-turn, 8b", enginesim.PresetLlama8BH100.Name, func(c Config) []enginesim.Config { return openEngines(c, loadgen.MultiTurn) }, c.KVBlocksTurns, 0},
		{"kvevents, 8b", enginesim.PresetLlama8BH100.Name, func(c Config) []enginesim.Config { return kvEngines(c, loadgen.RAG, 77, true) }, 77, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := c
			c.EnginePreset = tc.preset
			engines := tc.engines(c)
			if len(engines) != c.Engines {
				t.Fatalf("%d engines, want %d", len(engines), c.Engines)
			}
			for _, e := range engines {
				if e.KVBlocks != tc.blocks || e.MaxRunning != c.MaxRunning {
					t.Errorf("%s: %d KV blocks and %d running, want the run's %d and %d", e.ID, e.KVBlocks, e.MaxRunning, tc.blocks, c.MaxRunning)
				}
				if tc.preset == "" {
					if e.Step != nil || e.PrefillPerToken != c.Prefill || e.DecodePerToken != tc.decode {
						t.Errorf("%s: step %v, prefill %v, decode %v; want the flat model's %v and %v", e.ID, e.Step, e.PrefillPerToken, e.DecodePerToken, c.Prefill, tc.decode)
					}
					continue
				}
				if want := enginesim.Presets[tc.preset].Step; e.Step == nil || e.Step.Cost != want.Cost || e.Step.MaxNumBatchedTokens != want.MaxNumBatchedTokens || e.Step.APIServer != want.APIServer {
					t.Errorf("%s: step %+v, want the preset's %+v", e.ID, e.Step, want)
				}
				if e.PrefillPerToken != 0 || e.DecodePerToken != 0 {
					t.Errorf("%s: per-token times %v and %v on the step model", e.ID, e.PrefillPerToken, e.DecodePerToken)
				}
			}
			e := engines[0]
			eng, err := enginesim.Start(context.Background(), e)
			if err != nil {
				t.Fatalf("enginesim refuses the configuration: %v", err)
			}
			if err := eng.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEngineModelSaid checks the description every experiment's lead
// gives of the engine model it ran.
func TestEngineModelSaid(t *testing.T) {
	c := Preset(false)
	if got, want := engineModel(c, c.Decode), "flat timing: prefill 75µs per uncached prompt token, decode 3ms per token"; got != want {
		t.Errorf("flat: %q, want %q", got, want)
	}
	c.EnginePreset = enginesim.PresetLlama8BH100.Name
	if got, want := engineModel(c, c.Decode), "step model, preset llama-3.1-8b-h100: Llama-3.1-8B-Instruct (BF16) on 1x H100 SXM 80GB, "+
		"each step 6.3ms + 27µs per prefill token + 100µs per decode sequence + 48ns per context token, 8192 tokens per step at most; "+
		"API server 1.5ms per request and 640µs per output token, serially"; got != want {
		t.Errorf("step: %q, want %q", got, want)
	}
	if lead := routingSection(c, nil, nil).lead; !strings.Contains(lead, "(step model, preset llama-3.1-8b-h100:") {
		t.Errorf("the routing lead does not say its engine model: %s", lead)
	}
}

// TestEnginePresetChecked: an unknown preset fails the run before
// anything starts, naming the presets there are.
func TestEnginePresetChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{{"", true}, {enginesim.PresetLlama8BH100.Name, true}, {enginesim.PresetLlama70BFP8H100.Name, true}, {"llama-9", false}} {
		err := CheckEnginePreset(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("CheckEnginePreset(%q) = %v", tc.name, err)
		}
		if err != nil && !strings.Contains(err.Error(), strings.Join(enginesim.PresetNames(), ", ")) {
			t.Errorf("the error does not list the presets: %v", err)
		}
	}
	c := smallest("")
	c.EnginePreset = "llama-9"
	if err := Run(context.Background(), c, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), `unknown engine preset "llama-9"`) {
		t.Errorf("Run with an unknown preset: %v", err)
	}
}

// TestRoutingRunOnStepModel runs the smallest routing experiment on the
// 8B preset's step scheduler: every row served, the shared prompts hit
// the prefix cache, the engines' slot figures count, and the lead says
// the model.
func TestRoutingRunOnStepModel(t *testing.T) {
	c := smallest("")
	c.Only = []string{ExpRouting}
	c.EnginePreset = enginesim.PresetLlama8BH100.Name
	c.Workloads = []loadgen.Kind{loadgen.Shared}
	c.RoutePolicies = []string{config.PolicyLeastOutstanding, config.PolicyCacheAware}
	c.SweepPrompts = nil
	var out, log bytes.Buffer
	if err := Run(context.Background(), c, &out, &log); err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	md := out.String()
	if !strings.Contains(md, "step model, preset llama-3.1-8b-h100") {
		t.Errorf("the report does not say the engine model:\n%s", md)
	}
	rows := tableRows(t, md, "Routing quality")
	for _, p := range c.RoutePolicies {
		row := rows["shared "+p]
		if row == nil {
			t.Fatalf("no row for %s", p)
		}
		if hit, busy, failed := row[2], row[8], row[12]; hit == "0.0%" || busy == "0.0%" || failed != "0" {
			t.Errorf("%s: hit rate %s, slots busy %s, failed %s", p, hit, busy, failed)
		}
		if _, err := strconv.ParseUint(row[len(row)-1], 10, 64); err != nil || len(row) != 14 {
			t.Errorf("%s: no preemption count in %q", p, row)
		}
	}
}
