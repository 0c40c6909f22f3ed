package gateway

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
	"github.com/tlgate/tlgate/internal/adapter/traffic"
	"github.com/tlgate/tlgate/internal/guard/ratelimit"
	"github.com/tlgate/tlgate/internal/routing/sticky"
)

// newSync builds the fleet-sync client of [gateway.sync] (nil with kind =
// "none") and gives the router config its Syncer, its bounds and the
// record of stored responses the peers' reports go to. The client
// connects in startSync, once the HTTP listener (and so the default
// replica id) is known.
func (g *Gateway) newSync(gw *config.Gateway, reg prometheus.Registerer, log zerolog.Logger, rcfg *router.Config, stored *sticky.Map, now func() time.Time) error {
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
	opts := fleetsync.Options{
		Root: g.sys.Root, Logger: log.With().Str("component", "fleetsync").Logger(), Metrics: m,
		ChunkBytes: gw.CacheAwareChunkBytes, Stored: stored,
		// The peers' consoles ask for this replica's traffic (set before
		// the sync starts).
		Traffic: func() traffic.Raw { return g.Traffic.Raw() },
	}
	if s.KeyLimits == config.KeyLimitsFleet {
		if now == nil {
			now = time.Now
		}
		opts.Keys = keyShares{l: g.limits, now: now}
	}
	g.sync = fleetsync.New(s, opts)
	margin := s.PeerClaimMargin
	if margin == 0 {
		margin = -1 // none: the router's zero is its default
	}
	rcfg.Sync = router.SyncConfig{
		Syncer: g.sync, MaxPeers: s.MaxPeers, Listed: s.Peers, MaxPeerInFlight: s.MaxPeerInFlight, ClaimMargin: margin, EjectionQuorum: s.EjectionQuorum,
		PeerTimeout: s.PeerTimeout.Duration, Stored: stored, TieSalt: tieSalt(),
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
	if gw.Sync.KeyLimits == config.KeyLimitsFleet {
		g.limits.EnableFleet(ratelimit.FleetConfig{Replica: id, Interval: gw.Sync.LoadInterval.Duration,
			PeerTimeout: gw.Sync.PeerTimeout.Duration, MaxPeers: gw.Sync.MaxPeers, Listed: gw.Sync.Peers})
	}
	if err := g.sync.Start(id, g.Router); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	return nil
}

// keyShares is the per-key limits' part of fleet sync: the limiter's
// shares, on the gateway's clock.
type keyShares struct {
	l   *ratelimit.Limiter
	now func() time.Time
}

// Tick implements fleetsync.KeyShares.
func (k keyShares) Tick(time.Time) []fleetsync.KeyDemand {
	ds := k.l.Tick(k.now())
	out := make([]fleetsync.KeyDemand, len(ds))
	for i, d := range ds {
		out[i] = fleetsync.KeyDemand{Key: d.Key, PerMinute: d.PerMinute}
	}
	return out
}

// Peer implements fleetsync.KeyShares.
func (k keyShares) Peer(replica string, ds []fleetsync.KeyDemand, _ time.Time) {
	in := make([]ratelimit.Demand, len(ds))
	for i, d := range ds {
		in[i] = ratelimit.Demand{Key: d.Key, PerMinute: d.PerMinute}
	}
	k.l.Peer(replica, in, k.now())
}

// SyncID is the replica id fleet sync publishes under ("" with sync off).
func (g *Gateway) SyncID() string {
	if g.sync == nil {
		return ""
	}
	return g.sync.ID()
}

// storedResponses is the record of stored responses the request actors
// use: with fleet sync, one that also tells the peers what it records and
// forgets.
func (g *Gateway) storedResponses(m *sticky.Map) request.StoredResponses {
	if g.sync == nil {
		return m
	}
	return sharedStored{Map: m, sync: g.sync}
}

// sharedStored is a record of stored responses shared through fleet sync.
type sharedStored struct {
	*sticky.Map
	sync *fleetsync.Client
}

// Put records id on worker, owned by the key named key, and tells the
// peers: its digest and its owner's tag, never the id or the key.
func (s sharedStored) Put(id, worker, key string, now time.Time) {
	s.Map.Put(id, worker, key, now)
	s.sync.Stored(sticky.Digest(id), sticky.OwnerTag(id, key), worker, s.TTL())
}

// Forget drops id (deleted through this replica) and tells the peers.
func (s sharedStored) Forget(id string) {
	s.Map.Forget(id)
	s.sync.Forgot(sticky.Digest(id))
}

// tieSalt is this replica's router.SyncConfig.TieSalt: random, never 0
// (0 would mean no salt).
func tieSalt() uint64 { return rand.Uint64() | 1 }
