package test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// TestRejectionsAreCounted: tlgate_http_rejected_total counts the edge's
// refusals by code, the auth check's 401s, 403s and 400s (two
// Authorization headers) included, and a 413 by Content-Length;
// tlgate_http_connections_refused_total counts connections over a cap.
func TestRejectionsAreCounted(t *testing.T) {
	// The refusals are counted on a gateway without a per-client cap: the
	// connections its answers close are still being closed when the next
	// request dials, and a cap of 2 would refuse that dial instead.
	gw, reg := startHardeningGateway(t, "")
	url := "http://" + gw.HTTPAddr()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	send := func(path string, body string, auth ...string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range auth {
			req.Header.Add("Authorization", a)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, want := range []struct {
		status int
		got    int
	}{
		{401, send("/v1/completions", `{}`)},
		{401, send("/v1/completions", `{}`, "Bearer nope")},
		{403, send("/v1/completions", `{}`, "Bearer key-admin")},
		{403, send("/admin/v1/models/m:drain", ``, "Bearer key-plain")},
		{400, send("/v1/completions", `{}`, "Bearer key-plain", "Bearer key-debug")},
		{413, send("/v1/completions", strings.Repeat("x", 2000), "Bearer key-plain")},
	} {
		if want.got != want.status {
			t.Fatalf("status %d, want %d", want.got, want.status)
		}
	}
	for code, want := range map[string]float64{"invalid_api_key": 2, "insufficient_scope": 2, "invalid_request": 1, "request_too_large": 1} {
		if got := counterValue(t, reg, "tlgate_http_rejected_total", "code", code); got != want {
			t.Errorf("tlgate_http_rejected_total{code=%q} = %v, want %v", code, got, want)
		}
	}

	client.CloseIdleConnections()

	// Over the per-client cap of 2: the third connection is refused.
	capped, capReg := startHardeningGateway(t, "max_connections_per_client = 2\n")
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", capped.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	eventually(t, 5*time.Second, func() bool {
		c, err := net.Dial("tcp", capped.HTTPAddr())
		if err == nil {
			c.Close()
		}
		return counterValue(t, capReg, "tlgate_http_connections_refused_total", "reason", "per_client") >= 1
	}, "a refused connection counted")
}

// startHardeningGateway starts a gateway with the test keys, a 1000-byte
// body limit and extra [gateway] lines, and its metrics registry.
func startHardeningGateway(t *testing.T, extra string) (*gateway.Gateway, *prometheus.Registry) {
	t.Helper()
	cfg, err := config.Parse([]byte(`
[gateway]
listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
max_body_bytes = 1000
` + extra))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Gateway.StateDir = t.TempDir()
	keys()(cfg)
	reg := prometheus.NewRegistry()
	gw, err := gateway.Start(context.Background(), cfg, gateway.Options{Logger: zerolog.Nop(), Registry: reg, Gatherer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := gw.Close(ctx); err != nil {
			t.Errorf("gateway close: %v", err)
		}
	})
	return gw, reg
}

// counterValue returns the value of the counter name{label=value}.
func counterValue(t *testing.T, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no series %s{%s=%q}", name, label, value)
	return 0
}

// TestRefusedBeforeRoutingKeepsItsRoute: a request refused before it got
// a target (no_capacity: its cascade route has no worker) is counted under
// the route it matched, not under route "none", which is for requests that
// matched none (404).
func TestRefusedBeforeRoutingKeepsItsRoute(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := newClusterGateway(t, cascadeRoutes, []clusterOpt{keys()}, nil, func(o *gateway.Options) { o.Registry, o.Gatherer, o.RequestHooks = reg, reg, nil })
	if r := c.post("/v1/chat/completions", "key-plain", chatMsg("hi", nil)); r.status != http.StatusServiceUnavailable {
		t.Fatalf("status %d %s, want 503 no_capacity", r.status, r.body)
	}
	if got := counter(t, reg, "tlgate_requests_total", map[string]string{"route": "auto", "outcome": "no_capacity"}); got != 1 {
		t.Fatalf("tlgate_requests_total{route=\"auto\",outcome=\"no_capacity\"} = %v, want 1", got)
	}
}

// TestAdminWritesCountDrains: tlgate_admin_writes_total counts the admin
// API's drains and resumes by outcome, besides route table PUTs: a drain
// and a resume of a served model as ok, a drain of an unknown model as
// model_not_found (404).
func TestAdminWritesCountDrains(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := newClusterGateway(t, "", []clusterOpt{keys()}, nil, func(o *gateway.Options) { o.Registry, o.Gatherer, o.RequestHooks = reg, reg, nil })
	c.addFake("w1", "m", func(w http.ResponseWriter, r *http.Request) {})
	c.drillAdmin(t, "m", "drain")
	c.drillAdmin(t, "m", "resume")
	if r := c.post("/admin/v1/models/nope:drain", "key-admin", ""); r.status != http.StatusNotFound {
		t.Fatalf("drain of an unknown model: %d %s", r.status, r.body)
	}
	ok := counterValue(t, reg, "tlgate_admin_writes_total", "outcome", "ok")
	nf := counterValue(t, reg, "tlgate_admin_writes_total", "outcome", "model_not_found")
	if ok != 2 || nf != 1 {
		t.Fatalf("tlgate_admin_writes_total{outcome=ok} = %v, {outcome=model_not_found} = %v after a drain, a resume and a drain of an unknown model; want 2 and 1", ok, nf)
	}
}
