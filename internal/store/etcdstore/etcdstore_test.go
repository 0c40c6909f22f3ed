package etcdstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/tlgate/tlgate/internal/routes"
	"github.com/tlgate/tlgate/internal/store"
	"github.com/tlgate/tlgate/internal/store/embedetcd"
	"github.com/tlgate/tlgate/internal/store/etcdstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdIgnores()...) }

// etcdIgnores are the etcd server's and client's goroutines that outlive
// a closed member by a moment (their loggers and the grpc balancer).
func etcdIgnores() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
	}
}

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
