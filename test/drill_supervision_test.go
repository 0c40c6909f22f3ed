package test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/actors/worker"
	"github.com/tlgate/tlgate/enginesim"
)

// TestDrillSupervision crashes, one at a time, a worker actor, a request
// actor, the router and the registry while streams are in flight. Each is
// restarted (or, for the request actor, stopped and cleaned up) without
// losing another request: the streams finish, requests sent right after
// the crash are answered, no worker is forgotten, and the in-flight counts
// stay exact. A worker actor restarted on its own or by its registry's
// restart keeps its liveness timer: a worker that then stops heartbeating
// is still evicted at its deadline.
func TestDrillSupervision(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys()},
		enginesim.Config{ID: "a", Model: "m", DecodePerToken: 10 * time.Millisecond},
		enginesim.Config{ID: "b", Model: "m", DecodePerToken: 10 * time.Millisecond},
	)
	root := c.gw.System().Root
	ask := func(pid *actor.PID, msg any) any {
		t.Helper()
		res, err := root.RequestFuture(pid, msg, 2*time.Second).Result()
		if err != nil {
			t.Fatalf("ask %T: %v", msg, err)
		}
		return res
	}
	workerPID := func(id string) *actor.PID {
		t.Helper()
		pid, _ := ask(c.gw.Registry, &registry.WorkerPID{ID: id}).(*actor.PID)
		if pid == nil {
			t.Fatalf("no actor for worker %s", id)
		}
		return pid
	}
	// evictsOnTime stops id's heartbeats, checks the eviction comes at its
	// deadline, and brings it back.
	evictsOnTime := func(id string) {
		t.Helper()
		e := c.engines[id]
		if err := e.SetFaults(enginesim.Faults{NoHeartbeat: true}); err != nil {
			t.Fatal(err)
		}
		c.drillWaitEvicted(id, drillTTL)
		if err := e.SetFaults(enginesim.Faults{}); err != nil {
			t.Fatal(err)
		}
		c.waitRoutable(id)
	}

	cases := []struct {
		name  string
		crash func(t *testing.T)
		after func(t *testing.T, inFlight map[string]int)
	}{
		{"worker actor", func(t *testing.T) {
			root.Send(workerPID("a"), &worker.Crash{})
		}, func(t *testing.T, _ map[string]int) {
			evictsOnTime("a")
		}},
		{"request actor", func(t *testing.T) {
			c.hooks.mu.Lock()
			c.hooks.panicOn = "boom"
			c.hooks.mu.Unlock()
			o := c.drillSend(context.Background(), "/v1/completions", drillKey, "boom", drillBody("m", 4, true))
			if o.status != http.StatusInternalServerError || o.errCode != "internal_error" {
				t.Fatalf("the panicking request: %v", o)
			}
		}, nil},
		{"router", func(t *testing.T) {
			root.Send(c.gw.Router, &router.Crash{})
		}, func(t *testing.T, before map[string]int) {
			// The restarted router's view is rebuilt from the registry and
			// its in-flight counts are the ones it had.
			if got := c.drillInFlight(); !maps.Equal(got, before) {
				t.Fatalf("in flight after the router's restart %v, before %v", got, before)
			}
		}},
		{"registry", func(t *testing.T) {
			root.Send(c.gw.Registry, &registry.Crash{})
		}, func(t *testing.T, _ map[string]int) {
			// Its worker actors were respawned with their timers.
			evictsOnTime("b")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Four long streams in flight, two on each worker.
			var streams []drillStream
			for i := range 4 {
				id := fmt.Sprintf("%s-long-%d", tc.name, i)
				resp, br, err := c.drillOpenStream(context.Background(), drillKey, id, drillBody("m", 50, true))
				if err != nil {
					t.Fatal(err)
				}
				streams = append(streams, drillStream{resp, br, id})
			}
			before := c.drillInFlight()
			if before["a"] != 2 || before["b"] != 2 {
				t.Fatalf("in flight %v, want 2 on each worker", before)
			}

			tc.crash(t)
			if tc.after != nil {
				tc.after(t, before)
			}
			// Requests sent after the crash are answered.
			var wg sync.WaitGroup
			outs := make([]drillOutcome, 6)
			for i := range outs {
				wg.Go(func() {
					outs[i] = c.drillSend(context.Background(), "/v1/completions", drillKey,
						fmt.Sprintf("%s-short-%d", tc.name, i), drillBody("m", 2, i%2 == 0))
				})
			}
			wg.Wait()
			drillFailIf(t, outs, func(o drillOutcome) string {
				if !o.finishedOK(o.id[len(o.id)-1]%2 == 0) {
					return "request sent after the crash failed"
				}
				return ""
			})
			for _, s := range streams {
				if done, err := s.rest(); !done || err != nil {
					t.Errorf("stream %s in flight during the crash: done %v err %v", s.id, done, err)
				}
			}
			ids := slices.Sorted(maps.Keys(c.drillInFlight()))
			if !slices.Equal(ids, []string{"a", "b"}) {
				t.Fatalf("workers after the crash: %v", ids)
			}
			c.drillWaitIdle()
		})
	}
	if o := c.drillSend(context.Background(), "/v1/completions", drillKey, "last", drillBody("m", 2, false)); !o.finishedOK(false) {
		t.Fatalf("after the crashes: %v", o)
	}
}
