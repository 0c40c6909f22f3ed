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
	if a.Enabled || a.WorkerConcurrency != 0 || a.QueueSize != 1024 || a.QueueTimeout.Duration != 30*time.Second {
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
	}
	for _, tc := range cases {
		_, err := Parse([]byte(tc.toml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.toml, err, tc.want)
		}
	}
}
