package config

import (
	"strings"
	"testing"
	"time"
)

func TestOverloadDefaultsAndValidation(t *testing.T) {
	c, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	e, a := c.Gateway.Ejection, c.Gateway.Admission
	if e.ConsecutiveFailures != 3 || e.ConsecutiveRefused != 1 || e.BaseTime.Duration != 10*time.Second || e.MaxTime.Duration != 5*time.Minute || e.MaxPercent != 50 {
		t.Errorf("ejection defaults %+v", e)
	}
	if !a.Enabled || a.LimitScope != LimitScopePool || a.SaturationQueueDepth != 5 || a.SaturationKVUse != 0 || a.SaturationTTFT.Duration != 0 ||
		a.WorkerConcurrency != 0 || a.QueueSize != 1024 || a.QueueTimeout.Duration != 30*time.Second {
		t.Errorf("admission defaults %+v", a)
	}
	ok, err := Parse([]byte("[gateway.admission]\nmodel_concurrency = { \"smol-v3\" = 8 }\nengine_concurrency = { \"gpu-3\" = 4 }\n"))
	if err != nil {
		t.Fatal(err)
	}
	if ok.Gateway.Admission.ModelConcurrency["smol-v3"] != 8 || ok.Gateway.Admission.EngineConcurrency["gpu-3"] != 4 {
		t.Errorf("overrides %+v", ok.Gateway.Admission)
	}
	cases := []struct{ toml, want string }{
		{"[gateway.ejection]\nconsecutive_failures = 0", "gateway.ejection.consecutive_failures: must be >= 1"},
		{"[gateway.ejection]\nconsecutive_refused = 0", "gateway.ejection.consecutive_refused: must be >= 1"},
		{"[gateway.ejection]\nbase_time = \"0s\"", "gateway.ejection.base_time: must be > 0"},
		{"[gateway.ejection]\nbase_time = \"1m\"\nmax_time = \"10s\"", "gateway.ejection.max_time: must be >= base_time"},
		{"[gateway.ejection]\nmax_percent = 101", "gateway.ejection.max_percent: must be from 0 to 100"},
		{"[gateway.admission]\nworker_concurrency = -1", "gateway.admission.worker_concurrency: must be >= 0"},
		{"[gateway.admission]\nmodel_concurrency = { \"m\" = 0 }", "gateway.admission.model_concurrency.m: must be >= 1"},
		{"[gateway.admission]\nengine_concurrency = { \"a b\" = 2 }", "gateway.admission.engine_concurrency.a b: invalid id"},
		{"[gateway.admission]\nqueue_size = -1", "gateway.admission.queue_size: must be >= 0"},
		{"[gateway.admission]\nqueue_timeout = \"0s\"", "gateway.admission.queue_timeout: must be > 0"},
		{"[gateway.admission]\nqueue_depth = 3", "unknown key gateway.admission.queue_depth"},
		{"[gateway.admission]\nlimit_scope = \"fleet\"", `gateway.admission.limit_scope: must be "pool" or "worker", got "fleet"`},
		{"[gateway.admission]\nsaturation_queue_depth = -1", "gateway.admission.saturation_queue_depth: must be >= 0"},
		{"[gateway.admission]\nsaturation_kv_use = 1.5", "gateway.admission.saturation_kv_use: must be from 0"},
		{"[gateway.admission]\nsaturation_ttft = \"-1s\"", "gateway.admission.saturation_ttft: must be >= 0"},
		{"[[gateway.api_keys]]\nname = \"a\"\nkey = \"s\"\nscopes = [\"inference\"]\npriority = 5\nmax_priority = 1", "gateway.api_keys[0].priority: must be <= max_priority (1), got 5"},
		{"[[gateway.api_keys]]\nname = \"a\"\nkey = \"s\"\nscopes = [\"inference\"]\nmax_priority = 2000000", "gateway.api_keys[0].max_priority: must be from -1000000 to 1000000"},
		{"[[gateway.api_keys]]\nname = \"a\"\nkey = \"s\"\nscopes = [\"inference\"]\nttft_objective_ms = -5", "gateway.api_keys[0].ttft_objective_ms: must be from 0 (none)"},
		{"[[gateway.routes]]\nmodel = \"m\"\npriority = -2000000", "routes[0].priority: must be from -1000000"},
		{"[[gateway.routes]]\nmodel = \"m\"\nttft_objective_ms = 4000000", "routes[0].ttft_objective_ms: must be from 0 (none) to 3600000"},
	}
	for _, tc := range cases {
		_, err := Parse([]byte(tc.toml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.toml, err, tc.want)
		}
	}
}
