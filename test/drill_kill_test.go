package test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
)

// The harness's liveness: heartbeat_interval 200ms × heartbeat_miss_limit 3.
const drillTTL = 600 * time.Millisecond

const drillPDRoutes = `
[[gateway.routes]]
model = "pd"
backends = [{ model = "m", weight = 1 }]
targets = ["disaggregated"]
`

// TestDrillKillDecodeUnderLoad: a decode engine dies under a steady load of
// disaggregated streams. Streams it had committed end with one SSE
// upstream_failed event soon after (the idle timeout is 30 s here, so it is
// the dead connection that ends them, not a timer); every other request
// completes on the other decode worker; no request hangs; every KV handle
// on the surviving engines is released; the dead worker is evicted at its
// deadline and the gateway keeps serving.
func TestDrillKillDecodeUnderLoad(t *testing.T) {
	const tokens, perToken = 25, 20 * time.Millisecond // streams of about 0.5 s
	c := newCluster(t, drillPDRoutes, []clusterOpt{keys(), drillGateway(func(g *config.Gateway) {
		g.IdleTimeout = config.D(30 * time.Second)
	})},
		enginesim.Config{ID: "p1", Model: "m", Role: enginesim.RolePrefill},
		enginesim.Config{ID: "d1", Model: "m", Role: enginesim.RoleDecode, DecodePerToken: perToken},
		enginesim.Config{ID: "d2", Model: "m", Role: enginesim.RoleDecode, DecodePerToken: perToken},
	)
	d1, d2, p1 := c.engines["d1"], c.engines["d2"], c.engines["p1"]

	l := c.drillStartLoad(6, "/v1/completions", 10*time.Second, func(int, int) any { return drillBody("pd", tokens, true) })
	// Kill d1 while it decodes committed streams.
	eventually(t, 10*time.Second, func() bool { return l.reading("d1") >= 2 }, "two streams committed on d1")
	killed := time.Now()
	d1.Kill()
	lateBy := c.drillWaitEvicted("d1", drillTTL)
	// Keep the load on until a dozen more streams finished after the eviction.
	evicted := time.Now()
	eventually(t, 10*time.Second, func() bool {
		return l.count(func(o drillOutcome) bool { return o.start.After(evicted) && o.done }) >= 12
	}, "streams completing after the eviction")
	outs := l.finish()

	var failedOnD1, doneOnD2AfterKill int
	var slowest time.Duration
	drillFailIf(t, outs, func(o drillOutcome) string {
		switch {
		case o.err != nil:
			return "client error (a hang reaches the 10 s deadline)"
		case o.status != http.StatusOK:
			return "not 200"
		case o.done && o.route != "d1" && o.route != "d2":
			return "done on an unknown route"
		case o.done && o.route == "d1" && o.end.After(killed):
			// d1 cannot have finished a stream after its death.
			return "finished on d1 after it was killed"
		case o.done:
			if o.route == "d2" && o.start.After(killed) {
				doneOnD2AfterKill++
			}
			return ""
		case o.errCode != "upstream_failed":
			return "neither [DONE] nor upstream_failed"
		case o.route != "d1":
			return "upstream_failed on a live worker"
		case o.start.After(killed):
			return "committed to d1 after it was killed"
		}
		failedOnD1++
		d := o.end.Sub(killed)
		slowest = max(slowest, d)
		if d > time.Second {
			return "committed stream ended more than a second after the kill"
		}
		return ""
	})
	if failedOnD1 == 0 {
		t.Error("no committed stream on d1 was cut: the drill did not kill d1 mid-stream")
	}
	if doneOnD2AfterKill == 0 {
		t.Error("no stream started after the kill completed on d2")
	}
	_, failovers, _ := c.hooks.snapshot()
	for _, f := range failovers {
		if !strings.HasPrefix(f, "d1:") {
			t.Errorf("failover from a live worker: %s", f)
		}
	}
	t.Logf("%d requests; %d committed on d1 ended with upstream_failed (last %v after the kill); %d started after the kill completed on d2; %d failovers from d1 (%v); eviction seen %v after the deadline",
		len(outs), failedOnD1, slowest.Round(time.Millisecond), doneOnD2AfterKill, len(failovers), drillCount(failovers), lateBy.Round(time.Millisecond))
	if lateBy > drillTTL {
		t.Errorf("d1 evicted %v after its deadline", lateBy)
	}

	// Every KV handle on the surviving engines is released.
	eventually(t, 5*time.Second, func() bool {
		for _, e := range []*enginesim.Engine{d2, p1} {
			if s := e.Stats(); s.HeldHandles != 0 || s.HeldBlocks != 0 {
				return false
			}
		}
		return true
	}, "no KV held: d2 %+v", d2.Stats())
	c.drillWaitIdle()

	// The gateway keeps serving.
	o := c.drillSend(context.Background(), "/v1/completions", drillKey, "after", drillBody("pd", 4, true))
	if !o.finishedOK(true) || o.route != "d2" {
		t.Fatalf("after the drill: %v", o)
	}
}

// TestDrillKillUnifiedUnderMixedLoad: a unified engine dies under streamed
// and non-streamed load. Non-streamed requests (read whole before the
// first byte) and streams it had not committed complete on the others;
// committed streams end with upstream_failed; none hangs.
func TestDrillKillUnifiedUnderMixedLoad(t *testing.T) {
	const tokens, perToken = 25, 20 * time.Millisecond
	// least_outstanding spreads the 8 clients over the three engines, so
	// u1 always runs some of them; cache_aware would send the one prompt
	// to its owner and give u1 only what the balance guard spills.
	c := newCluster(t, "", []clusterOpt{keys(), drillGateway(func(g *config.Gateway) {
		g.IdleTimeout = config.D(30 * time.Second)
		g.RoutePolicy = config.PolicyLeastOutstanding
	})},
		enginesim.Config{ID: "u1", Model: "m", DecodePerToken: perToken},
		enginesim.Config{ID: "u2", Model: "m", DecodePerToken: perToken},
		enginesim.Config{ID: "u3", Model: "m", DecodePerToken: perToken},
	)
	u1 := c.engines["u1"]
	stream := func(client int) bool { return client%2 == 0 }
	l := c.drillStartLoad(8, "/v1/completions", 10*time.Second, func(client, _ int) any {
		return drillBody("m", tokens, stream(client))
	})
	// Kill u1 while it runs a committed stream and an uncommitted request
	// (non-streamed, or a stream before its first byte).
	// A stream commits at its first token, a few milliseconds after it
	// starts, while a non-streamed request stays uncommitted for its whole
	// 0.5 s (longer on a busy machine): a surplus of running requests over
	// committed streams seen at every poll for 200 ms is an uncommitted
	// request. The window is timed, not counted in polls, which a busy
	// machine spaces out.
	var since time.Time
	eventually(t, 30*time.Second, func() bool {
		committed := l.reading("u1")
		if committed < 1 || u1.Stats().Running <= committed {
			since = time.Time{}
			return false
		}
		if since.IsZero() {
			since = time.Now()
		}
		return time.Since(since) >= 200*time.Millisecond
	}, "u1 running committed and uncommitted requests")
	killed := time.Now()
	u1.Kill()
	c.drillWaitEvicted("u1", drillTTL)
	evicted := time.Now()
	eventually(t, 10*time.Second, func() bool {
		return l.count(func(o drillOutcome) bool { return o.start.After(evicted) && o.status == http.StatusOK }) >= 12
	}, "requests completing after the eviction")
	outs := l.finish()

	var cut, moved int
	drillFailIf(t, outs, func(o drillOutcome) string {
		isStream := strings.HasPrefix(o.id, "load-") && stream(int(o.id[5]-'0'))
		switch {
		case o.err != nil:
			return "client error (a hang reaches the 10 s deadline)"
		case o.status != http.StatusOK:
			return "not 200"
		case !isStream && o.errCode != "":
			return "a non-streamed request failed"
		case !isStream:
			if o.start.Before(killed) && o.end.After(killed) {
				moved++
			}
			if o.route == "u1" && o.end.After(killed) {
				return "non-streamed answer from u1 after its death"
			}
			return ""
		case o.done:
			if o.route == "u1" && o.end.After(killed) {
				return "stream finished on u1 after its death"
			}
			return ""
		case o.errCode == "upstream_failed" && o.route == "u1" && o.start.Before(killed):
			cut++
			if o.end.Sub(killed) > time.Second {
				return "committed stream ended more than a second after the kill"
			}
			return ""
		}
		return "stream neither finished nor cut on u1"
	})
	if cut == 0 {
		t.Error("no committed stream on u1 was cut")
	}
	// The uncommitted request running on u1 at its death (the surplus
	// above) was answered by another worker. Its failover may read as
	// "refused": the proxy lets Go's transport replay a request whose
	// pooled connection died on a fresh one, and that dial is refused.
	if moved == 0 {
		t.Error("no non-streamed request spanning the kill: the uncommitted request on u1 was lost")
	}
	_, failovers, _ := c.hooks.snapshot()
	for _, f := range failovers {
		if !strings.HasPrefix(f, "u1:") {
			t.Errorf("failover from a live worker: %s", f)
		}
	}
	if len(failovers) == 0 {
		t.Error("no request failed over from u1")
	}
	t.Logf("%d requests; %d committed streams cut on u1; %d non-streamed requests spanning the kill, all answered; failovers %v",
		len(outs), cut, moved, drillCount(failovers))
	c.drillWaitIdle()
	if o := c.drillSend(context.Background(), "/v1/completions", drillKey, "after", drillBody("m", 4, false)); !o.finishedOK(false) {
		t.Fatalf("after the drill: %v", o)
	}
}

// distinct counts each string.
func drillCount(s []string) map[string]int {
	m := map[string]int{}
	for _, v := range s {
		m[v]++
	}
	return m
}
