package store_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"

	"github.com/tlgate/tlgate/internal/adapter/statefile"
	"github.com/tlgate/tlgate/internal/adapter/store"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestDecodeTable(t *testing.T) {
	cases := []struct {
		body  string
		epoch uint64
		ok    bool
	}{
		{`{"epoch":3,"routes":[{"model":"a"}]}`, 3, true},
		{`{"epoch":0,"routes":[]}`, 0, true},
		{``, 0, false},
		{`{"routes":[]}`, 0, false},
		{`{"epoch":-1,"routes":[]}`, 0, false},
		{`{"epoch":1,"routes":[{"model":""}]}`, 0, false},
		{`{"epoch":1,"routes":[{"model":"a"},{"model":"a"}]}`, 0, false},
		{`[1]`, 0, false},
	}
	for _, c := range cases {
		epoch, _, err := store.DecodeTable([]byte(c.body))
		if c.ok != (err == nil) || c.ok && epoch != c.epoch {
			t.Errorf("DecodeTable(%s) = %d, %v; want ok=%v epoch %d", c.body, epoch, err, c.ok, c.epoch)
		}
		if err != nil && !errors.Is(err, store.ErrInvalidTable) {
			t.Errorf("DecodeTable(%s): %v does not wrap ErrInvalidTable", c.body, err)
		}
	}
}

// TestFileCompareAndSwap: of two writers on one epoch exactly one wins,
// and what it wrote is the file's.
func TestFileCompareAndSwap(t *testing.T) {
	dir := t.TempDir()
	f := store.NewFile(dir, 1)
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
