// Package stage runs a gateway in front of in-process reference engines on
// loopback, with an admin key, and drives load through it: the setting of
// the console's browser tests (test/console) and of its screenshots
// (cmd/consoleshots).
package stage

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/traffic"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// The stage's keys.
const (
	// AdminKey has the admin and inference scopes.
	AdminKey = "stage-admin-key"
	// AppKey has the inference scope only.
	AppKey = "stage-app-key"
)

// Routes are the stage's default routes: a canary, a cascade, a
// disaggregated route (those of the demo).
func Routes() []routes.Route {
	return []routes.Route{
		{Model: "smol", Aliases: []string{"smol-latest"}, Backends: []routes.Backend{{Model: "smol-v3", Weight: 0.9}, {Model: "smol-v4", Weight: 0.1}}},
		{Model: "auto", Cascade: []routes.Step{{Model: "smol", AcceptIf: "mean_logprob > -1.2"}, {Model: "big"}}},
		{Model: "big-pd", Backends: []routes.Backend{{Model: "big", Weight: 1}}, Targets: []string{routes.TargetDisaggregated}},
	}
}

// Engines are the stage's default engines: two workers of the canary's
// main version, one of its new version, a large unified worker, and a
// prefill worker with two decode workers of the large model.
func Engines() []enginesim.Config {
	return []enginesim.Config{
		{ID: "smol-v3-a", Model: "smol-v3", Role: enginesim.RoleUnified, Confidence: 0.35},
		{ID: "smol-v3-b", Model: "smol-v3", Role: enginesim.RoleUnified, Confidence: 0.35},
		{ID: "smol-v4-a", Model: "smol-v4", Role: enginesim.RoleUnified, Confidence: 0.4},
		{ID: "big-a", Model: "big", Role: enginesim.RoleUnified, Confidence: 0.9},
		{ID: "big-prefill-a", Model: "big", Role: enginesim.RolePrefill, Confidence: 0.9},
		{ID: "big-decode-a", Model: "big", Role: enginesim.RoleDecode, Confidence: 0.9},
		{ID: "big-decode-b", Model: "big", Role: enginesim.RoleDecode, Confidence: 0.9},
	}
}

// Options configure a stage; zero fields take the defaults.
type Options struct {
	Routes   []routes.Route     // default Routes()
	Engines  []enginesim.Config // default Engines()
	StateDir string             // required: where the route table persists
	Traffic  traffic.Config     // the traffic rings (default 5 s × 180)
	Logger   zerolog.Logger     // default: nothing logged
	// DecodePerToken paces the engines (default 2 ms), so latencies show.
	DecodePerToken time.Duration
	// Probed are [[gateway.engines]] entries: engines the gateway probes
	// (one nothing answers at is listed down).
	Probed []config.Engine
}

// Stage is a running gateway with its engines.
type Stage struct {
	GW      *gateway.Gateway
	URL     string // http://127.0.0.1:port
	Engines map[string]*enginesim.Engine
	client  *http.Client
}

// Start starts the gateway and its engines and waits (up to 15 s, or
// until ctx ends) until every engine is routable.
func Start(ctx context.Context, o Options) (*Stage, error) {
	if o.StateDir == "" {
		return nil, fmt.Errorf("stage: Options.StateDir is required")
	}
	if o.Routes == nil {
		o.Routes = Routes()
	}
	if o.Engines == nil {
		o.Engines = Engines()
	}
	if o.DecodePerToken == 0 {
		o.DecodePerToken = 2 * time.Millisecond
	}
	cfg := config.Default()
	gw := &cfg.Gateway
	gw.Listen, gw.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	gw.HeartbeatInterval = config.D(500 * time.Millisecond)
	gw.StateDir = o.StateDir
	gw.Routes = o.Routes
	gw.Engines = o.Probed
	gw.APIKeys = []config.APIKey{
		{Name: "ops", Key: AdminKey, Scopes: []string{config.ScopeAdmin, config.ScopeInference}},
		{Name: "app", Key: AppKey, Scopes: []string{config.ScopeInference}},
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("stage: %w", err)
	}
	g, err := gateway.Start(ctx, cfg, gateway.Options{Logger: o.Logger, Traffic: o.Traffic})
	if err != nil {
		return nil, fmt.Errorf("stage: %w", err)
	}
	s := &Stage{GW: g, URL: "http://" + g.HTTPAddr(), Engines: map[string]*enginesim.Engine{},
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}}
	for _, ec := range o.Engines {
		ec.Gateways = []string{g.RegistryAddr()}
		ec.HeartbeatInterval = 500 * time.Millisecond
		if ec.DecodePerToken == 0 {
			ec.DecodePerToken = o.DecodePerToken
		}
		if ec.KVBlocks == 0 {
			ec.KVBlocks = 96 // small, so the console's KV bars move
		}
		if ec.PrefillPerToken == 0 {
			ec.PrefillPerToken = 50 * time.Microsecond
		}
		ec.Logger = o.Logger
		e, err := enginesim.Start(ctx, ec)
		if err != nil {
			_ = s.Close(context.Background())
			return nil, fmt.Errorf("stage: engine %s: %w", ec.ID, err)
		}
		s.Engines[ec.ID] = e
	}
	if err := s.waitRoutable(ctx, 15*time.Second); err != nil {
		_ = s.Close(context.Background())
		return nil, err
	}
	return s, nil
}

// Close stops the engines, then the gateway.
func (s *Stage) Close(ctx context.Context) error {
	for _, e := range s.Engines {
		e.Kill()
	}
	s.client.CloseIdleConnections()
	return s.GW.Close(ctx)
}

// Workers is the router's view of the fleet.
func (s *Stage) Workers() ([]router.WorkerView, error) {
	res, err := s.GW.System().Root.RequestFuture(s.GW.Router, &router.ListWorkers{}, 2*time.Second).Result()
	if err != nil {
		return nil, fmt.Errorf("stage: list workers: %w", err)
	}
	wr, ok := res.(*router.WorkersResult)
	if !ok {
		return nil, fmt.Errorf("stage: list workers: unexpected %T", res)
	}
	return wr.Workers, nil
}

func (s *Stage) waitRoutable(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		ws, err := s.Workers()
		if err != nil {
			return err
		}
		n := 0
		for _, w := range ws {
			if _, ok := s.Engines[w.ID]; ok && w.Routable {
				n++
			}
		}
		if n == len(s.Engines) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stage: %d of %d engines routable after %v", n, len(s.Engines), within)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stage: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Do sends one request with key (empty: none) and returns the status and
// body; header pairs follow the body.
func (s *Stage) Do(ctx context.Context, method, path, key, body string, header ...string) (int, []byte, http.Header, error) {
	var rd io.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, rd)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("stage: %w", err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("stage: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, b, resp.Header, fmt.Errorf("stage: %s %s: read: %w", method, path, err)
	}
	return resp.StatusCode, b, resp.Header, nil
}

// Complete sends one completion for model with the app key (streamed
// when n is even) and returns its status.
func (s *Stage) Complete(ctx context.Context, model string, n int) (int, error) {
	body, err := json.Marshal(map[string]any{"model": model, "prompt": fmt.Sprintf("Request %d: tell me about gateways.", n), "max_tokens": 16, "stream": n%2 == 0})
	if err != nil {
		return 0, fmt.Errorf("stage: %w", err)
	}
	status, _, _, err := s.Do(ctx, "POST", "/v1/completions", AppKey, string(body))
	return status, err
}

// Load sends completions for model at about rps (at most 32 in flight)
// until ctx ends, then waits for those in flight, and returns how many
// were answered with each status (0: transport error).
func (s *Stage) Load(ctx context.Context, model string, rps float64) map[int]int {
	var (
		mu     sync.Mutex
		counts = map[int]int{}
		wg     sync.WaitGroup
		sem    = make(chan struct{}, 32)
	)
	tick := time.NewTicker(time.Duration(float64(time.Second) / rps))
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			wg.Wait()
			return counts
		case <-tick.C:
		}
		select {
		case sem <- struct{}{}:
		default:
			continue
		}
		wg.Add(1)
		go func(n int) {
			defer wg.Done()
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			status, _ := s.Complete(rctx, model, n)
			mu.Lock()
			counts[status]++
			mu.Unlock()
		}(n)
	}
}
