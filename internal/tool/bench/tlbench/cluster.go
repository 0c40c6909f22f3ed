package tlbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// gatewayConfig is what a cluster's gateway differs in; a nil
// *gatewayConfig runs the engines without a gateway.
type gatewayConfig struct {
	policy     string
	loadFactor float64
	heartbeat  time.Duration
	// idleTimeout, when set, replaces the gap allowed between two chunks
	// of an engine's stream (held streams need a long one).
	idleTimeout time.Duration
	// cacheLoadWeight, when set, replaces cache_aware_load_weight.
	cacheLoadWeight float64
	// tune, when set, adjusts the rest of the gateway's configuration.
	tune func(g *config.Gateway)
}

// cluster is a set of in-process engines, with a gateway they heartbeat to
// or without one.
type cluster struct {
	gw       *gateway.Gateway
	stateDir string
	engines  []*enginesim.Engine
}

// errNotRoutable: the gateway did not see every engine in time.
var errNotRoutable = errors.New("engines not routable through the gateway")

// startCluster starts the gateway (if gc is set) and the engines, and waits
// until the gateway can route to all of them.
func startCluster(ctx context.Context, gc *gatewayConfig, engines []enginesim.Config) (*cluster, error) {
	c := &cluster{}
	var registry string
	if gc != nil {
		cfg := config.Default()
		g := &cfg.Gateway
		g.Listen, g.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
		g.RoutePolicy = gc.policy
		// The memory experiment holds 10,000 streams from one address: the
		// connection caps would refuse most of them.
		g.MaxConnections, g.MaxConnectionsPerClient = 0, 0
		if gc.loadFactor > 0 {
			g.AffinityLoadFactor = gc.loadFactor
		}
		if gc.heartbeat > 0 {
			g.HeartbeatInterval = config.D(gc.heartbeat)
		}
		if gc.idleTimeout > 0 {
			g.IdleTimeout = config.D(gc.idleTimeout)
		}
		if gc.cacheLoadWeight > 0 {
			g.CacheAwareLoadWeight = gc.cacheLoadWeight
		}
		dir, err := os.MkdirTemp("", "tlbench-state-")
		if err != nil {
			return nil, fmt.Errorf("state dir: %w", err)
		}
		c.stateDir, g.StateDir = dir, dir
		if gc.tune != nil {
			gc.tune(g)
		}
		if err := cfg.Validate(); err != nil {
			c.close()
			return nil, fmt.Errorf("gateway config: %w", err)
		}
		// Production-like: access logs are encoded (and discarded) and
		// metrics recorded.
		reg := prometheus.NewRegistry()
		c.gw, err = gateway.Start(ctx, cfg, gateway.Options{
			Logger: zerolog.New(io.Discard).Level(zerolog.InfoLevel), Registry: reg, Gatherer: reg,
		})
		if err != nil {
			c.close()
			return nil, fmt.Errorf("gateway: %w", err)
		}
		registry = c.gw.RegistryAddr()
	}
	for _, ec := range engines {
		if registry != "" {
			ec.Gateways = []string{registry}
		}
		e, err := enginesim.Start(ctx, ec)
		if err != nil {
			c.close()
			return nil, fmt.Errorf("engine %s: %w", ec.ID, err)
		}
		c.engines = append(c.engines, e)
	}
	if c.gw != nil {
		if err := c.waitRoutable(ctx, 10*time.Second); err != nil {
			c.close()
			return nil, err
		}
	}
	return c, nil
}

// waitRoutable polls the router until every engine is routable.
func (c *cluster) waitRoutable(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		v, err := c.gw.System().Root.RequestFuture(c.gw.Router, &router.ListWorkers{}, 2*time.Second).Result()
		if err != nil {
			return fmt.Errorf("list workers: %w", err)
		}
		n := 0
		for _, w := range v.(*router.WorkersResult).Workers {
			if w.Routable {
				n++
			}
		}
		if n == len(c.engines) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%w: %d of %d after %v", errNotRoutable, n, len(c.engines), within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// url is the gateway's base URL.
func (c *cluster) url() string { return "http://" + c.gw.HTTPAddr() }

// engineURLs are the engines' base URLs.
func (c *cluster) engineURLs() []string {
	out := make([]string, len(c.engines))
	for i, e := range c.engines {
		out[i] = e.URL()
	}
	return out
}

// stats are every engine's figures now.
func (c *cluster) stats() []enginesim.Stats {
	out := make([]enginesim.Stats, len(c.engines))
	for i, e := range c.engines {
		out[i] = e.Stats()
	}
	return out
}

// close stops the engines (abruptly: nothing they hold matters any more)
// and then the gateway, and removes the gateway's state directory.
func (c *cluster) close() {
	for _, e := range c.engines {
		e.Kill()
	}
	if c.gw != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = c.gw.Close(ctx)
		cancel()
	}
	if c.stateDir != "" {
		_ = os.RemoveAll(c.stateDir)
	}
}
