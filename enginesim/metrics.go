package enginesim

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metricsRegistry returns a registry (one per engine, no globals) whose
// collector reads the engine's figures at scrape time under vLLM's names.
func (e *Engine) metricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(e), e.latency.ttft, e.latency.itl)
	return reg
}

// latencyMetrics are vLLM's latency histograms, observed per token: by the
// step scheduler on its clock, or by the flat mode's requests.
type latencyMetrics struct {
	ttft, itl prometheus.Histogram
}

func newLatencyMetrics(model string) latencyMetrics {
	labels := prometheus.Labels{"model_name": model}
	return latencyMetrics{
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:time_to_first_token_seconds", Help: "Histogram of time to first token in seconds.",
			ConstLabels: labels,
			Buckets: []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
				2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0},
		}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:inter_token_latency_seconds", Help: "Histogram of inter-token latency in seconds.",
			ConstLabels: labels,
			Buckets: []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
				2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0},
		}),
	}
}

// observe records a token: the first of its request (since arrival) or a
// later one (since the previous).
func (m latencyMetrics) observe(first bool, since time.Duration) {
	if first {
		m.ttft.Observe(since.Seconds())
	} else {
		m.itl.Observe(since.Seconds())
	}
}

type collector struct {
	e                                                 *Engine
	waiting, running, usage, cacheInfo                *prometheus.Desc
	queries, hits, prompt, generation, success        *prometheus.Desc
	heldHandles, heldBlocks, draining, prefills, rels *prometheus.Desc
	preemptions, steps                                *prometheus.Desc
}

func newCollector(e *Engine) *collector {
	model := prometheus.Labels{"model_name": e.cfg.Model}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, model)
	}
	return &collector{
		e:           e,
		waiting:     d("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		running:     d("vllm:num_requests_running", "Number of requests in model execution batches."),
		usage:       d("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		cacheInfo:   d("vllm:cache_config_info", "Information of the KV cache config.", "block_size", "num_gpu_blocks", "enable_prefix_caching"),
		queries:     d("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		hits:        d("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		prompt:      d("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generation:  d("vllm:generation_tokens_total", "Number of generation tokens processed."),
		success:     d("vllm:request_success_total", "Count of successfully processed requests.", "finished_reason"),
		heldHandles: d("enginesim_kv_held_handles", "KV handles pushed to this decode engine and not yet resumed, released or expired."),
		heldBlocks:  d("enginesim_kv_held_blocks", "KV blocks held for those handles."),
		draining:    d("enginesim_draining", "1 while the engine is draining."),
		prefills:    d("enginesim_prefills_total", "Prefill calls answered."),
		rels:        d("enginesim_kv_releases_total", "KV Release calls received."),
		preemptions: d("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		steps:       d("enginesim_steps_total", "Steps the step scheduler ran (0 in the flat mode)."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.waiting, c.running, c.usage, c.cacheInfo, c.queries, c.hits,
		c.prompt, c.generation, c.success, c.heldHandles, c.heldBlocks, c.draining, c.prefills, c.rels,
		c.preemptions, c.steps} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.e.Stats()
	c.e.core.mu.Lock()
	length, stop := c.e.core.counters.finishedLength, c.e.core.counters.finishedStop
	c.e.core.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.waiting, float64(s.Waiting))
	gauge(c.running, float64(s.Running))
	usage := 0.0
	if s.TotalBlocks > 0 {
		usage = float64(s.TotalBlocks-s.FreeBlocks) / float64(s.TotalBlocks)
	}
	gauge(c.usage, usage)
	gauge(c.cacheInfo, 1, strconv.Itoa(BlockTokens), strconv.Itoa(s.TotalBlocks), "True")
	counter(c.queries, s.PrefixQueries)
	counter(c.hits, s.PrefixHits)
	counter(c.prompt, s.PromptTokens)
	counter(c.generation, s.GenerationTokens)
	counter(c.success, length, finishLength)
	counter(c.success, stop, finishStop)
	gauge(c.heldHandles, float64(s.HeldHandles))
	gauge(c.heldBlocks, float64(s.HeldBlocks))
	draining := 0.0
	if s.Draining {
		draining = 1
	}
	gauge(c.draining, draining)
	counter(c.prefills, s.Prefills)
	counter(c.rels, s.Releases)
	counter(c.preemptions, s.Preemptions)
	counter(c.steps, s.Steps)
}
