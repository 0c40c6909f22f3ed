package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/tracing"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
	"github.com/tlgate/tlgate/internal/runtime/stage"
)

// demoConfig is the embedded default: loopback listeners, no keys (allowed
// on loopback only), and the example routes of the specification: a canary
// split, a cascade and a disaggregated route. Its state lives in a fresh
// temporary folder so the demo never picks up an old route table.
func demoConfig() *config.Config {
	cfg := config.Default()
	gw := &cfg.Gateway
	gw.StateDir = filepath.Join(os.TempDir(), fmt.Sprintf("tlgate-demo-%d", os.Getpid()))
	gw.Routes = stage.Routes()     // the console's tests and screenshots run on the same
	gw.ShutdownDelay = config.D(0) // no load balancer to wait for: Ctrl-C stops at once
	return cfg
}

// demoEngines are the in-process reference engines of the demo that
// heartbeat to the gateway: two small unified workers (the canary's two
// versions) and a large unified worker.
var demoEngines = []enginesim.Config{
	{ID: "smol-v3-a", Model: "smol-v3", Role: enginesim.RoleUnified, Confidence: 0.35},
	{ID: "smol-v4-a", Model: "smol-v4", Role: enginesim.RoleUnified, Confidence: 0.4},
	{ID: "big-a", Model: "big", Role: enginesim.RoleUnified, Confidence: 0.9},
}

// demoProbed are the demo's engines that the gateway probes, as it probes
// the vLLM servers operators run (they send no heartbeats): a prefill
// worker and two decode workers of the large model, listed in
// [[gateway.engines]] with kind = "vllm", which the big-pd route pairs
// over vLLM's kv_transfer_params (NixlConnector's protocol). As SGLang
// engines they would be kind = "sglang", the prefill engine with a
// bootstrap port (enginesim.Config.BootstrapAddr, the entry's
// bootstrap_port), paired over SGLang's bootstrap rooms instead.
var demoProbed = []enginesim.Config{
	{ID: "big-prefill-a", Model: "big", Role: enginesim.RolePrefill, Confidence: 0.9},
	{ID: "big-decode-a", Model: "big", Role: enginesim.RoleDecode, Confidence: 0.9},
	{ID: "big-decode-b", Model: "big", Role: enginesim.RoleDecode, Confidence: 0.9},
}

// demoFleet is the demo's running engines and their tracing.
type demoFleet struct {
	tp     *tracing.Provider // nil: none
	logger zerolog.Logger
	// timing sets an engine's timing model (stepTiming, flatTiming).
	timing  func(*enginesim.Config)
	engines []*enginesim.Engine
}

// stepTiming times an engine on the step model like the real thing: the
// small models as Llama-3.1-8B and the large one as Llama-3.1-70B (FP8),
// each on one H100 (enginesim.Presets).
func stepTiming(c *enginesim.Config) {
	preset := enginesim.PresetLlama8BH100
	if c.Model == "big" {
		preset = enginesim.PresetLlama70BFP8H100
	}
	preset.Apply(c)
}

// startDemoProbed starts the engines of demoProbed and lists each in
// cfg's [[gateway.engines]], before the gateway starts. With a tracing
// endpoint the engines export their spans there too (service.name
// enginesim). The fleet's stop stops them.
func startDemoProbed(ctx context.Context, cfg *config.Config, logger zerolog.Logger) (*demoFleet, error) {
	tc := cfg.Gateway.Tracing
	tp, err := tracing.New(ctx, tracing.Config{Endpoint: tc.Endpoint, Protocol: tc.Protocol, SampleRatio: tc.SampleRatio, ServiceName: "enginesim"})
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	d := &demoFleet{tp: tp, logger: logger, timing: stepTiming}
	entries, err := d.startProbed(ctx)
	if err != nil {
		d.stop()
		return nil, err
	}
	cfg.Gateway.Engines = append(cfg.Gateway.Engines, entries...)
	return d, nil
}

// startProbed starts the engines of demoProbed and returns their
// [[gateway.engines]] entries.
func (d *demoFleet) startProbed(ctx context.Context) ([]config.Engine, error) {
	var entries []config.Engine
	for _, c := range demoProbed {
		e, err := d.start(ctx, c)
		if err != nil {
			return nil, err
		}
		entries = append(entries, config.Engine{ID: c.ID, HTTPAddress: e.HTTPAddr(), Model: c.Model, Kind: config.KindVLLM, Role: c.Role,
			ProbeInterval: config.D(config.DefaultProbeInterval)})
	}
	return entries, nil
}

// startHeartbeaters starts the engines of demoEngines, heartbeating to
// the registries.
func (d *demoFleet) startHeartbeaters(ctx context.Context, registries []string) error {
	for _, c := range demoEngines {
		c.Gateways = registries
		c.HeartbeatInterval = 2 * time.Second
		if _, err := d.start(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// start starts one engine, timed by d.timing.
func (d *demoFleet) start(ctx context.Context, c enginesim.Config) (*enginesim.Engine, error) {
	d.timing(&c)
	c.Logger = d.logger.With().Str("engine", c.ID).Logger().Level(zerolog.WarnLevel)
	if d.tp.Enabled() {
		c.Tracer = d.tp.TracerProvider()
	}
	e, err := enginesim.Start(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("demo: engine %s: %w", c.ID, err)
	}
	d.engines = append(d.engines, e)
	return e, nil
}

// stop stops the engines and the tracing, and removes the demo's state.
func (d *demoFleet) stop() {
	for _, e := range d.engines {
		_ = e.Close()
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = d.tp.Shutdown(sctx)
	cancel()
	_ = os.RemoveAll(demoConfig().Gateway.StateDir)
}

// startHeartbeating starts the demo engines that heartbeat to gw, waits
// until every demo engine is routable and prints ready-to-paste commands
// carrying the address the gateway listens on.
func (d *demoFleet) startHeartbeating(ctx context.Context, gw *gateway.Gateway, out io.Writer) error {
	if err := d.startHeartbeaters(ctx, []string{gw.RegistryAddr()}); err != nil {
		return err
	}
	if err := waitRoutable(ctx, gw, 10*time.Second); err != nil {
		return err
	}
	u := "http://" + gw.HTTPAddr()
	fmt.Fprintf(out, `
tlgate demo is up: %[1]s  (gRPC registry on %[2]s)
%[3]d reference engines: smol-v3 and smol-v4 (a 90/10 canary behind "smol"), big (unified),
and big behind "big-pd" as one prefill and two decode engines that the gateway probes
as vLLM servers and pairs over vLLM's kv_transfer_params, all on the step model
(smol timed as Llama-3.1-8B, big as Llama-3.1-70B FP8, each on one H100).

Stream a chat completion:
  curl -N %[1]s/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model":"smol","stream":true,"max_tokens":48,"messages":[{"role":"user","content":"Tell me about gateways."}]}'

A cascade: the small model first, the large one when the small one is unsure
(X-TL-Cascade-Step says which step answered). The small model is sure of this
prompt, so step 0 answers:
  curl -s %[1]s/v1/completions -H 'Content-Type: application/json' -D - \
    -d '{"model":"auto","prompt":"Two plus two is","max_tokens":12}'
and unsure of this one, so it escalates to the large model, step 1:
  curl -s %[1]s/v1/completions -H 'Content-Type: application/json' -D - \
    -d '{"model":"auto","prompt":"The capital of France is","max_tokens":12}'

Disaggregated prefill and decode (vLLM's protocol), seeded:
  curl -N %[1]s/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"big-pd","prompt":"Once upon a time","max_tokens":24,"seed":7,"stream":true}'

The web console (no key needed: the demo has none):
  %[1]s/ui/

Models, workers and routes:
  curl -s %[1]s/v1/models
  curl -s %[1]s/admin/v1/workers
  curl -s -D - %[1]s/admin/v1/routes
  curl -s %[1]s/metrics | grep ^tlgate_

Ctrl-C stops it.
`, u, gw.RegistryAddr(), len(d.engines))
	return nil
}

// waitRoutable polls the router until every demo engine is routable, ctx
// ends (its error) or within passes.
func waitRoutable(ctx context.Context, gw *gateway.Gateway, within time.Duration) error {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if n := routableDemoEngines(gw); n == len(demoEngines)+len(demoProbed) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo: %w", ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("demo: %d of %d engines routable after %v", routableDemoEngines(gw), len(demoEngines)+len(demoProbed), within)
		case <-tick.C:
		}
	}
}

// routableDemoEngines counts the demo engines the router can route to.
func routableDemoEngines(gw *gateway.Gateway) int {
	res, err := gw.System().Root.RequestFuture(gw.Router, &router.ListWorkers{}, 2*time.Second).Result()
	if err != nil {
		return 0
	}
	list, ok := res.(*router.WorkersResult)
	if !ok {
		return 0
	}
	routable := map[string]bool{}
	for _, w := range list.Workers {
		routable[w.ID] = w.Routable
	}
	n := 0
	for _, c := range slices.Concat(demoEngines, demoProbed) {
		if routable[c.ID] {
			n++
		}
	}
	return n
}
