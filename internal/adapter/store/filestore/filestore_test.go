package filestore_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/internal/adapter/statefile"
	"github.com/tlgate/tlgate/internal/adapter/store/filestore"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// TestFileCompareAndSwap: of two writers on one epoch exactly one wins,
// and what it wrote is the file's.
func TestFileCompareAndSwap(t *testing.T) {
	dir := t.TempDir()
	f := filestore.New(dir, 1)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = f.PutRoutes(context.Background(), store.Version{Epoch: 1}, 2, []routes.Route{{Model: "m" + string(rune('a'+i))}})
		})
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		var ce *store.ConflictError
		switch {
		case err == nil:
			if won >= 0 {
				t.Fatalf("writers %d and %d both won", won, i)
			}
			won = i
		case !errors.As(err, &ce) || ce.Epoch != 2:
			t.Fatalf("writer %d: %v, want a conflict at epoch 2", i, err)
		}
	}
	epoch, rs, found, err := statefile.Load(dir)
	want := []routes.Route{{Model: "m" + string(rune('a'+won))}}
	if err != nil || !found || epoch != 2 || !reflect.DeepEqual(rs, want) {
		t.Fatalf("file: %d %v %v %v, want the winner's %v", epoch, rs, found, err, want)
	}
	if !f.Up() {
		t.Fatal("the file store is never down")
	}
	if rev, err := f.SetDrained(context.Background(), []string{"a"}, true); rev != 0 || err != nil {
		t.Fatalf("SetDrained: %d %v", rev, err)
	}
}

// TestFileWriteGivenUp: a write whose context ended before the file was
// replaced (the admin stopped waiting for a slow disk) is not made: it
// fails with ErrUnavailable, the file and the epoch in force stay, and
// the next write on that epoch succeeds.
func TestFileWriteGivenUp(t *testing.T) {
	dir := t.TempDir()
	f := filestore.New(dir, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.PutRoutes(ctx, store.Version{Epoch: 1}, 2, []routes.Route{{Model: "late"}}); !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, statefile.ErrNotSaved) {
		t.Fatalf("a write given up: %v, want ErrUnavailable (not saved)", err)
	}
	if _, _, found, err := statefile.Load(dir); found || err != nil {
		t.Fatalf("a file was written (%v, %v)", found, err)
	}
	if v, err := f.PutRoutes(context.Background(), store.Version{Epoch: 1}, 2, []routes.Route{{Model: "next"}}); err != nil || v.Epoch != 2 {
		t.Fatalf("the next write on epoch 1: %v %v", v, err)
	}
}
