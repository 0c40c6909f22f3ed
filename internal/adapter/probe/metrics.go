package probe

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The names ParseMetrics writes in Figures.Missing, one per figure that fell
// back because the engine did not report it. They are the WorkerStatus field
// names the figures go to.
const (
	FigureQueueDepth    = "queue_depth"
	FigureRunning       = "running"
	FigureKVTotalBlocks = "kv_total_blocks"
	FigureKVFreeBlocks  = "kv_free_blocks"
)

// Figures are the load figures read from one engine's /metrics, in the units
// of a WorkerStatus.
//
// A figure the engine does not report falls back and is named in Missing:
// QueueDepth 0, Running 0, KVTotalBlocks 1 (the smallest weight the weighted
// policy can use) and KVFreeBlocks equal to KVTotalBlocks (nothing known to
// be in use). A capacity of 0 counts as not reported.
type Figures struct {
	QueueDepth    uint32 // requests waiting in the engine's queue
	Running       uint32 // requests being processed now
	KVTotalBlocks uint32 // KV capacity in blocks of BlockTokens tokens
	KVFreeBlocks  uint32 // KV blocks not in use, at most KVTotalBlocks
	// BlockTokens is the number of tokens per block in KVTotalBlocks and
	// KVFreeBlocks: vLLM's block_size (label of vllm:cache_config_info,
	// default 16), SGLang's sglang:page_size (default 1), 1 for llama.cpp's
	// token cells, 16 for the generic kind.
	BlockTokens uint32
	// StartedAtUnixMs is process_start_time_seconds in milliseconds when the
	// engine exports it (Python servers do), else 0.
	StartedAtUnixMs uint64
	// Missing names the figures that fell back (Figure* constants), in the
	// order queue_depth, running, kv_total_blocks, kv_free_blocks.
	Missing []string
	// Counters is the total of each counter family the engine exports
	// (llamacpp:prompt_tokens_total...), by name: one that went backwards
	// since the last probe shows that the engine restarted.
	Counters map[string]float64
}

// fallbackFigures are the figures of an engine that reports none of them.
func fallbackFigures(kind Kind) Figures {
	return Figures{
		KVTotalBlocks: 1,
		KVFreeBlocks:  1,
		BlockTokens:   kind.defaultBlockTokens(),
		Missing:       []string{FigureQueueDepth, FigureRunning, FigureKVTotalBlocks, FigureKVFreeBlocks},
	}
}

// ParseMetrics reads a Prometheus text exposition (format 0.0.4, what the
// engines serve on /metrics) and maps the kind's metrics to Figures.
//
// vLLM: queue vllm:num_requests_waiting; running vllm:num_requests_running;
// capacity the num_gpu_blocks label of vllm:cache_config_info (in blocks of
// its block_size label); in use vllm:kv_cache_usage_perc, or the older
// vllm:gpu_cache_usage_perc, a fraction of the capacity. With data
// parallelism the server adds up its engines' blocks into one cache config
// at startup and exports that config once per engine: each series carries
// the server's whole capacity, so the largest is taken, not their sum.
//
// SGLang: queue sglang:num_queue_reqs; running sglang:num_running_reqs;
// capacity sglang:max_total_num_tokens divided by sglang:page_size (1, its
// default, when not exported); in use sglang:token_usage, a fraction, or
// else sglang:num_used_tokens.
//
// llama.cpp: queue llamacpp:requests_deferred; running
// llamacpp:requests_processing; capacity llamacpp:kv_cache_tokens divided by
// llamacpp:kv_cache_usage_ratio (only while the ratio is above 0), in
// one-token cells; in use the ratio, or else llamacpp:kv_cache_tokens.
//
// Other counts (queue, running, SGLang's capacity, tokens in use) are
// summed over an engine's series, which vLLM splits per engine
// (data-parallel rank) and SGLang per data-parallel rank; usage fractions
// are averaged over them.
// SGLang series that differ only in tp_rank, pp_rank or moe_ep_rank describe
// the same scheduler and count once. Current llama.cpp builds no longer
// export the two KV gauges; the Prober then takes the capacity from the
// n_ctx of GET /props. The generic kind has no metrics: its figures are all
// fallbacks and r is not read.
//
// Text that does not parse is an error wrapping ErrMalformedMetrics (that
// includes text cut before its final line feed, as a truncated answer is);
// well-formed text without the kind's metrics gives fallback figures (see
// Figures) and no error.
func ParseMetrics(kind Kind, r io.Reader) (Figures, error) {
	return parseMetrics(kind, r, 0)
}

// parseMetrics is ParseMetrics with the llama.cpp context size from /props
// (0 when unknown), which takes precedence as the KV capacity in tokens.
func parseMetrics(kind Kind, r io.Reader, ctxTokens uint32) (Figures, error) {
	switch kind {
	case KindOpenAI:
		return fallbackFigures(kind), nil
	case KindVLLM, KindSGLang, KindLlamaCpp:
	default:
		return Figures{}, fmt.Errorf("probe: %w %q", ErrUnknownKind, kind)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return Figures{}, fmt.Errorf("probe: %w: %w", ErrMalformedMetrics, err)
	}
	fams := families(mfs)
	var f Figures
	switch kind {
	case KindVLLM:
		f = fams.vllm()
	case KindSGLang:
		f = fams.sglang()
	case KindLlamaCpp:
		f = fams.llamacpp(ctxTokens)
	}
	if start, ok := fams.min("process_start_time_seconds"); ok && start > 0 && start < math.MaxUint64/1000 {
		f.StartedAtUnixMs = uint64(math.Round(start * 1000))
	}
	f.Counters = fams.counters()
	return f, nil
}

// counters totals every counter family (at most maxCounters of them).
func (fs families) counters() map[string]float64 {
	const maxCounters = 64
	var out map[string]float64
	for name, mf := range fs {
		if mf.GetType() != dto.MetricType_COUNTER || len(out) == maxCounters {
			continue
		}
		if r := fs.sum(name); r.ok && !math.IsNaN(r.v) {
			if out == nil {
				out = map[string]float64{}
			}
			out[name] = r.v
		}
	}
	return out
}

// wentBackwards reports whether a counter of now is below its value in
// before: the engine's process restarted between the two readings.
func wentBackwards(before, now map[string]float64) bool {
	for name, v := range now {
		if b, ok := before[name]; ok && v < b {
			return true
		}
	}
	return false
}

// reading is one figure as read: ok is false when the engine did not report it.
type reading struct {
	v  float64
	ok bool
}

// some is a reading of v.
func some(v float64) reading { return reading{v: v, ok: true} }

// families are the parsed metric families by name.
type families map[string]*dto.MetricFamily

// sglangRankLabels are the labels that tell apart series of the same SGLang
// scheduler reported by each tensor, pipeline or expert parallel rank.
var sglangRankLabels = []string{"tp_rank", "pp_rank", "moe_ep_rank"}

func (fs families) vllm() Figures {
	const info = "vllm:cache_config_info"
	total := fs.labelMax(info, "num_gpu_blocks")
	used := reading{}
	frac := fs.mean("vllm:kv_cache_usage_perc")
	if !frac.ok {
		frac = fs.mean("vllm:gpu_cache_usage_perc")
	}
	if frac.ok && total.ok {
		used = some(clamp01(frac.v) * total.v)
	}
	blockTokens := KindVLLM.defaultBlockTokens()
	if bs := fs.labelFirst(info, "block_size"); bs.ok && bs.v >= 1 && bs.v <= math.MaxUint32 {
		blockTokens = uint32(bs.v)
	}
	return assemble(fs.sum("vllm:num_requests_waiting"), fs.sum("vllm:num_requests_running"), total, used, blockTokens)
}

func (fs families) sglang() Figures {
	page := 1.0
	if ps := fs.first("sglang:page_size"); ps.ok && ps.v >= 1 && ps.v <= math.MaxUint32 {
		page = math.Floor(ps.v)
	}
	total := reading{}
	if tokens := fs.sum("sglang:max_total_num_tokens", sglangRankLabels...); tokens.ok {
		total = some(math.Floor(tokens.v / page))
	}
	used := reading{}
	if frac := fs.mean("sglang:token_usage", sglangRankLabels...); frac.ok && total.ok {
		used = some(clamp01(frac.v) * total.v)
	} else if tokens := fs.sum("sglang:num_used_tokens", sglangRankLabels...); tokens.ok {
		used = some(tokens.v / page)
	}
	return assemble(fs.sum("sglang:num_queue_reqs", sglangRankLabels...), fs.sum("sglang:num_running_reqs", sglangRankLabels...),
		total, used, uint32(page))
}

func (fs families) llamacpp(ctxTokens uint32) Figures {
	ratio := fs.mean("llamacpp:kv_cache_usage_ratio")
	tokens := fs.sum("llamacpp:kv_cache_tokens")
	total := reading{}
	switch {
	case ctxTokens > 0:
		total = some(float64(ctxTokens))
	case ratio.ok && tokens.ok && ratio.v > 0 && ratio.v <= 1:
		total = some(math.Round(tokens.v / ratio.v))
	}
	used := reading{}
	switch {
	case ratio.ok && total.ok:
		used = some(clamp01(ratio.v) * total.v)
	case tokens.ok:
		used = tokens
	}
	return assemble(fs.sum("llamacpp:requests_deferred"), fs.sum("llamacpp:requests_processing"),
		total, used, KindLlamaCpp.defaultBlockTokens())
}

// assemble turns readings into Figures, applying the fallbacks.
func assemble(queue, running, total, used reading, blockTokens uint32) Figures {
	f := Figures{BlockTokens: blockTokens}
	var ok bool
	if f.QueueDepth, ok = count(queue); !ok {
		f.Missing = append(f.Missing, FigureQueueDepth)
	}
	if f.Running, ok = count(running); !ok {
		f.Missing = append(f.Missing, FigureRunning)
	}
	if f.KVTotalBlocks, ok = count(total); !ok || f.KVTotalBlocks == 0 {
		f.KVTotalBlocks, f.KVFreeBlocks = 1, 1
		f.Missing = append(f.Missing, FigureKVTotalBlocks, FigureKVFreeBlocks)
		return f
	}
	inUse, ok := count(used)
	if !ok {
		f.Missing = append(f.Missing, FigureKVFreeBlocks)
	}
	f.KVFreeBlocks = f.KVTotalBlocks - min(inUse, f.KVTotalBlocks)
	return f
}

// count rounds a reading to a uint32, clamping it into range; it is not ok
// when the reading is missing or not a number.
func count(r reading) (uint32, bool) {
	if !r.ok || math.IsNaN(r.v) {
		return 0, false
	}
	v := math.Round(r.v)
	switch {
	case v <= 0:
		return 0, true
	case v >= math.MaxUint32:
		return math.MaxUint32, true
	}
	return uint32(v), true
}

// clamp01 bounds a fraction to [0, 1].
func clamp01(v float64) float64 { return min(max(v, 0), 1) }

// values returns the value of each series of name, skipping histograms,
// summaries and NaN samples. Series whose labels are equal once the collapse
// labels are dropped count once, with their largest value.
func (fs families) values(name string, collapse ...string) []float64 {
	mf := fs[name]
	if mf == nil {
		return nil
	}
	var (
		out  []float64
		keys map[string]int
	)
	if len(collapse) > 0 {
		keys = make(map[string]int)
	}
	for _, m := range mf.GetMetric() {
		v, ok := sampleValue(m)
		if !ok || math.IsNaN(v) {
			continue
		}
		if keys == nil {
			out = append(out, v)
			continue
		}
		key := labelKey(m, collapse)
		if i, seen := keys[key]; seen {
			out[i] = max(out[i], v)
			continue
		}
		keys[key] = len(out)
		out = append(out, v)
	}
	return out
}

// sum adds the series of name (see values).
func (fs families) sum(name string, collapse ...string) reading {
	return total(fs.values(name, collapse...))
}

// mean averages the series of name (see values).
func (fs families) mean(name string, collapse ...string) reading {
	vs := fs.values(name, collapse...)
	s := total(vs)
	if s.ok {
		s.v /= float64(len(vs))
	}
	return s
}

// total adds vs; it is not ok when vs is empty.
func total(vs []float64) reading {
	if len(vs) == 0 {
		return reading{}
	}
	var s float64
	for _, v := range vs {
		s += v
	}
	return some(s)
}

// first is the first series of name.
func (fs families) first(name string) reading {
	if vs := fs.values(name); len(vs) > 0 {
		return some(vs[0])
	}
	return reading{}
}

// min is the smallest series of name.
func (fs families) min(name string) (float64, bool) {
	vs := fs.values(name)
	if len(vs) == 0 {
		return 0, false
	}
	return slices.Min(vs), true
}

// labelValues parses the label of every series of name as a number,
// skipping series where it is absent or not a number (vLLM writes "None"
// before the KV cache is sized).
func (fs families) labelValues(name, label string) []float64 {
	mf := fs[name]
	if mf == nil {
		return nil
	}
	var out []float64
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() != label {
				continue
			}
			if v, err := strconv.ParseFloat(strings.TrimSpace(lp.GetValue()), 64); err == nil && !math.IsNaN(v) && !math.IsInf(v, 0) {
				out = append(out, v)
			}
		}
	}
	return out
}

// labelMax is the largest numeric label of the series of name.
func (fs families) labelMax(name, label string) reading {
	if vs := fs.labelValues(name, label); len(vs) > 0 {
		return some(slices.Max(vs))
	}
	return reading{}
}

// labelFirst is the numeric label of the first series of name that has it.
func (fs families) labelFirst(name, label string) reading {
	if vs := fs.labelValues(name, label); len(vs) > 0 {
		return some(vs[0])
	}
	return reading{}
}

// sampleValue is the value of a gauge, counter or untyped sample.
func sampleValue(m *dto.Metric) (float64, bool) {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue(), true
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	}
	return 0, false
}

// labelKey renders the labels of m other than the dropped ones, in a
// canonical order, as a map key.
func labelKey(m *dto.Metric, drop []string) string {
	pairs := make([]string, 0, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		if slices.Contains(drop, lp.GetName()) {
			continue
		}
		pairs = append(pairs, strconv.Quote(lp.GetName())+"="+strconv.Quote(lp.GetValue()))
	}
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}
