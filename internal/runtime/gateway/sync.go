package gateway

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
)

// newSync builds the fleet-sync client of [gateway.sync] (nil with kind =
// "none") and gives the router config its Syncer and bounds. The client
// connects in startSync, once the HTTP listener (and so the default
// replica id) is known.
func (g *Gateway) newSync(gw *config.Gateway, reg prometheus.Registerer, log zerolog.Logger, rcfg *router.Config) error {
	s := gw.Sync
	if s.Kind != config.SyncNATS {
		return nil
	}
	var m *metrics.SyncMetrics
	if reg != nil {
		var err error
		if m, err = metrics.NewSyncMetrics(reg); err != nil {
			return fmt.Errorf("sync: %w", err)
		}
	}
	g.sync = fleetsync.New(s, fleetsync.Options{
		Root: g.sys.Root, Logger: log.With().Str("component", "fleetsync").Logger(), Metrics: m,
		ChunkBytes: gw.CacheAwareChunkBytes,
	})
	rcfg.Sync = router.SyncConfig{
		Syncer: g.sync, MaxPeers: s.MaxPeers, MaxPeerInFlight: s.MaxPeerInFlight, PeerTimeout: s.PeerTimeout.Duration,
	}
	// Stopped after the HTTP server's drain (stops run in reverse), so the
	// releases of the requests it lets finish are told.
	g.stops = append(g.stops, func(context.Context) error { g.sync.Close(); return nil })
	return nil
}

// startSync connects fleet sync, under replica_id or the default id of
// the bound HTTP listener.
func (g *Gateway) startSync(gw *config.Gateway) error {
	if g.sync == nil {
		return nil
	}
	id := gw.Sync.ReplicaID
	if id == "" {
		id = fleetsync.DefaultID(g.httpLis.Addr().String())
	}
	if err := g.sync.Start(id, g.Router); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	return nil
}

// SyncID is the replica id fleet sync publishes under ("" with sync off).
func (g *Gateway) SyncID() string {
	if g.sync == nil {
		return ""
	}
	return g.sync.ID()
}
