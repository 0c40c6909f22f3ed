package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/store/etcdstore"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// errSeedNeedsEtcd refuses -seed-from with a configuration whose store is
// not etcd.
var errSeedNeedsEtcd = errors.New(`-seed-from needs a -config whose [gateway.store] kind is "etcd"`)

// seedStore copies a file store's routes.json (validated first) into the
// configuration's etcd store, refusing to replace a stored table unless
// force, and prints what it wrote. The file itself is left as it is: a
// gateway on the file store goes on using it unchanged.
func seedStore(ctx context.Context, cfg *config.Config, path string, force bool, out io.Writer) error {
	if cfg.Gateway.Store.Kind != config.StoreEtcd {
		return errSeedNeedsEtcd
	}
	body, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-seed-from: %w", err)
	}
	epoch, rs, err := store.DecodeTable(body)
	if err != nil {
		return fmt.Errorf("-seed-from %s: %w", path, err)
	}
	ecfg, err := gateway.EtcdConfig(&cfg.Gateway.Store)
	if err != nil {
		return err
	}
	s, err := etcdstore.Connect(ecfg)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(ctx, ecfg.DialTimeout)
	defer cancel()
	rev, err := s.Seed(ctx, body, force)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "seeded %s with %s: epoch %d, %d routes (etcd revision %d)\n", s.Key(), path, epoch, len(rs), rev)
	return nil
}
