package test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
)

// drillRouted returns the workers routed to since the hook log held n
// entries.
func (c *cluster) drillRouted(since int) []string {
	routed, _, _ := c.hooks.snapshot()
	return routed[since:]
}

func (c *cluster) drillHookCounts() (routed, failovers int) {
	r, f, _ := c.hooks.snapshot()
	return len(r), len(f)
}

// drillSequential sends n non-streamed requests one after the other and
// fails t unless each is answered 200.
func (c *cluster) drillSequential(t *testing.T, prefix string, n int) {
	t.Helper()
	for i := range n {
		o := c.drillSend(context.Background(), "/v1/completions", drillKey, fmt.Sprintf("%s-%d", prefix, i), drillBody("m", 2, false))
		if !o.finishedOK(false) {
			t.Fatalf("%s: %v", prefix, o)
		}
	}
}

// TestDrillRestartSameID: an engine dies and a new process comes back
// under the same id on new ports, before or after its eviction. Once the
// gateway has seen the new addresses, every request goes to them: no
// attempt reaches the dead process (no failover), and the new process
// answers them all (least_outstanding ties to the smallest id, "a").
func TestDrillRestartSameID(t *testing.T) {
	for _, afterEviction := range []bool{false, true} {
		t.Run(fmt.Sprintf("after_eviction=%v", afterEviction), func(t *testing.T) {
			c := newCluster(t, "", []clusterOpt{keys()}, enginesim.Config{ID: "a", Model: "m"}, enginesim.Config{ID: "b", Model: "m"})
			old := c.engines["a"]
			oldAddr := old.HTTPAddr()
			c.drillSequential(t, "before", 3)
			if got := old.Stats().Requests; got != 3 {
				t.Fatalf("a served %d of the first 3 requests, want 3", got)
			}
			old.Kill()
			if afterEviction {
				c.drillWaitEvicted("a", drillTTL)
			} else {
				// Between the death and the restart, requests fail over to b.
				_, f0 := c.drillHookCounts()
				c.drillSequential(t, "dead", 3)
				if _, f := c.drillHookCounts(); f == f0 {
					t.Fatal("no failover from the dead a before its restart")
				}
			}
			bBefore := c.engines["b"].Stats().Requests
			fresh := c.addEngine(enginesim.Config{ID: "a", Model: "m"})
			if fresh.HTTPAddr() == oldAddr {
				t.Fatalf("the restarted engine took the old address %s", oldAddr)
			}
			eventually(t, 5*time.Second, func() bool {
				w, ok := c.drillWorker("a")
				return ok && w.Routable && w.HTTPAddress == fresh.HTTPAddr()
			}, "a routable at its new address %s", fresh.HTTPAddr())

			r0, f0 := c.drillHookCounts()
			c.drillSequential(t, "restarted", 10)
			if _, f := c.drillHookCounts(); f != f0 {
				_, failovers, _ := c.hooks.snapshot()
				t.Fatalf("failovers after the restart was seen: %v", failovers[f0:])
			}
			if routed := c.drillRouted(r0); slices.ContainsFunc(routed, func(id string) bool { return id != "a" }) {
				t.Fatalf("routed %v after the restart, want a only", routed)
			}
			if got := fresh.Stats().Requests; got != 10 {
				t.Fatalf("the restarted a got %d requests, want 10", got)
			}
			if got := c.engines["b"].Stats().Requests; got != bBefore {
				t.Fatalf("b got %d requests after the restart", got-bBefore)
			}
			c.drillWaitIdle()
		})
	}
}

// TestDrillHeartbeatFlap: an engine whose heartbeats stop and resume, three
// times. Each time it is evicted at its deadline (never before), requests
// meanwhile go to the other worker, and it is routable again as soon as a
// heartbeat arrives.
func TestDrillHeartbeatFlap(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys()}, enginesim.Config{ID: "a", Model: "m"}, enginesim.Config{ID: "b", Model: "m"})
	a, b := c.engines["a"], c.engines["b"]
	for round := range 3 {
		if err := a.SetFaults(enginesim.Faults{NoHeartbeat: true}); err != nil {
			t.Fatal(err)
		}
		late := c.drillWaitEvicted("a", drillTTL)
		aReq, bReq := a.Stats().Requests, b.Stats().Requests
		r0, _ := c.drillHookCounts()
		c.drillSequential(t, fmt.Sprintf("gone-%d", round), 5)
		if routed := c.drillRouted(r0); slices.Contains(routed, "a") {
			t.Fatalf("round %d: routed %v while a was evicted", round, routed)
		}
		if a.Stats().Requests != aReq || b.Stats().Requests != bReq+5 {
			t.Fatalf("round %d: a got %d, b %d of 5 requests while a was evicted",
				round, a.Stats().Requests-aReq, b.Stats().Requests-bReq)
		}
		cleared := time.Now()
		if err := a.SetFaults(enginesim.Faults{}); err != nil {
			t.Fatal(err)
		}
		c.waitRoutable("a")
		back := time.Since(cleared)
		c.drillSequential(t, fmt.Sprintf("back-%d", round), 5)
		if got := a.Stats().Requests - aReq; got != 5 {
			t.Fatalf("round %d: a got %d of 5 requests after it came back", round, got)
		}
		t.Logf("round %d: eviction seen %v after the deadline; routable again %v after heartbeats resumed",
			round, late.Round(time.Millisecond), back.Round(time.Millisecond))
	}
	c.drillWaitIdle()
}
