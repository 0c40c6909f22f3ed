// Package routerbench times the gateway's route decision at a given fleet
// size: through the router actor (a Route request and its answer, with the
// registry and router actors spawned as the gateway spawns them and fed
// heartbeats of fake workers) and as the pure router.State.Pick.
package routerbench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// Model is the model every fake worker serves.
const Model = "bench"

// ErrRoute: the router answered a Route with an error, or not at all.
var ErrRoute = errors.New("routerbench: route failed")

// Config says what to time.
type Config struct {
	Workers int
	Policy  policy.Name
	// LoadFactor is affinity_load_factor (default 1.25).
	LoadFactor float64
	// Budget bounds each of the two timings (default 500ms); at least
	// MinOps operations run whatever the budget (default 1000).
	Budget time.Duration
	MinOps int
	// Keys is the number of distinct prefix keys the requests cycle
	// through (default 64).
	Keys int
}

// Result is one timing.
type Result struct {
	Workers int
	Policy  policy.Name
	// ActorOps round trips took ActorNsPerOp each: RequestFuture of a
	// Route to the router actor, its answer, and a Release sent.
	ActorOps     int
	ActorNsPerOp float64
	// InActorNsPerOp is the mean decision time the router reports itself
	// (RouteResult.Took): the pick without the messaging.
	InActorNsPerOp float64
	// PickOps calls of State.Pick (and State.Release) took PickNsPerOp
	// each, on a state holding the same workers.
	PickOps     int
	PickNsPerOp float64
}

func (c Config) withDefaults() Config {
	if c.LoadFactor == 0 {
		c.LoadFactor = 1.25
	}
	if c.Budget <= 0 {
		c.Budget = 500 * time.Millisecond
	}
	if c.MinOps <= 0 {
		c.MinOps = 1000
	}
	if c.Keys <= 0 {
		c.Keys = 64
	}
	return c
}

// Status returns the heartbeat of fake worker i: unified, serving Model,
// with its queue and KV figures varied a little so that loads differ.
func Status(i int) *controlv1.WorkerStatus {
	return &controlv1.WorkerStatus{
		WorkerId:      "w" + strconv.Itoa(i),
		HttpAddress:   "127.0.0.1:" + strconv.Itoa(10000+i%50000),
		Role:          controlv1.Role_ROLE_UNIFIED,
		Model:         Model,
		KvFormat:      1,
		QueueDepth:    uint32(i % 3),
		Running:       uint32(i % 5),
		KvFreeBlocks:  2048,
		KvTotalBlocks: 4096 + uint32(i%4)*1024,
		KvBlockTokens: 16,
	}
}

// requests returns the Route requests cycled through: distinct request ids
// and Keys distinct 64-byte prefix keys.
func requests(keys int) []router.Request {
	out := make([]router.Request, keys)
	for i := range out {
		k := fmt.Appendf(nil, "system\nYou are assistant number %d; answer briefly and politely.", i)
		out[i] = router.Request{Model: Model, RequestID: "r" + strconv.Itoa(i), PrefixKey: k[:min(len(k), 64)], Stream: true}
	}
	return out
}

// Measure times the route decision for c.
func Measure(ctx context.Context, c Config) (Result, error) {
	c = c.withDefaults()
	if c.Workers < 1 {
		return Result{}, fmt.Errorf("routerbench: %d workers", c.Workers)
	}
	res := Result{Workers: c.Workers, Policy: c.Policy}
	reqs := requests(c.Keys)
	if err := timeActor(ctx, c, reqs, &res); err != nil {
		return res, err
	}
	if err := timePick(c, reqs, &res); err != nil {
		return res, err
	}
	return res, nil
}

// timeActor spawns a registry and a router, registers the workers through
// heartbeats and times Route round trips.
func timeActor(ctx context.Context, c Config, reqs []router.Request, res *Result) error {
	sys := actorsys.New(zerolog.Nop())
	defer sys.Shutdown()
	root := sys.Root
	// A long interval: no worker expires while being timed.
	reg := root.Spawn(registry.Props(registry.NewState(registry.Config{Interval: time.Hour, MissLimit: 3, Epoch: 1})))
	rt := root.Spawn(router.Props(router.NewState(router.Config{Policy: c.Policy, LoadFactor: c.LoadFactor}, nil, 1), reg))
	defer func() {
		_ = root.StopFuture(rt).Wait()
		_ = root.StopFuture(reg).Wait()
	}()

	now := time.Now()
	for i := range c.Workers {
		hb := &registry.Heartbeat{Status: Status(i), Arrived: now, Source: fleet.SourceHeartbeat}
		if _, err := root.RequestFuture(reg, hb, 5*time.Second).Result(); err != nil {
			return fmt.Errorf("routerbench: heartbeat %d: %w", i, err)
		}
	}
	// Wait (bounded) until the router sees every worker.
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := root.RequestFuture(rt, &router.ListWorkers{}, 5*time.Second).Result()
		if err != nil {
			return fmt.Errorf("routerbench: list workers: %w", err)
		}
		if len(v.(*router.WorkersResult).Workers) == c.Workers {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("routerbench: the router knows %d of %d workers", len(v.(*router.WorkersResult).Workers), c.Workers)
		}
		time.Sleep(5 * time.Millisecond)
	}

	route := func(i int) (time.Duration, error) {
		v, err := root.RequestFuture(rt, &router.Route{Request: reqs[i%len(reqs)]}, 5*time.Second).Result()
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrRoute, err)
		}
		rr := v.(*router.RouteResult)
		if rr.Err != nil {
			return 0, fmt.Errorf("%w: %w", ErrRoute, rr.Err)
		}
		root.Send(rt, &router.Release{WorkerID: rr.Target.Worker.ID})
		return rr.Took, nil
	}
	// Warm up: the first picks allocate scratch space.
	for i := range 100 {
		if _, err := route(i); err != nil {
			return err
		}
	}
	var took time.Duration
	n, elapsed, err := timeLoop(ctx, c.Budget, c.MinOps, func(i int) error {
		d, err := route(i)
		took += d
		return err
	})
	if err != nil {
		return err
	}
	res.ActorOps = n
	res.ActorNsPerOp = float64(elapsed.Nanoseconds()) / float64(n)
	res.InActorNsPerOp = float64(took.Nanoseconds()) / float64(n)
	return nil
}

// timePick times State.Pick and State.Release on a state that holds the
// same workers.
func timePick(c Config, reqs []router.Request, res *Result) error {
	st := router.NewState(router.Config{Policy: c.Policy, LoadFactor: c.LoadFactor}, nil, 1)
	now := time.Now()
	for i := range c.Workers {
		st.SetWorker(fleet.FromStatus(Status(i), now, time.Hour, fleet.SourceHeartbeat))
	}
	pick := func(i int) error {
		t, err := st.Pick(&reqs[i%len(reqs)], now)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrRoute, err)
		}
		st.Release(t.Worker.ID)
		return nil
	}
	for i := range 100 {
		if err := pick(i); err != nil {
			return err
		}
	}
	n, elapsed, err := timeLoop(context.Background(), c.Budget, c.MinOps, pick)
	if err != nil {
		return err
	}
	res.PickOps = n
	res.PickNsPerOp = float64(elapsed.Nanoseconds()) / float64(n)
	return nil
}

// timeLoop calls op in batches until budget has passed and at least minOps
// ran; it returns the operations run and their total time.
func timeLoop(ctx context.Context, budget time.Duration, minOps int, op func(i int) error) (int, time.Duration, error) {
	const batch = 100
	n := 0
	start := time.Now()
	for {
		for range batch {
			if err := op(n); err != nil {
				return n, 0, err
			}
			n++
		}
		elapsed := time.Since(start)
		if n >= minOps && elapsed >= budget || ctx.Err() != nil && n >= batch {
			return n, elapsed, nil
		}
	}
}
