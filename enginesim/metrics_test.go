package enginesim

import (
	"bytes"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func scrape(t *testing.T, e *Engine) map[string]*dto.MetricFamily {
	t.Helper()
	r := get(t, newClient(t), e.URL()+"/metrics")
	if r.status != 200 {
		t.Fatalf("GET /metrics: %d", r.status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mf, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, r.body)
	}
	return mf
}

func value(t *testing.T, mf map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	f, ok := mf[name]
	if !ok {
		t.Fatalf("metric %s not served", name)
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		}
	}
	t.Fatalf("metric %s has no sample with labels %v", name, labels)
	return 0
}

func TestMetricsVLLMNames(t *testing.T) {
	e := startEngine(t, Config{Model: "m", KVBlocks: 123})
	c := newClient(t)
	body := completionBody("m", "a prompt of a couple of dozen tokens to fill at least one block of the cache", map[string]any{"max_tokens": 3})
	complete(t, c, e.URL(), false, body)
	complete(t, c, e.URL(), false, body)
	s := e.Stats()

	mf := scrape(t, e)
	model := map[string]string{"model_name": "m"}
	tests := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"vllm:num_requests_waiting", model, 0},
		{"vllm:num_requests_running", model, 0},
		{"vllm:kv_cache_usage_perc", model, 0},
		{"vllm:cache_config_info", map[string]string{"num_gpu_blocks": "123", "block_size": "16"}, 1},
		{"vllm:prefix_cache_queries_total", model, float64(s.PrefixQueries)},
		{"vllm:prefix_cache_hits_total", model, float64(s.PrefixHits)},
		{"vllm:prompt_tokens_total", model, float64(s.PromptTokens)},
		{"vllm:generation_tokens_total", model, 6},
		{"vllm:request_success_total", map[string]string{"finished_reason": "length"}, 2},
		{"enginesim_kv_held_handles", model, 0},
		{"enginesim_draining", model, 0},
	}
	for _, tt := range tests {
		if got := value(t, mf, tt.name, tt.labels); got != tt.want {
			t.Errorf("%s%v = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}
	if s.PrefixHits == 0 || s.PrefixQueries == 0 {
		t.Fatalf("the repeated prompt did not hit the cache: %+v", s)
	}
	if f := mf["vllm:prefix_cache_hits_total"]; f.GetType() != dto.MetricType_COUNTER {
		t.Fatalf("prefix_cache_hits_total is a %v", f.GetType())
	}

	// Usage reflects held KV.
	x := startPD(t, Config{Model: "m"}, Config{Model: "m", KVBlocks: 10})
	resp := x.prefill(t, false, completionBody("m", "a held prompt", map[string]any{"seed": 1}))
	mf = scrape(t, x.d)
	if got, want := value(t, mf, "vllm:kv_cache_usage_perc", model), float64(resp.NumBlocks)/10; got != want {
		t.Fatalf("kv_cache_usage_perc %v, want %v", got, want)
	}
	if got := value(t, mf, "enginesim_kv_held_blocks", model); got != float64(resp.NumBlocks) {
		t.Fatalf("held blocks %v", got)
	}
}
