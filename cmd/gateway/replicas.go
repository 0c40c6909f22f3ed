//go:build !noembed

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync/embednats"
	"github.com/tlgate/tlgate/internal/adapter/store/embedetcd"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// runReplicas is -demo -replicas n: an embedded etcd in a temporary
// directory, n gateways on loopback sharing it as their store and routing
// as one fleet through an embedded NATS (fleet sync), and the demo engines
// heartbeating to every one. It prints a PUT on the first replica and a
// GET on the second, then runs until ctx ends.
func runReplicas(ctx context.Context, n int, logger zerolog.Logger, out io.Writer) error {
	dir, err := os.MkdirTemp("", "tlgate-demo-etcd-")
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer os.RemoveAll(dir)
	etcd, err := embedetcd.Start(dir, 1)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer etcd.Close()
	// One NATS user per replica, allowed only its own subjects: no replica
	// can speak for another.
	ids, passwords := make([]string, n), make([]string, n)
	var users []embednats.User
	for i := range n {
		ids[i] = fmt.Sprintf("demo-%d", i)
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		passwords[i] = hex.EncodeToString(b[:])
		pub, sub := fleetsync.Permissions(config.DefaultSyncSubjectPrefix, ids[i])
		users = append(users, embednats.User{Name: ids[i], Password: passwords[i], Publish: pub, Subscribe: sub})
	}
	ns, err := embednats.StartWith(embednats.Options{Users: users})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer ns.Close()

	// The engines every replica probes start first: each one's
	// configuration lists them.
	sims := &demoFleet{logger: logger, timing: flatTiming}
	defer sims.stop()
	probed, err := sims.startProbed(ctx)
	if err != nil {
		return err
	}

	var gws []*gateway.Gateway
	closeAll := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, gw := range gws {
			_ = gw.Close(sctx)
		}
	}
	defer closeAll()
	for i := range n {
		cfg := demoConfig()
		g := &cfg.Gateway
		g.Listen, g.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
		g.Engines = append(g.Engines, probed...)
		g.Store = config.Store{Kind: config.StoreEtcd, Endpoints: etcd.Endpoints(), Prefix: config.DefaultStorePrefix, DialTimeout: config.D(5 * time.Second)}
		g.Sync.Kind, g.Sync.URL = config.SyncNATS, config.StringList{ns.URL()}
		g.Sync.ReplicaID, g.Sync.User, g.Sync.Password = ids[i], ids[i], passwords[i]
		reg := prometheus.NewRegistry()
		gw, err := gateway.Start(ctx, cfg, gateway.Options{Logger: logger.With().Int("replica", i).Logger(), Registry: reg, Gatherer: reg})
		if err != nil {
			return fmt.Errorf("demo: replica %d: %w", i, err)
		}
		gws = append(gws, gw)
	}
	registries := make([]string, len(gws))
	for i, gw := range gws {
		registries[i] = gw.RegistryAddr()
	}
	if err := sims.startHeartbeaters(ctx, registries); err != nil {
		return err
	}
	for _, gw := range gws {
		if err := waitRoutable(ctx, gw, 10*time.Second); err != nil {
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
	}
	printReplicas(out, gws, etcd.Endpoints(), ns.URL(), len(demoEngines), len(demoProbed))
	<-ctx.Done()
	logger.Info().Msg("shutting down")
	return nil
}

// flatTiming times an engine on the flat per-token model: three
// gateways and six engines share the machine's cores.
func flatTiming(c *enginesim.Config) {
	c.DecodePerToken = 20 * time.Millisecond
	c.PrefillPerToken = 200 * time.Microsecond
}

func printReplicas(out io.Writer, gws []*gateway.Gateway, endpoints []string, natsURL string, heartbeating, probed int) {
	var list strings.Builder
	for i, gw := range gws {
		fmt.Fprintf(&list, "  replica %d: http://%s  (gRPC registry %s)\n", i, gw.HTTPAddr(), gw.RegistryAddr())
	}
	a, b := "http://"+gws[0].HTTPAddr(), "http://"+gws[1].HTTPAddr()
	fmt.Fprintf(out, `
tlgate demo is up: %[1]d gateway replicas sharing one route table in an embedded etcd (%[2]s)
%[3]s%[4]d reference engines heartbeat to every replica, and every replica probes %[8]d more (vLLM servers).
The replicas route as one fleet:
they share their routing decisions, load and prefix index through an embedded NATS (%[7]s,
one user per replica, each allowed to publish only as itself),
so a worker's in-flight requests on one replica show on the others (peer_in_flight):
  curl -s %[6]s/admin/v1/workers

Read the table and its ETag on replica 0, change it there (If-Match: that ETag):
  curl -s -D - %[5]s/admin/v1/routes
  curl -s -X PUT %[5]s/admin/v1/routes -H 'If-Match: "1"' -H 'Content-Type: application/json' \
    -d '{"routes":[{"model":"smol","backends":[{"model":"smol-v4","weight":1}]}]}'

Replica 1 serves the new table (ETag "2") and routes by it:
  curl -s -D - %[6]s/admin/v1/routes
  curl -s %[6]s/v1/completions -H 'Content-Type: application/json' -D - \
    -d '{"model":"smol","prompt":"Hello","max_tokens":8}'

A drain on replica 1 stops routing to smol-v4 on every replica:
  curl -s -X POST %[6]s/admin/v1/models/smol-v4:drain
  curl -s %[5]s/admin/v1/workers

Ctrl-C stops it.
`, len(gws), strings.Join(endpoints, ","), list.String(), heartbeating, a, b, natsURL, probed)
}
