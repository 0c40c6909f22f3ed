package test

import (
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
)

// TestDrillKillEjectsDeadEngine: a unified engine dies under a steady
// non-streamed load. Eviction is put out of the way (50 missed heartbeats,
// 10 s), so only passive health keeps requests off the dead engine: across
// the first 100 requests that start after the kill there is at most one
// failed attempt in total on it, and every one of them is served.
func TestDrillKillEjectsDeadEngine(t *testing.T) {
	const tokens, perToken = 20, 2 * time.Millisecond // about 40 ms a request
	var mu sync.Mutex
	failedOn := map[string][]string{} // request id → workers whose attempt failed
	c := newClusterDeps(t, "", []clusterOpt{keys(), drillGateway(func(g *config.Gateway) {
		g.HeartbeatMissLimit = 50
	})}, func(d *request.Deps) {
		prev := d.OnFailover
		d.OnFailover = func(ex *request.Exchange, tg router.Target, reason string) {
			prev(ex, tg, reason)
			mu.Lock()
			failedOn[ex.ClientRequestID] = append(failedOn[ex.ClientRequestID], tg.Worker.ID)
			mu.Unlock()
		}
	},
		enginesim.Config{ID: "u1", Model: "m", DecodePerToken: perToken},
		enginesim.Config{ID: "u2", Model: "m", DecodePerToken: perToken},
		enginesim.Config{ID: "u3", Model: "m", DecodePerToken: perToken},
	)
	u1 := c.engines["u1"]
	// Requests of varied lengths (10 to 29 tokens), so that clients do not
	// fall into step.
	l := c.drillStartLoad(6, "/v1/completions", 10*time.Second, func(client, seq int) any {
		return drillBody("m", tokens+(7*client+3*seq)%20-10, false)
	})
	// Kill u1 while it serves: requests in flight on it.
	eventually(t, 10*time.Second, func() bool { return u1.Stats().Completed >= 5 && c.drillInFlight()["u1"] >= 2 }, "u1 serving the load")
	killed := time.Now()
	u1.Kill()
	after := func(o drillOutcome) bool { return o.start.After(killed) }
	eventually(t, 20*time.Second, func() bool { return l.count(after) >= 100 }, "100 requests after the kill")
	outs := l.finish()

	var next []drillOutcome
	for _, o := range outs {
		if after(o) {
			next = append(next, o)
		}
	}
	sort.Slice(next, func(i, j int) bool { return next[i].start.Before(next[j].start) })
	next = next[:100]
	failures := 0
	mu.Lock()
	for _, o := range next {
		for _, w := range failedOn[o.id] {
			if w == "u1" {
				failures++
			}
		}
	}
	mu.Unlock()
	drillFailIf(t, next, func(o drillOutcome) string {
		switch {
		case o.err != nil:
			return "client error"
		case o.status != http.StatusOK:
			return "not 200"
		case o.route == "u1":
			return "served by the dead engine"
		}
		return ""
	})
	v, ok := c.drillWorker("u1")
	t.Logf("%d failed attempts on u1 across the 100 requests after the kill; u1 listed %v, ejected until %v (%s), %d ejection(s)",
		failures, ok, v.EjectedUntil, v.EjectionReason, v.Ejections)
	if failures > 1 {
		t.Fatalf("%d failed attempts on the dead engine across the next 100 requests, want at most 1", failures)
	}
	if !ok || v.EjectedUntil.IsZero() {
		t.Fatalf("u1 not ejected: %+v", v)
	}
	c.drillWaitIdle()
}
