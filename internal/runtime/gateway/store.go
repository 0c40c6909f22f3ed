package gateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/admin"
	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/store/etcdstore"
	"github.com/tlgate/tlgate/internal/adapter/store/filestore"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// startStore is the store the gateway starts with and its table.
type startStore struct {
	store  store.Store
	etcd   *etcdstore.Store // nil for the file store
	epoch  uint64
	rev    int64
	routes []routes.Route
}

// openStore opens [gateway.store]: the file store over state_dir (the
// persisted table, else the configuration's at epoch 1), or etcd (the
// stored table, seeded from the configuration's when etcd holds none).
// The etcd client's Close is added to the gateway's stops.
func (g *Gateway) openStore(gw *config.Gateway, log zerolog.Logger) (*startStore, error) {
	if gw.Store.Kind != config.StoreEtcd {
		epoch, rs, err := loadRoutes(gw.StateDir, gw.Routes, boundsOf(gw), log)
		if err != nil {
			return nil, err
		}
		return &startStore{store: filestore.New(gw.StateDir, epoch), epoch: epoch, routes: rs}, nil
	}
	cfg, err := EtcdConfig(&gw.Store)
	if err != nil {
		return nil, err
	}
	cfg.Logger = log
	cfg.OnUp = func(up bool) { g.Metrics.StoreUp(up) }
	es, snap, err := etcdstore.Open(context.Background(), cfg, gw.Routes)
	if err != nil {
		return nil, fmt.Errorf("gateway.store: %w", err)
	}
	g.stops = append(g.stops, func(context.Context) error { return es.Close() })
	epoch, rs, err := store.DecodeTable(snap.Table)
	if err != nil {
		return nil, fmt.Errorf("gateway.store: %w", err)
	}
	// The table of the first read is held to the bounds of those the watch
	// brings.
	if err := boundsOf(gw).Check(len(snap.Table), epoch, len(rs)); err != nil {
		return nil, fmt.Errorf("gateway.store: etcd at %s, key %s: %w; %s", strings.Join(gw.Store.Endpoints, ","), es.Key(), err,
			startFix(err, "replace the table: PUT /admin/v1/routes on a replica that runs, or gateway -seed-from FILE -seed-force"))
	}
	if len(gw.Routes) > 0 && !sameRoutes(gw.Routes, rs) {
		log.Warn().Strs("endpoints", gw.Store.Endpoints).Str("key", gw.Store.Prefix+"routes").Uint64("epoch", epoch).Int("routes", len(rs)).Int("config_routes", len(gw.Routes)).
			Msg("the route table in etcd supersedes the config's routes, which only seed an empty store; change the table with PUT /admin/v1/routes")
	}
	return &startStore{store: es, etcd: es, epoch: epoch, rev: snap.TableRev, routes: rs}, nil
}

// EtcdConfig turns [gateway.store] into the etcd client's configuration
// (the password read from password_env, the TLS files loaded).
func EtcdConfig(s *config.Store) (etcdstore.Config, error) {
	pw, err := s.Password()
	if err != nil {
		return etcdstore.Config{}, err
	}
	cfg := etcdstore.Config{
		Endpoints: s.Endpoints, Prefix: s.Prefix, DialTimeout: s.DialTimeout.Duration,
		Username: s.Username, Password: pw,
	}
	if s.CAFile == "" && s.CertFile == "" {
		return cfg, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.CAFile != "" {
		if tc.RootCAs, err = loadCAPool("gateway.store.ca_file", s.CAFile); err != nil {
			return cfg, err
		}
	}
	if s.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
		if err != nil {
			return cfg, fmt.Errorf("gateway.store.cert_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	cfg.TLS = tc
	return cfg, nil
}

// followStore hands every snapshot of a shared store to the admin actor,
// until the gateway stops.
func (g *Gateway) followStore(ss *startStore) {
	if ss.etcd == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	root, pid := g.sys.Root, g.Admin
	wg.Go(func() {
		ss.etcd.Run(ctx, func(snap store.Snapshot) { root.Send(pid, &admin.StoreSnapshot{Snapshot: snap}) })
	})
	g.stops = append(g.stops, func(context.Context) error { cancel(); wg.Wait(); return nil })
}

// StoreUp reports whether the route store can be reached.
func (g *Gateway) StoreUp() bool { return g.store == nil || g.store.Up() }
