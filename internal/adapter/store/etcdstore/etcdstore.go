// Package etcdstore is the shared route store: several gateway replicas
// keep one route table and one set of drains in etcd and each watches for
// the others' writes.
//
// Keys, under the prefix (default "/tlgate/"):
//
//	<prefix>routes            {"epoch":N,"routes":[...]}, the table and its epoch under one key
//	<prefix>drained/<model>   present while an operator drains that served model
//	<prefix>fence/<id>        a fence: table write <id> lost its answer and must not commit any more
//
// A table write is one transaction: put the new body if the key's
// ModRevision is still the one the writer read, else read the key back
// (the loser learns the stored epoch). A write whose answer is lost (the
// connection dropped, the deadline passed) may still be committed later,
// by an etcd that had it or a request still on its way; each write
// therefore also requires that its own fence key does not exist, and
// settling it creates the fence if the table is still the one it was to
// replace: from then on the write cannot commit, and "not written" stays
// true. The next table write deletes every fence: none is needed once the
// table's ModRevision has moved on, since a write's compare can never
// match again. Run watches the prefix and hands
// every change to the gateway as a whole store.Snapshot, read at one
// revision; after a lost connection or a compacted watch it reads the
// store again at its current revision and watches from there, so a
// replica never misses the last table however many writes it did not see.
// Liveness is not kept here: engines heartbeat to every replica.
package etcdstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Defaults for zero Config fields.
const (
	DefaultPrefix         = "/tlgate/"
	DefaultDialTimeout    = 5 * time.Second
	DefaultHealthInterval = 500 * time.Millisecond
)

// Keys under the prefix.
const (
	routesKey     = "routes"
	drainedPrefix = "drained/"
	fencePrefix   = "fence/"
)

// Errors of Open and Seed.
var (
	// ErrNoEndpoints: a Config without endpoints.
	ErrNoEndpoints = errors.New("etcdstore: no endpoints")
	// ErrSeeded: Seed found a table stored already.
	ErrSeeded = errors.New("etcdstore: a route table is already stored")
)

// Config is how to reach etcd.
type Config struct {
	Endpoints []string
	// Prefix is put in front of every key; default "/tlgate/".
	Prefix string
	// DialTimeout bounds reaching etcd at start (Open refuses after it)
	// and each health check; default 5s.
	DialTimeout time.Duration
	// Username and Password authenticate (etcd's auth), when set.
	Username, Password string
	// TLS, when set, is used to reach etcd (CA, client certificate).
	TLS *tls.Config
	// HealthInterval is the period of the reachability check; default
	// 500ms.
	HealthInterval time.Duration
	Logger         zerolog.Logger
	// OnUp, if set, is called with every change of reachability (and
	// once, true, when Open succeeds).
	OnUp func(up bool)
}

// Store is the etcd store. It implements store.Store.
type Store struct {
	cfg     Config
	cli     *clientv3.Client
	routes  string // full key of the table
	drained string // full prefix of the drains
	fences  string // full prefix of the fences
	up      atomic.Bool
	resync  chan struct{}
}

var _ store.Store = (*Store)(nil)

// Open connects to etcd and returns the store with the table to start
// with. When no table is stored yet, seed is stored at epoch 1 (in one
// transaction that only creates, so replicas starting together agree on
// one). An etcd that cannot be reached within DialTimeout is an error
// naming the endpoints; a stored table that is not valid is an error too.
func Open(ctx context.Context, cfg Config, seed []routes.Route) (*Store, store.Snapshot, error) {
	s, err := Connect(cfg)
	if err != nil {
		return nil, store.Snapshot{}, err
	}
	snap, err := s.start(ctx, seed)
	if err != nil {
		_ = s.cli.Close()
		return nil, store.Snapshot{}, err
	}
	s.setUp(true)
	return s, snap, nil
}

// Connect makes the etcd client without reaching etcd yet (Open and Seed
// do). The store counts as down until an operation reaches etcd.
func Connect(cfg Config) (*Store, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, ErrNoEndpoints
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.HealthInterval <= 0 {
		cfg.HealthInterval = DefaultHealthInterval
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Username:             cfg.Username,
		Password:             cfg.Password,
		TLS:                  cfg.TLS,
		Logger:               zap.NewNop(),
		// Reconnect within a couple of seconds of etcd coming back, not
		// after gRPC's default backoff (up to two minutes).
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: cfg.DialTimeout,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("etcdstore: etcd at %s (dial_timeout %s): %w%s", strings.Join(cfg.Endpoints, ","), cfg.DialTimeout, err, diagnose(cfg))
	}
	return &Store{cfg: cfg, cli: cli, routes: cfg.Prefix + routesKey, drained: cfg.Prefix + drainedPrefix, fences: cfg.Prefix + fencePrefix, resync: make(chan struct{}, 1)}, nil
}

// start seeds the table if none is stored and reads the store, within
// DialTimeout.
func (s *Store) start(ctx context.Context, seed []routes.Route) (store.Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	unreachable := func(err error) error {
		return fmt.Errorf("etcdstore: etcd at %s not reachable within dial_timeout %s: %w%s", strings.Join(s.cfg.Endpoints, ","), s.cfg.DialTimeout, err, diagnose(s.cfg))
	}
	body, err := store.EncodeTable(1, seed)
	if err != nil {
		return store.Snapshot{}, err
	}
	if _, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(s.routes), "=", 0)).
		Then(clientv3.OpPut(s.routes, string(body))).Commit(); err != nil {
		return store.Snapshot{}, unreachable(err)
	}
	snap, err := s.load(ctx)
	if err != nil {
		return store.Snapshot{}, unreachable(err)
	}
	if _, _, err := store.DecodeTable(snap.Table); err != nil {
		return store.Snapshot{}, fmt.Errorf("etcdstore: key %s: %w", s.routes, err)
	}
	return snap, nil
}

// Close closes the connection to etcd; stop Run first.
func (s *Store) Close() error { return s.cli.Close() }

// Up reports whether the last health check (or operation) reached etcd.
func (s *Store) Up() bool { return s.up.Load() }

func (s *Store) setUp(up bool) {
	if s.up.Swap(up) == up {
		return
	}
	if up {
		s.cfg.Logger.Info().Strs("endpoints", s.cfg.Endpoints).Msg("etcdstore: etcd reachable")
		select { // read the store again: writes may have been missed
		case s.resync <- struct{}{}:
		default:
		}
	} else {
		s.cfg.Logger.Warn().Strs("endpoints", s.cfg.Endpoints).Msg("etcdstore: etcd not reachable; routing goes on with the table in force, admin writes answer 503")
	}
	if s.cfg.OnUp != nil {
		s.cfg.OnUp(up)
	}
}

// unavailable wraps an etcd error as store.ErrUnavailable and marks the
// store down when the error says etcd was not reached.
func (s *Store) unavailable(err error) error {
	s.setUp(false)
	return fmt.Errorf("%w: etcd at %s: %w", store.ErrUnavailable, strings.Join(s.cfg.Endpoints, ","), err)
}

// PutRoutes stores rs at epoch next if the table key was last written at
// prev.Rev; else it reads the stored epoch back for the *ConflictError. A
// write whose answer is lost fails with an *store.UnknownOutcomeError
// whose Settle is settle's.
func (s *Store) PutRoutes(ctx context.Context, prev store.Version, next uint64, rs []routes.Route) (store.Version, error) {
	body, err := store.EncodeTable(next, rs)
	if err != nil {
		return store.Version{}, err
	}
	fence := s.fences + rand.Text()
	resp, err := s.putTxn(ctx, prev, body, fence)
	if err != nil {
		lost := s.unavailable(err)
		var settle func(context.Context) (store.Version, error)
		settle = func(c context.Context) (store.Version, error) {
			v, err := s.settle(c, prev, body, fence, lost)
			var uo *store.UnknownOutcomeError
			if errors.As(err, &uo) {
				uo.Settle = settle // it may be settled again later
			}
			return v, err
		}
		return store.Version{}, &store.UnknownOutcomeError{Err: lost, Settle: settle}
	}
	if !resp.Succeeded {
		ce := &store.ConflictError{}
		if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) == 1 {
			ce.Epoch, _, _ = store.DecodeTable(rr.Kvs[0].Value)
		}
		return store.Version{}, ce
	}
	return store.Version{Epoch: next, Rev: resp.Header.Revision}, nil
}

// putTxn is a table write: body is put if the table is still prev and
// fence does not exist, and every fence is deleted; else the table is
// read.
func (s *Store) putTxn(ctx context.Context, prev store.Version, body []byte, fence string) (*clientv3.TxnResponse, error) {
	return s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(s.routes), "=", prev.Rev),
			clientv3.Compare(clientv3.CreateRevision(fence), "=", 0)).
		Then(clientv3.OpPut(s.routes, string(body)), clientv3.OpDelete(s.fences, clientv3.WithPrefix())).
		Else(clientv3.OpGet(s.routes)).Commit()
}

// settle finds out what became of the table write of body, at the epoch
// after prev, whose answer was lost (lost is its error). In one
// transaction: if the table is still prev, its fence is created (the
// write cannot commit from then on) and it was not written; else the
// table is read. A stored body equal to the write's is the write's: the
// same routes at the same epoch, from prev (only a write from prev can
// take that epoch). Another replica writing the same table from the same
// ETag at once is the same outcome to the client, whose table is in
// force at the ETag it would have had. Any other body is another write's.
func (s *Store) settle(ctx context.Context, prev store.Version, body []byte, fence string, lost error) (store.Version, error) {
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(s.routes), "=", prev.Rev)).
		Then(clientv3.OpPut(fence, "")).
		Else(clientv3.OpGet(s.routes)).Commit()
	if err != nil {
		return store.Version{}, &store.UnknownOutcomeError{Err: fmt.Errorf("%w; reading the store back: %w", lost, s.unavailable(err))}
	}
	s.setUp(true)
	if resp.Succeeded {
		return store.Version{}, fmt.Errorf("%w (%w)", store.ErrNotWritten, lost)
	}
	ce := &store.ConflictError{}
	if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) == 1 {
		kv := rr.Kvs[0]
		if bytes.Equal(kv.Value, body) {
			epoch, _, _ := store.DecodeTable(body)
			return store.Version{Epoch: epoch, Rev: kv.ModRevision}, nil
		}
		ce.Epoch, _, _ = store.DecodeTable(kv.Value)
	}
	return store.Version{}, ce
}

// SetDrained puts (on) or deletes the drain keys of models in one
// transaction. A drain whose answer is lost fails with an
// *store.UnknownOutcomeError without Settle: reading the store shows
// whether the drain holds.
func (s *Store) SetDrained(ctx context.Context, models []string, on bool) (int64, error) {
	ops := make([]clientv3.Op, 0, len(models))
	for _, m := range models {
		if on {
			ops = append(ops, clientv3.OpPut(s.drained+m, "1"))
		} else {
			ops = append(ops, clientv3.OpDelete(s.drained+m))
		}
	}
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return 0, &store.UnknownOutcomeError{Err: s.unavailable(err)}
	}
	return resp.Header.Revision, nil
}

// Current reads the whole store at its current revision.
func (s *Store) Current(ctx context.Context) (store.Snapshot, error) {
	snap, err := s.load(ctx)
	if err != nil {
		return store.Snapshot{}, s.unavailable(err)
	}
	s.setUp(true)
	return snap, nil
}

var _ store.Reader = (*Store)(nil)

// load reads the whole prefix at one revision.
func (s *Store) load(ctx context.Context) (store.Snapshot, error) {
	resp, err := s.cli.Get(ctx, s.cfg.Prefix, clientv3.WithPrefix())
	if err != nil {
		return store.Snapshot{}, err
	}
	snap := store.Snapshot{Rev: resp.Header.Revision}
	for _, kv := range resp.Kvs {
		switch k := string(kv.Key); {
		case k == s.routes:
			snap.Table, snap.TableRev = kv.Value, kv.ModRevision
		case strings.HasPrefix(k, s.drained):
			snap.Drained = append(snap.Drained, strings.TrimPrefix(k, s.drained))
		}
	}
	sort.Strings(snap.Drained)
	return snap, nil
}

// Run follows the store until ctx ends: deliver gets a snapshot of the
// whole store now, and again after every change. When the watch ends (a
// lost leader, a compacted revision) or etcd becomes reachable again, the
// store is read again at its current revision and watched from there. A
// health check every HealthInterval keeps Up current.
func (s *Store) Run(ctx context.Context, deliver func(store.Snapshot)) {
	done := make(chan struct{})
	go func() { defer close(done); s.health(ctx) }()
	defer func() { <-done }()
	retry := time.NewTicker(s.cfg.HealthInterval)
	defer retry.Stop()
	for ctx.Err() == nil {
		snap, err := s.read(ctx)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-s.resync:
			case <-retry.C:
			}
			continue
		}
		deliver(snap)
		s.follow(ctx, snap.Rev, deliver)
	}
}

// read loads the store within DialTimeout.
func (s *Store) read(ctx context.Context) (store.Snapshot, error) {
	c, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	snap, err := s.load(c)
	if err != nil {
		if ctx.Err() == nil {
			_ = s.unavailable(err)
		}
		return store.Snapshot{}, err
	}
	s.setUp(true)
	return snap, nil
}

// follow watches the prefix from rev+1 and delivers a fresh snapshot after
// each batch of events, until the watch ends or a resync is asked for.
func (s *Store) follow(ctx context.Context, rev int64, deliver func(store.Snapshot)) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(wctx, s.cfg.Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.resync:
			return
		case resp, ok := <-wch:
			if !ok {
				return
			}
			if err := resp.Err(); err != nil {
				s.cfg.Logger.Warn().Err(err).Int64("compact_rev", resp.CompactRevision).Msg("etcdstore: watch ended; reading the store again")
				return
			}
			if len(resp.Events) == 0 {
				continue
			}
			snap, err := s.read(ctx)
			if err != nil {
				return
			}
			deliver(snap)
		}
	}
}

// health checks reachability every HealthInterval with a linearizable
// read (it needs a quorum, so a cluster that lost its quorum is down).
func (s *Store) health(ctx context.Context) {
	t := time.NewTicker(s.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c, cancel := context.WithTimeout(ctx, min(s.cfg.DialTimeout, 2*s.cfg.HealthInterval+time.Second))
		_, err := s.cli.Get(c, s.routes, clientv3.WithCountOnly())
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			_ = s.unavailable(err)
		default:
			s.setUp(true)
		}
	}
}

// Key is the etcd key of the route table.
func (s *Store) Key() string { return s.routes }

// Seed writes the table body (a routes.json, validated first) to the
// store's table key, and returns the revision written. Unless force, a
// table already stored is left alone and Seed fails naming its epoch.
func (s *Store) Seed(ctx context.Context, body []byte, force bool) (int64, error) {
	epoch, rs, err := store.DecodeTable(body)
	if err != nil {
		return 0, err
	}
	clean, err := store.EncodeTable(epoch, rs)
	if err != nil {
		return 0, err
	}
	txn := s.cli.Txn(ctx)
	if !force {
		txn = txn.If(clientv3.Compare(clientv3.CreateRevision(s.routes), "=", 0))
	}
	resp, err := txn.Then(clientv3.OpPut(s.routes, string(clean))).Else(clientv3.OpGet(s.routes)).Commit()
	if err != nil {
		return 0, fmt.Errorf("etcdstore: seed %s at %s: %w", s.routes, strings.Join(s.cfg.Endpoints, ","), err)
	}
	if !resp.Succeeded {
		var have uint64
		if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) == 1 {
			have, _, _ = store.DecodeTable(rr.Kvs[0].Value)
		}
		return 0, fmt.Errorf("%w: %s already holds a table (epoch %d); seed again with -seed-force to replace it", ErrSeeded, s.routes, have)
	}
	return resp.Header.Revision, nil
}

// diagnoseTimeout bounds each step of diagnose.
const diagnoseTimeout = time.Second

// diagnose says why etcd could not be reached, when the etcd client only
// said its deadline passed: it connects to each endpoint itself and, for
// an https one, shakes hands with cfg.TLS and reads the server's first
// answer (a TLS 1.3 server refuses a missing client certificate only
// then). It returns " (endpoint: what failed)" for the first endpoint that
// fails so, or "" when every one connects.
func diagnose(cfg Config) string {
	for _, ep := range cfg.Endpoints {
		host, secure := ep, cfg.TLS != nil
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			host, secure = u.Host, u.Scheme == "https" || cfg.TLS != nil && u.Scheme != "http"
		}
		conn, err := net.DialTimeout("tcp", host, diagnoseTimeout)
		if err != nil {
			return fmt.Sprintf(" (%s: %v)", ep, err)
		}
		if !secure {
			conn.Close()
			continue
		}
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.TLS != nil {
			tc = cfg.TLS.Clone()
		}
		if tc.ServerName == "" {
			tc.ServerName, _, _ = net.SplitHostPort(host)
		}
		c := tls.Client(conn, tc)
		_ = c.SetDeadline(time.Now().Add(diagnoseTimeout))
		err = c.Handshake()
		if err == nil {
			var b [1]byte
			if _, rerr := c.Read(b[:]); rerr != nil && !isTimeout(rerr) && !errors.Is(rerr, io.EOF) {
				err = rerr
			}
		}
		c.Close()
		if err != nil {
			return fmt.Sprintf(" (%s: TLS: %v)", ep, err)
		}
	}
	return ""
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
