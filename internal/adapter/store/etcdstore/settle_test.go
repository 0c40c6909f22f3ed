package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/internal/adapter/store/embedetcd"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// TestSettle: a table write whose answer was lost is settled by what etcd
// holds: the write's version when it committed, a conflict when another write
// moved the table on, not written when the table is still the one it was
// to replace; then the write can no longer commit, and the next table
// write clears the fence that stops it.
func TestSettle(t *testing.T) {
	c, err := embedetcd.Start(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errLost := errors.New("connection reset")
	ours := []routes.Route{{Model: "ours"}}
	cases := []struct {
		name   string
		before func(s *Store, prev store.Version) // what etcd saw before the settling
		want   error                              // nil: the write's version
		epoch  uint64                             // the stored epoch after
	}{
		{name: "the write committed", before: func(s *Store, prev store.Version) { put(t, s, prev, 2, ours) }, epoch: 2},
		{name: "another write moved the table on", before: func(s *Store, prev store.Version) { put(t, s, prev, 2, []routes.Route{{Model: "theirs"}}) }, want: store.ErrConflict, epoch: 2},
		{name: "the write committed, then another", before: func(s *Store, prev store.Version) {
			v := put(t, s, prev, 2, ours)
			put(t, s, v, 3, []routes.Route{{Model: "theirs"}})
		}, want: store.ErrConflict, epoch: 3},
		{name: "the write never reached etcd", before: func(*Store, store.Version) {}, want: store.ErrNotWritten, epoch: 1},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, snap, err := Open(ctx, Config{Endpoints: c.Endpoints(), Prefix: fmt.Sprintf("/settle-%d/", i), Logger: zerolog.Nop()}, []routes.Route{{Model: "seed"}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			prev := store.Version{Epoch: 1, Rev: snap.TableRev}
			body, err := store.EncodeTable(2, ours)
			if err != nil {
				t.Fatal(err)
			}
			tc.before(s, prev)
			fence := s.fences + "lost"
			v, err := s.settle(ctx, prev, body, fence, errLost)
			switch {
			case tc.want == nil && (err != nil || v.Epoch != 2 || v.Rev == 0):
				t.Fatalf("settle: %+v %v, want the write's version at epoch 2", v, err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("settle: %+v %v, want %v", v, err, tc.want)
			}
			var ce *store.ConflictError
			if errors.As(err, &ce) && ce.Epoch != tc.epoch {
				t.Fatalf("conflict at epoch %d, want %d", ce.Epoch, tc.epoch)
			}
			if tc.want == store.ErrNotWritten {
				// The write, reaching etcd only now, no longer commits.
				if resp, err := s.putTxn(ctx, prev, body, fence); err != nil || resp.Succeeded {
					t.Fatalf("the settled write committed after all: %v %v", resp, err)
				}
			}
			if got := storedEpoch(t, s); got != tc.epoch {
				t.Fatalf("etcd holds epoch %d, want %d", got, tc.epoch)
			}
			// A table write from what is stored clears every fence.
			cur, err := s.Current(ctx)
			if err != nil {
				t.Fatal(err)
			}
			put(t, s, store.Version{Epoch: tc.epoch, Rev: cur.TableRev}, tc.epoch+1, []routes.Route{{Model: "next"}})
			if n := count(t, s, s.fences); n != 0 {
				t.Fatalf("%d fences left after a table write", n)
			}
		})
	}
}

// TestLostAnswerIsUnknown: a table write whose request failed is an
// *store.UnknownOutcomeError (never a plain unavailable) that Settle
// settles; a drain's is one without Settle.
func TestLostAnswerIsUnknown(t *testing.T) {
	c, err := embedetcd.Start(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, snap, err := Open(ctx, Config{Endpoints: c.Endpoints(), Prefix: "/lost/", Logger: zerolog.Nop()}, []routes.Route{{Model: "seed"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	gone, stop := context.WithCancel(ctx)
	stop()
	_, err = s.PutRoutes(gone, store.Version{Epoch: 1, Rev: snap.TableRev}, 2, []routes.Route{{Model: "ours"}})
	var uo *store.UnknownOutcomeError
	if !errors.As(err, &uo) || uo.Settle == nil || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("PutRoutes with its request lost: %v, want an unknown outcome to settle", err)
	}
	if _, err := uo.Settle(ctx); !errors.Is(err, store.ErrNotWritten) {
		t.Fatalf("settle: %v, want not written", err)
	}
	if !s.Up() {
		t.Fatal("the store is down after etcd answered the settling")
	}
	if _, err := s.SetDrained(gone, []string{"m"}, true); !errors.As(err, &uo) || uo.Settle != nil {
		t.Fatalf("SetDrained with its request lost: %v, want an unknown outcome without Settle", err)
	}
}

// put writes rs at epoch next from prev, and fails the test otherwise.
func put(t *testing.T, s *Store, prev store.Version, next uint64, rs []routes.Route) store.Version {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := s.PutRoutes(ctx, prev, next, rs)
	if err != nil {
		t.Fatalf("put epoch %d: %v", next, err)
	}
	return v
}

func storedEpoch(t *testing.T, s *Store) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	snap, err := s.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	epoch, _, err := store.DecodeTable(snap.Table)
	if err != nil {
		t.Fatal(err)
	}
	return epoch
}

func count(t *testing.T, s *Store, prefix string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}
