package probe

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var allMissing = []string{FigureQueueDepth, FigureRunning, FigureKVTotalBlocks, FigureKVFreeBlocks}

func TestParseMetricsFixtures(t *testing.T) {
	tests := []struct {
		file string
		kind Kind
		want Figures
	}{
		{
			file: "vllm_v1.txt", kind: KindVLLM,
			// 27000 blocks at 25% usage: 6750 in use.
			want: Figures{QueueDepth: 3, Running: 5, KVTotalBlocks: 27000, KVFreeBlocks: 20250, BlockTokens: 16, StartedAtUnixMs: 1750000123400},
		},
		{
			file: "vllm_v0.txt", kind: KindVLLM,
			// The older gpu_cache_usage_perc name; block_size 32 from cache_config_info.
			want: Figures{QueueDepth: 2, Running: 7, KVTotalBlocks: 1000, KVFreeBlocks: 500, BlockTokens: 32},
		},
		{
			file: "vllm_dp.txt", kind: KindVLLM,
			// Two engines: counts summed, usage averaged (0.3 of 1000
			// blocks), capacity the total each cache_config_info carries.
			want: Figures{QueueDepth: 3, Running: 10, KVTotalBlocks: 1000, KVFreeBlocks: 700, BlockTokens: 16},
		},
		{
			file: "vllm_missing.txt", kind: KindVLLM,
			want: Figures{Running: 1, KVTotalBlocks: 1, KVFreeBlocks: 1, BlockTokens: 16,
				Missing: []string{FigureQueueDepth, FigureKVTotalBlocks, FigureKVFreeBlocks}},
		},
		{
			file: "sglang.txt", kind: KindSGLang,
			// 500000 tokens in pages of 1 at 28% usage.
			want: Figures{QueueDepth: 4, Running: 12, KVTotalBlocks: 500000, KVFreeBlocks: 360000, BlockTokens: 1},
		},
		{
			file: "sglang_ranks.txt", kind: KindSGLang,
			// Two TP ranks of one scheduler count once; 200000 tokens in pages of 16.
			want: Figures{QueueDepth: 2, Running: 3, KVTotalBlocks: 12500, KVFreeBlocks: 6250, BlockTokens: 16},
		},
		{
			file: "llamacpp_legacy.txt", kind: KindLlamaCpp,
			// 1024 tokens are 25% of the cache: 4096 cells.
			want: Figures{QueueDepth: 1, Running: 2, KVTotalBlocks: 4096, KVFreeBlocks: 3072, BlockTokens: 1},
		},
		{
			file: "llamacpp_current.txt", kind: KindLlamaCpp,
			want: Figures{Running: 1, KVTotalBlocks: 1, KVFreeBlocks: 1, BlockTokens: 1,
				Missing: []string{FigureKVTotalBlocks, FigureKVFreeBlocks}},
		},
		{
			// Another engine's metrics: nothing of the kind's is there.
			file: "sglang.txt", kind: KindVLLM,
			want: Figures{KVTotalBlocks: 1, KVFreeBlocks: 1, BlockTokens: 16, Missing: allMissing},
		},
		{
			// The generic kind reads nothing, even text that would not parse.
			file: "malformed_value.txt", kind: KindOpenAI,
			want: Figures{KVTotalBlocks: 1, KVFreeBlocks: 1, BlockTokens: 16, Missing: allMissing},
		},
	}
	for _, tt := range tests {
		t.Run(string(tt.kind)+"/"+tt.file, func(t *testing.T) {
			got, err := ParseMetrics(tt.kind, bytes.NewReader(fixture(t, tt.file)))
			if err != nil {
				t.Fatalf("ParseMetrics: %v", err)
			}
			got.Counters = nil // TestCountersShowRestart
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseMetrics =\n %+v\nwant\n %+v", got, tt.want)
			}
		})
	}
}

func TestParseMetricsInline(t *testing.T) {
	tests := []struct {
		name      string
		kind      Kind
		text      string
		ctxTokens uint32
		want      Figures
	}{
		{
			name: "empty exposition falls back",
			kind: KindSGLang,
			want: Figures{KVTotalBlocks: 1, KVFreeBlocks: 1, BlockTokens: 1, Missing: allMissing},
		},
		{
			name: "capacity without usage keeps every block free",
			kind: KindVLLM,
			text: "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"64\"} 1\n",
			want: Figures{KVTotalBlocks: 64, KVFreeBlocks: 64, BlockTokens: 16, Missing: []string{FigureKVFreeBlocks}},
		},
		{
			name: "zero capacity counts as missing",
			kind: KindVLLM,
			text: "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:cache_config_info{num_gpu_blocks=\"0\"} 1\nvllm:kv_cache_usage_perc 0\n",
			want: Figures{KVTotalBlocks: 1, KVFreeBlocks: 1, BlockTokens: 16, Missing: []string{FigureKVTotalBlocks, FigureKVFreeBlocks}},
		},
		{
			name: "usage above one is clamped to a full cache",
			kind: KindVLLM,
			text: "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:cache_config_info{num_gpu_blocks=\"10\"} 1\nvllm:kv_cache_usage_perc 1.7\n",
			want: Figures{KVTotalBlocks: 10, KVFreeBlocks: 0, BlockTokens: 16},
		},
		{
			name: "the new usage name wins over the old one",
			kind: KindVLLM,
			text: "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:cache_config_info{num_gpu_blocks=\"10\"} 1\nvllm:kv_cache_usage_perc 0.1\nvllm:gpu_cache_usage_perc 0.9\n",
			want: Figures{KVTotalBlocks: 10, KVFreeBlocks: 9, BlockTokens: 16},
		},
		{
			name: "NaN and negative samples",
			kind: KindVLLM,
			text: "vllm:num_requests_waiting NaN\nvllm:num_requests_running -2\nvllm:cache_config_info{num_gpu_blocks=\"10\"} 1\nvllm:kv_cache_usage_perc NaN\n",
			want: Figures{KVTotalBlocks: 10, KVFreeBlocks: 10, BlockTokens: 16, Missing: []string{FigureQueueDepth, FigureKVFreeBlocks}},
		},
		{
			name: "counts beyond uint32 saturate",
			kind: KindSGLang,
			text: "sglang:num_queue_reqs 1e12\nsglang:num_running_reqs 0\n",
			want: Figures{QueueDepth: 4294967295, KVTotalBlocks: 1, KVFreeBlocks: 1, BlockTokens: 1, Missing: []string{FigureKVTotalBlocks, FigureKVFreeBlocks}},
		},
		{
			name: "sglang used tokens when token_usage is absent",
			kind: KindSGLang,
			text: "sglang:num_queue_reqs 0\nsglang:num_running_reqs 1\nsglang:max_total_num_tokens 1000\nsglang:num_used_tokens 250\n",
			want: Figures{Running: 1, KVTotalBlocks: 1000, KVFreeBlocks: 750, BlockTokens: 1},
		},
		{
			name: "sglang data-parallel ranks are summed",
			kind: KindSGLang,
			text: "sglang:num_queue_reqs{dp_rank=\"0\"} 1\nsglang:num_queue_reqs{dp_rank=\"1\"} 2\nsglang:num_running_reqs{dp_rank=\"0\"} 3\nsglang:num_running_reqs{dp_rank=\"1\"} 4\n" +
				"sglang:max_total_num_tokens{dp_rank=\"0\"} 100\nsglang:max_total_num_tokens{dp_rank=\"1\"} 100\nsglang:token_usage{dp_rank=\"0\"} 0.1\nsglang:token_usage{dp_rank=\"1\"} 0.3\n",
			want: Figures{QueueDepth: 3, Running: 7, KVTotalBlocks: 200, KVFreeBlocks: 160, BlockTokens: 1},
		},
		{
			name:      "llama.cpp context from /props sets the capacity",
			kind:      KindLlamaCpp,
			text:      string(fixture(t, "llamacpp_current.txt")),
			ctxTokens: 8192,
			want:      Figures{Running: 1, KVTotalBlocks: 8192, KVFreeBlocks: 8192, BlockTokens: 1, Missing: []string{FigureKVFreeBlocks}},
		},
		{
			name:      "llama.cpp usage ratio applies to the /props context",
			kind:      KindLlamaCpp,
			text:      string(fixture(t, "llamacpp_legacy.txt")),
			ctxTokens: 8192,
			want:      Figures{QueueDepth: 1, Running: 2, KVTotalBlocks: 8192, KVFreeBlocks: 6144, BlockTokens: 1},
		},
		{
			name: "llama.cpp idle cache gives no capacity but known usage",
			kind: KindLlamaCpp,
			text: "llamacpp:kv_cache_usage_ratio 0\nllamacpp:kv_cache_tokens 0\nllamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n",
			want: Figures{KVTotalBlocks: 1, KVFreeBlocks: 1, BlockTokens: 1, Missing: []string{FigureKVTotalBlocks, FigureKVFreeBlocks}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMetrics(tt.kind, strings.NewReader(tt.text), tt.ctxTokens)
			if err != nil {
				t.Fatalf("parseMetrics: %v", err)
			}
			got.Counters = nil // TestCountersShowRestart
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("parseMetrics =\n %+v\nwant\n %+v", got, tt.want)
			}
		})
	}
}

func TestParseMetricsMalformed(t *testing.T) {
	tests := []struct {
		file string
		kind Kind
	}{
		{"malformed_value.txt", KindVLLM},
		{"malformed_label.txt", KindVLLM},
		{"malformed_type.txt", KindSGLang},
		{"malformed_html.txt", KindLlamaCpp},
		{"malformed_truncated.txt", KindVLLM}, // cut before the final line feed
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			_, err := ParseMetrics(tt.kind, bytes.NewReader(fixture(t, tt.file)))
			if !errors.Is(err, ErrMalformedMetrics) {
				t.Fatalf("ParseMetrics error = %v, want ErrMalformedMetrics", err)
			}
		})
	}
}

func TestParseMetricsUnknownKind(t *testing.T) {
	_, err := ParseMetrics("tgi", strings.NewReader(""))
	if !errors.Is(err, ErrUnknownKind) {
		t.Fatalf("error = %v, want ErrUnknownKind", err)
	}
}

func BenchmarkParseMetrics(b *testing.B) {
	for _, bc := range []struct {
		file string
		kind Kind
	}{{"vllm_v1.txt", KindVLLM}, {"sglang.txt", KindSGLang}, {"llamacpp_current.txt", KindLlamaCpp}} {
		text := fixture(b, bc.file)
		kind := bc.kind
		b.Run(bc.file, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParseMetrics(kind, bytes.NewReader(text)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParseMetricsLarge parses a vLLM exposition the size of a busy
// data-parallel server's (about 130 kB: 20 histograms of 30 buckets for two
// engines on top of vllm_v1.txt).
func BenchmarkParseMetricsLarge(b *testing.B) {
	var sb strings.Builder
	sb.Write(fixture(b, "vllm_v1.txt"))
	const labels = `model_name="meta-llama/Llama-3.1-8B-Instruct"`
	for h := range 20 {
		fmt.Fprintf(&sb, "# HELP vllm:h%d_seconds A histogram.\n# TYPE vllm:h%d_seconds histogram\n", h, h)
		for e := range 2 {
			for k := range 30 {
				fmt.Fprintf(&sb, "vllm:h%d_seconds_bucket{engine=\"%d\",le=\"%d.0\",%s} %d.0\n", h, e, k, labels, k)
			}
			fmt.Fprintf(&sb, "vllm:h%d_seconds_bucket{engine=\"%d\",le=\"+Inf\",%s} 30.0\n", h, e, labels)
			fmt.Fprintf(&sb, "vllm:h%d_seconds_count{engine=\"%d\",%s} 30.0\n", h, e, labels)
			fmt.Fprintf(&sb, "vllm:h%d_seconds_sum{engine=\"%d\",%s} 12.5\n", h, e, labels)
		}
	}
	text := []byte(sb.String())
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseMetrics(KindVLLM, bytes.NewReader(text)); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCountersShowRestart: the counters of llama.cpp's /metrics are read,
// and one going backwards between two probes is a restart, which the
// prober reports as a start time of that probe (0 until then).
func TestCountersShowRestart(t *testing.T) {
	f, err := ParseMetrics(KindLlamaCpp, bytes.NewReader(fixture(t, "llamacpp_current.txt")))
	if err != nil {
		t.Fatal(err)
	}
	if f.Counters["llamacpp:prompt_tokens_total"] != 96641 || f.Counters["llamacpp:tokens_predicted_total"] != 23210 {
		t.Fatalf("counters %v", f.Counters)
	}
	p := New(Config{ID: "w", HTTPAddress: "127.0.0.1:1", Kind: KindLlamaCpp})
	t0 := time.Unix(1_000_000, 0)
	steps := []struct {
		counters map[string]float64
		want     uint64
	}{
		{map[string]float64{"a": 10, "b": 5}, 0},
		{map[string]float64{"a": 12, "b": 5}, 0},
		{nil, 0}, // metrics unusable: nothing learnt
		{map[string]float64{"a": 12, "b": 6}, 0},
		{map[string]float64{"a": 1, "b": 0}, uint64(t0.Add(4 * time.Second).UnixMilli())},
		{map[string]float64{"a": 3, "b": 1}, uint64(t0.Add(4 * time.Second).UnixMilli())},
	}
	for i, st := range steps {
		if got := p.incarnation(st.counters, t0.Add(time.Duration(i)*time.Second)); got != st.want {
			t.Fatalf("probe %d: started %d, want %d", i, got, st.want)
		}
	}
}
