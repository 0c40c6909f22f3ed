package etcdstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/internal/adapter/store/embedetcd"
	"github.com/tlgate/tlgate/internal/adapter/store/etcdstore"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestCompareAndSwapAndWatch(t *testing.T) {
	c, err := embedetcd.Start(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func() (*etcdstore.Store, store.Snapshot) {
		s, snap, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: c.Endpoints(), Prefix: "/t/", Logger: zerolog.Nop()}, []routes.Route{{Model: "a"}})
		if err != nil {
			t.Fatal(err)
		}
		return s, snap
	}
	a, snapA := open()
	defer a.Close()
	b, snapB := open()
	defer b.Close()
	if snapA.TableRev != snapB.TableRev || snapA.TableRev == 0 {
		t.Fatalf("two opens seeded twice: %d %d", snapA.TableRev, snapB.TableRev)
	}
	got := make(chan store.Snapshot, 16)
	wctx, wcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { b.Run(wctx, func(s store.Snapshot) { got <- s }) })
	defer func() { wcancel(); wg.Wait() }()
	<-got
	prev := store.Version{Epoch: 1, Rev: snapA.TableRev}
	v, err := a.PutRoutes(ctx, prev, 2, []routes.Route{{Model: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.PutRoutes(ctx, prev, 2, []routes.Route{{Model: "c"}})
	var ce *store.ConflictError
	if !errors.As(err, &ce) || ce.Epoch != 2 {
		t.Fatalf("second writer: %v, want a conflict at epoch 2", err)
	}
	for {
		select {
		case s := <-got:
			if s.TableRev == v.Rev {
				if !strings.Contains(string(s.Table), `"b"`) {
					t.Fatalf("snapshot %s", s.Table)
				}
				return
			}
		case <-ctx.Done():
			t.Fatal("no snapshot of the write")
		}
	}
}

// TestAuth: with etcd's authentication on, the store opens with the
// right user and password and refuses to open with a wrong one. The
// client authenticates inside clientv3.New, within dial_timeout; etcd
// checks passwords with bcrypt, slow under -race on a busy machine, hence
// the generous timeout.
func TestAuth(t *testing.T) {
	c, err := embedetcd.Start(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, step := range []func() error{
		func() error { _, err := admin.RoleAdd(ctx, "root"); return err },
		func() error { _, err := admin.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.RoleAdd(ctx, "tlgate"); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, "tlgate", "/auth/", clientv3.GetPrefixRangeEnd("/auth/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := admin.UserAdd(ctx, "tlgate", "s3cret"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "tlgate", "tlgate"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("set up etcd auth: %v", err)
		}
	}
	cfg := etcdstore.Config{Endpoints: c.Endpoints(), Prefix: "/auth/", DialTimeout: 10 * time.Second, Username: "tlgate", Password: "s3cret", Logger: zerolog.Nop()}
	s, snap, err := etcdstore.Open(ctx, cfg, []routes.Route{{Model: "a"}})
	if err != nil {
		t.Fatalf("open with the right password: %v", err)
	}
	if _, err := s.PutRoutes(ctx, store.Version{Epoch: 1, Rev: snap.TableRev}, 2, nil); err != nil {
		t.Fatalf("write with the right password: %v", err)
	}
	_ = s.Close()
	cfg.Password = "wrong"
	if s, _, err := etcdstore.Open(ctx, cfg, nil); err == nil {
		_ = s.Close()
		t.Fatal("opened with a wrong password")
	}
	cfg.Password, cfg.Prefix = "s3cret", "/elsewhere/"
	if s, _, err := etcdstore.Open(ctx, cfg, nil); err == nil {
		_ = s.Close()
		t.Fatal("opened a prefix the user may not write")
	}
}
