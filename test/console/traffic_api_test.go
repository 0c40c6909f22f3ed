package console

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/traffic"
	"github.com/tlgate/tlgate/internal/runtime/stage"
)

// TestTrafficFedByGateway: GET /admin/v1/traffic counts what the gateway
// did: requests and latencies per route, cascade verdicts, failovers off
// a failing engine, and requests for no route under "(no route)" with
// their code. No browser needed.
func TestTrafficFedByGateway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testBudget)
	defer cancel()
	st, err := stage.Start(ctx, stage.Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		if err := st.Close(cctx); err != nil {
			t.Errorf("stage close: %v", err)
		}
	}()
	complete := func(model string, n, want int) {
		t.Helper()
		for i := 0; i < n; i++ {
			if status, err := st.Complete(ctx, model, i); err != nil || status != want {
				t.Fatalf("%s request %d: %d %v, want %d", model, i, status, err, want)
			}
		}
	}
	complete("auto", 12, 200)
	complete("nope", 3, 404)
	// One of smol-v3's two workers answers 503: requests landing there
	// (at equal load, ties go to the smallest id) fail over to the other.
	if err := st.Engines["smol-v3-a"].SetFaults(enginesim.Faults{Unavailable: true}); err != nil {
		t.Fatal(err)
	}
	complete("smol-v3", 20, 200)

	status, body, _, err := st.Do(ctx, "GET", "/admin/v1/traffic", stage.AdminKey, "")
	if err != nil || status != 200 {
		t.Fatalf("GET /admin/v1/traffic: %d %s %v", status, body, err)
	}
	var snap traffic.Snapshot
	if err := json.Unmarshal(body, &snap); err != nil {
		t.Fatal(err)
	}
	models := map[string]traffic.Totals{}
	for _, m := range snap.Models {
		models[m.Model] = m.Totals
	}
	auto := models["auto"]
	// Streamed cascade requests go to the last step unjudged: the six
	// non-streamed ones have a verdict.
	if auto.Requests != 12 || auto.CascadeAccepted+auto.CascadeEscalated != 6 || auto.Errors != 0 || auto.LatencyP50 == nil {
		t.Errorf("auto: %+v, want 12 requests, 6 cascade verdicts, a latency", auto)
	}
	if nr := models[traffic.NoRoute]; nr.Requests != 3 || nr.ErrorsByCode["model_not_found"] != 3 {
		t.Errorf("%s: %+v, want 3 model_not_found", traffic.NoRoute, nr)
	}
	// Each request that lands on the failing worker fails over, until
	// passive health ejects it.
	if s := models["smol-v3"]; s.Requests != 20 || s.Failovers == 0 || s.Failovers > 20 || s.Errors != 0 || s.TTFTP50 == nil {
		t.Errorf("smol-v3: %+v, want 20 requests, 1 to 20 failovers, no errors, a TTFT", s)
	}
	if snap.Buckets != traffic.DefaultBuckets || snap.BucketSeconds != traffic.DefaultWidth.Seconds() {
		t.Errorf("window %d × %vs", snap.Buckets, snap.BucketSeconds)
	}
}
