package enginesim

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// stepConfig returns a step-mode engine configuration on a virtual clock:
// the preset's cost model, steps that take no real time.
func stepConfig(c Config) Config {
	step := PresetLlama8BH100.Step
	step.Clock = NewVirtualClock(time.Unix(0, 0))
	c.Step = &step
	return c
}

// TestStepModeServesLikeFlat checks that the step scheduler changes when
// tokens come, never which: concurrent requests (streamed or not, chat or
// not, with logprobs and stop strings) answer exactly as on a flat
// engine, and prefill/decode engines on the step scheduler equal a
// unified one. Afterwards no block is held and the steps and latency
// histograms are counted.
func TestStepModeServesLikeFlat(t *testing.T) {
	flat := startEngine(t, Config{Model: "m"})
	step := startEngine(t, stepConfig(Config{Model: "m", KVBlocks: 64, MaxRunning: 4}))
	x := startPD(t, stepConfig(Config{Model: "m"}), stepConfig(Config{Model: "m"}))
	c := newClient(t)
	prompt := unsurePrompt(t, flat)
	var wg sync.WaitGroup
	for i := range 12 {
		chat, stream := i%2 == 0, i%3 == 0
		extra := map[string]any{"seed": i, "max_tokens": 30 + i, "logprobs": 2, "stream": stream}
		if i%4 == 1 {
			extra["stop"] = []string{" the"}
		}
		body := completionBody("m", fmt.Sprint(prompt, " ", i), extra)
		if chat {
			extra["logprobs"], extra["top_logprobs"] = true, 2
			body = chatBody("m", fmt.Sprint(prompt, " ", i), extra)
		}
		wg.Go(func() {
			want := complete(t, c, flat.URL(), chat, body)
			if got := complete(t, c, step.URL(), chat, body); !reflect.DeepEqual(got, want) {
				t.Errorf("request %d: step mode\n%+v\nflat\n%+v", i, got, want)
			}
			resp := x.prefill(t, chat, body)
			if got := complete(t, c, x.d.URL(), chat, body, HeaderKVHandle, resp.HandleId); !reflect.DeepEqual(got, want) {
				t.Errorf("request %d: disaggregated on the step scheduler\n%+v\nflat\n%+v", i, got, want)
			}
		})
	}
	wg.Wait()
	for _, e := range []*Engine{step, x.p, x.d} {
		s := e.Stats()
		if s.Running != 0 || s.Waiting != 0 || s.FreeBlocks != s.TotalBlocks || s.HeldHandles != 0 {
			t.Fatalf("%s after the requests: %+v", e.Role(), s)
		}
		if s.Steps == 0 {
			t.Fatalf("%s ran no step", e.Role())
		}
	}
	metrics := string(get(t, c, step.URL()+"/metrics").body)
	for _, m := range []string{`vllm:time_to_first_token_seconds_count{model_name="m"} 12`, `vllm:inter_token_latency_seconds_count{model_name="m"}`,
		`vllm:num_preemptions_total{model_name="m"}`, `vllm:num_requests_running{model_name="m"} 0`} {
		if !strings.Contains(metrics, m) {
			t.Fatalf("/metrics lacks %s:\n%s", m, metrics)
		}
	}
}

// TestStepModeRejectsWhatCannotFit checks the step mode's admission
// errors: a request that can never fit the KV cache is refused at once.
func TestStepModeRejectsWhatCannotFit(t *testing.T) {
	e := startEngine(t, stepConfig(Config{Model: "m", KVBlocks: 2}))
	c := newClient(t)
	r := post(t, c, e.URL()+"/v1/completions", completionBody("m", "hello", map[string]any{"max_tokens": 40}))
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "context_length_exceeded") {
		t.Fatalf("%d %s", r.status, r.body)
	}
}
