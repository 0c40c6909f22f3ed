package gateway_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tlgate/tlgate/actors/admin"
	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/statefile"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// TestStoredTableBoundsAtStart: the table a gateway starts with, from its
// state file or from etcd's first read, is held to the bounds a table
// arriving over the watch is: one over gateway.max_routes or
// gateway.max_table_bytes, or whose epoch is within the margin of the
// largest, stops the start (and fails -check, for the state file) with an
// error naming the file or the etcd key, the bound's key and the figures.
// A table at the bounds starts.
func TestStoredTableBoundsAtStart(t *testing.T) {
	etcd := cluster.StartEtcd(t, 1)
	direct, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	table := func(n int) []routes.Route {
		rs := make([]routes.Route, n)
		for i := range rs {
			rs[i] = routes.Route{Model: fmt.Sprintf("m%d", i)}
		}
		return rs
	}
	size := func(epoch uint64, rs []routes.Route) int {
		b, err := store.EncodeTable(epoch, rs)
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	const top = math.MaxUint64 - admin.EpochMargin // the largest epoch a stored table may have
	cases := []struct {
		name      string
		epoch     uint64
		routes    int
		maxRoutes int
		maxBytes  int    // -1: the table's own size, -2: one byte less
		says      string // "": the gateway starts
	}{
		{name: "at max_routes", epoch: 3, routes: 3, maxRoutes: 3},
		{name: "over max_routes", epoch: 3, routes: 3, maxRoutes: 2, says: "3 routes, at most 2 (gateway.max_routes)"},
		{name: "at max_table_bytes", epoch: 3, routes: 3, maxBytes: -1},
		{name: "over max_table_bytes", epoch: 3, routes: 3, maxBytes: -2, says: "(gateway.max_table_bytes)"},
		{name: "epoch at the margin", epoch: top, routes: 1},
		{name: "epoch within the margin", epoch: top + 1, routes: 1, says: fmt.Sprintf("epoch %d, at most %d", uint64(top+1), uint64(top))},
	}
	for i, c := range cases {
		rs := table(c.routes)
		maxBytes := c.maxBytes
		switch maxBytes {
		case -1:
			maxBytes = size(c.epoch, rs)
		case -2:
			maxBytes = size(c.epoch, rs) - 1
		}
		says := c.says
		if c.maxBytes == -2 {
			says = fmt.Sprintf("%d bytes, at most %d (gateway.max_table_bytes)", maxBytes+1, maxBytes)
		}
		for _, kind := range []string{config.StoreFile, config.StoreEtcd} {
			t.Run(c.name+"/"+kind, func(t *testing.T) {
				cfg, err := config.Parse([]byte(ambiguousConfig))
				if err != nil {
					t.Fatal(err)
				}
				cfg.Gateway.StateDir, cfg.Gateway.MaxRoutes, cfg.Gateway.MaxTableBytes = t.TempDir(), c.maxRoutes, maxBytes
				where := []string{"gateway.state_dir", statefile.Path(cfg.Gateway.StateDir)}
				if kind == config.StoreFile {
					if err := statefile.Save(cfg.Gateway.StateDir, c.epoch, rs); err != nil {
						t.Fatal(err)
					}
				} else {
					prefix := fmt.Sprintf("/bounds-%d/", i)
					cfg.Gateway.Store = config.Store{Kind: config.StoreEtcd, Endpoints: etcd.Endpoints(), Prefix: prefix, DialTimeout: config.D(5 * time.Second)}
					body, err := store.EncodeTable(c.epoch, rs)
					if err != nil {
						t.Fatal(err)
					}
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					if _, err := direct.Put(ctx, prefix+"routes", string(body)); err != nil {
						t.Fatal(err)
					}
					where = []string{"gateway.store", etcd.Endpoints()[0], prefix + "routes"}
				}
				gw, err := gateway.Start(context.Background(), cfg, gateway.Options{Logger: zerolog.Nop()})
				if err == nil {
					_ = gw.Close(context.Background())
				}
				checkRefusal(t, "start", err, says, where)
				if kind == config.StoreFile {
					checkRefusal(t, "-check", gateway.Check(cfg), says, where)
				}
			})
		}
	}
}

// checkRefusal checks that err refuses a stored table saying says and
// naming where, or, when says is "", that there is no error.
func checkRefusal(t *testing.T, what string, err error, says string, where []string) {
	t.Helper()
	if says == "" {
		if err != nil {
			t.Fatalf("%s: %v, want the table accepted", what, err)
		}
		return
	}
	if err == nil {
		t.Fatalf("%s accepted the stored table, want it refused saying %q", what, says)
	}
	t.Logf("%s: %v", what, err)
	for _, w := range append([]string{says}, where...) {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %v, want it to say %q", what, err, w)
		}
	}
}
