package enginesim

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Preset is an engine sized and timed like a real model on a real GPU:
// the step scheduler's cost model and budget, the KV capacity and the
// running sequences vLLM would have. The cost model's parts come from the
// hardware (the weights read once per step, the KV read per context
// token, the FLOPs per prefill and decode token at a realistic share of
// peak), then checked against published vLLM measurements (Source); the
// comparison is in docs/BENCHMARKS.md.
type Preset struct {
	// Name selects the preset (-preset).
	Name string
	// Model and GPU say what is simulated.
	Model, GPU string
	// KVBlocks is the KV capacity in 16-token blocks at vLLM's default
	// gpu_memory_utilization (0.9).
	KVBlocks int
	// MaxRunning is max_num_seqs.
	MaxRunning int
	// Step is the step scheduler's configuration.
	Step StepConfig
	// Source cites the published figures the preset is checked against.
	Source string
}

// PresetLlama8BH100 is Llama-3.1-8B-Instruct (BF16) on one H100 SXM 80GB.
//
// Hardware: 16.1 GB of weights read per step at ~80% of the 3.35 TB/s
// HBM3 is 6.0 ms, plus ~0.3 ms of launch and sampling (Fixed); 128 KiB of
// KV per context token (32 layers x 8 KV heads x 128 x K,V x 2 bytes) at
// the same bandwidth is ~48 ns (PerContextToken); 16 GFLOP per token at
// ~60% of 989 TFLOPS dense BF16 is ~27 us (PerPrefillToken); a decode
// sequence's share of the batched matmuls and sampling is 0.1 ms
// (PerDecodeSeq), fitted with the API server stage (vllmAPIServer) to the
// cited TPOT at concurrency 4 to 64. KV: 0.9 x 80 GB - 16 GB weights -
// ~4 GB activations is ~52 GB, 410k tokens.
//
// Checked against the InferenceBench concurrency sweep of
// Llama-3.1-8B-Instruct on one H100-80GB-HBM3, vLLM 0.21.0, fp16,
// 2026-05-16 (yobitelcomm.github.io/bench/recipes/concurrency-sweep):
// median TPOT 6.48 / 6.59 / 10.94 / 46.91 ms, throughput 122.2 / 580.3 /
// 1384.2 / 1312.3 output tok/s and median TTFT 13.98 / 22.75 / 41.69 /
// 86.92 ms at concurrency 1 / 4 / 16 / 64
// (TestPresetsMatchPublishedFigures).
var PresetLlama8BH100 = Preset{
	Name: "llama-3.1-8b-h100", Model: "Llama-3.1-8B-Instruct (BF16)", GPU: "1x H100 SXM 80GB",
	KVBlocks: 25600, MaxRunning: 256,
	Step: StepConfig{
		Cost: StepCost{
			Fixed:           6300 * time.Microsecond,
			PerPrefillToken: 27 * time.Microsecond,
			PerDecodeSeq:    100 * time.Microsecond,
			PerContextToken: 48 * time.Nanosecond,
		},
		MaxNumBatchedTokens: 8192,
		APIServer:           vllmAPIServer,
	},
	Source: "InferenceBench concurrency sweep, Llama-3.1-8B-Instruct, 1x H100-80GB-HBM3, vLLM 0.21.0 (2026-05-16)",
}

// PresetLlama70BFP8H100 is Llama-3.1-70B-Instruct (FP8 weights, BF16 KV)
// on one H100 SXM 80GB.
//
// Hardware: 70 GB of weights read per step at ~80% of 3.35 TB/s is 26 ms,
// plus launch, sampling and FP8 scaling (Fixed 30 ms); 320 KiB of KV per
// context token (80 layers x 8 KV heads x 128 x K,V x 2 bytes) is ~122 ns
// (PerContextToken); 140 GFLOP per token at ~40% of 1979 TFLOPS FP8 is
// ~0.18 ms (PerPrefillToken and, with sampling, PerDecodeSeq). KV: what
// the weights leave of 0.9 x 80 GB, ~1.4 GB after activations, 4.6k
// tokens.
//
// Checked against Lambda's vLLM benchmark of
// neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8 on 1x H100-80GB-SXM
// (github.com/LambdaLabsML/vllm-benchmark, results/prompt_10, 2024-08-19,
// ten ShareGPT prompts at once, 1371 input tokens): median ITL 32.5 ms,
// TPOT 33.0 ms, 100 output tok/s, TTFT 0.29 s for the prompts prefilled
// together (TestPresetsMatchPublishedFigures).
var PresetLlama70BFP8H100 = Preset{
	Name: "llama-3.1-70b-fp8-h100", Model: "Llama-3.1-70B-Instruct (FP8)", GPU: "1x H100 SXM 80GB",
	KVBlocks: 288, MaxRunning: 256,
	Step: StepConfig{
		Cost: StepCost{
			Fixed:           30 * time.Millisecond,
			PerPrefillToken: 190 * time.Microsecond,
			PerDecodeSeq:    180 * time.Microsecond,
			PerContextToken: 122 * time.Nanosecond,
		},
		MaxNumBatchedTokens: 8192,
		APIServer:           vllmAPIServer,
	},
	Source: "LambdaLabsML/vllm-benchmark, Meta-Llama-3.1-70B-Instruct-FP8, 1x H100-80GB-SXM (2024-08-19)",
}

// Presets are the shipped presets by name.
var Presets = map[string]Preset{
	PresetLlama8BH100.Name:     PresetLlama8BH100,
	PresetLlama70BFP8H100.Name: PresetLlama70BFP8H100,
}

// PresetNames returns the presets' names, sorted.
func PresetNames() []string {
	var names []string
	for n := range Presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// LookupPreset returns the named preset.
func LookupPreset(name string) (Preset, error) {
	p, ok := Presets[name]
	if !ok {
		return Preset{}, fmt.Errorf("%w: unknown preset %q (have %s)", ErrConfig, name, strings.Join(PresetNames(), ", "))
	}
	return p, nil
}

// Apply configures c to run as the preset: the step scheduler with its
// cost model, its KV capacity and max_num_seqs where c leaves them zero.
func (p Preset) Apply(c *Config) {
	step := p.Step
	c.Step = &step
	if c.KVBlocks == 0 {
		c.KVBlocks = p.KVBlocks
	}
	if c.MaxRunning == 0 {
		c.MaxRunning = p.MaxRunning
	}
}

// vllmAPIServer is vLLM's API server process, the same for both presets
// (both serve Llama 3.1's tokenizer from one Python process): 1.5 ms to
// parse, template and tokenize a ~256-token chat request, 0.64 ms to
// detokenize and stream out a token. The per-token part is fitted to the
// 8B sweep's saturation: its output stays near 1,300-1,400 tok/s from
// concurrency 16 to 64 while TPOT grows 4.3x, a ceiling outside the GPU
// of ~0.7 ms per token.
var vllmAPIServer = APIServerCost{PerRequest: 1500 * time.Microsecond, PerOutputToken: 640 * time.Microsecond}
