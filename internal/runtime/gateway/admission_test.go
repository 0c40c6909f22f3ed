package gateway

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// TestAdmissionDefaultsChangeNothingBelowSaturation: the router built
// from the default configuration (admission control on, limits per pool,
// learned from the engines' reports) picks exactly the worker it picks
// with admission control off, request for request, over random multi-turn
// traffic under cache_aware, as long as the gateway's requests stay below
// the sum of the learned limits and no engine reports itself saturated.
// Past that the default queues where off does not; and limits per worker
// (the old default when on) already pick differently below saturation,
// which is what cost cache_aware its hit rate.
func TestAdmissionDefaultsChangeNothingBelowSaturation(t *testing.T) {
	c, err := config.Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	gw := c.Gateway
	build := func(mod func(a *router.AdmissionConfig)) *router.State {
		rc := routerConfig(policy.Name(gw.RoutePolicy), &gw)
		overloadConfig(&rc, gw, nil, zerolog.Nop())
		mod(&rc.Admission)
		table, err := routes.NewTable(nil)
		if err != nil {
			t.Fatal(err)
		}
		return router.NewState(rc, table, 1)
	}
	if !gw.Admission.Enabled {
		t.Fatal("admission control is off by default")
	}
	t0 := time.Unix(1_000_000, 0)
	worker := func(i, queue int, at time.Time) fleet.Worker {
		return fleet.Worker{ID: fmt.Sprint("engine-", i), Model: "m", Role: fleet.RoleUnified, HTTPAddress: fmt.Sprintf("127.0.0.1:%d", 9000+i),
			Running: 8, QueueDepth: queue, KVTotalBlocks: 160, KVFreeBlocks: 40, KVBlockTokens: 16,
			StartedAt: t0, LastHeartbeat: at, Deadline: at.Add(time.Hour)}
	}
	const engines, limit = 4, 9 // each reports 8 running with a queue: learned capacity 8, limit 9
	type run struct {
		name string
		st   *router.State
		held map[string]string // request id -> worker
	}
	runs := []*run{
		{name: "default", st: build(func(*router.AdmissionConfig) {})},
		{name: "off", st: build(func(a *router.AdmissionConfig) { a.Enabled = false })},
		{name: "per worker", st: build(func(a *router.AdmissionConfig) { a.PerWorker = true })},
	}
	for _, r := range runs {
		r.held = map[string]string{}
		for i := range engines {
			r.st.SetWorker(worker(i, 1, t0)) // a queue: the capacity is learned
			r.st.SetWorker(worker(i, 0, t0.Add(time.Millisecond)))
		}
	}
	if v := runs[0].st.Workers(t0)[0]; v.ConcurrencyLimit != limit {
		t.Fatalf("default: learned limit %d, want %d", v.ConcurrencyLimit, limit)
	}
	system := strings.Repeat("You are a careful assistant who answers in full sentences. ", 20)
	convs := make([]string, 16)
	for i := range convs {
		convs[i] = fmt.Sprintf("%s\nuser %d: hello, my name is %d.\n", system, i, i)
	}
	rng := rand.New(rand.NewPCG(45, 1))
	var inflight []string
	differ := 0 // picks where limits per worker went elsewhere than off
	at := t0.Add(time.Second)
	send := func(id string, conv int) []router.Admission {
		req := router.Request{Model: "m", RequestID: id, Prompt: convs[conv], Key: "k"}
		out := make([]router.Admission, len(runs))
		for i, r := range runs {
			rq := req
			out[i] = r.st.Admit(&rq, "k", nil, at)
			if t := out[i].Target; out[i].Err == nil && out[i].Queued == nil {
				r.held[id] = t.Worker.ID
				r.st.Indexed(t.Indexing, at)
			}
		}
		return out
	}
	for step := range 3000 {
		at = at.Add(time.Millisecond)
		if len(inflight) < engines*limit && (len(inflight) == 0 || rng.IntN(2) == 0) {
			id, conv := fmt.Sprint("r", step), rng.IntN(len(convs))
			ads := send(id, conv)
			if ads[0].Queued != nil || ads[0].Err != nil || ads[1].Err != nil {
				t.Fatalf("step %d below saturation (%d in flight): default %+v, off %+v", step, len(inflight), ads[0], ads[1])
			}
			if got, want := ads[0].Target.Worker.ID, ads[1].Target.Worker.ID; got != want {
				t.Fatalf("step %d (%d in flight): the default picked %s, off picked %s", step, len(inflight), got, want)
			}
			if ads[2].Queued != nil || ads[2].Target.Worker.ID != ads[1].Target.Worker.ID {
				differ++
			}
			inflight = append(inflight, id)
			convs[conv] += fmt.Sprintf("assistant: answer %d.\nuser: and then?\n", step)
			continue
		}
		k := rng.IntN(len(inflight))
		id := inflight[k]
		inflight = append(inflight[:k], inflight[k+1:]...)
		for _, r := range runs {
			if w, ok := r.held[id]; ok {
				r.st.Release(w)
				delete(r.held, id)
			}
			r.st.Dispatch(at)
		}
	}
	if differ == 0 {
		t.Error("limits per worker picked as off did on every request: the traffic never put a worker at its limit, so this test shows nothing")
	}
	t.Logf("limits per worker picked differently from off on %d requests", differ)
	// At the sum of the limits the default queues; off sends on.
	for len(inflight) < engines*limit {
		id := fmt.Sprint("fill", len(inflight))
		send(id, 0)
		inflight = append(inflight, id)
	}
	ads := send("past", 1)
	if ads[0].Queued == nil || ads[1].Queued != nil || ads[1].Err != nil {
		t.Fatalf("at saturation: default %+v, off %+v", ads[0], ads[1])
	}
}
