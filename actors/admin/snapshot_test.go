package admin

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

func TestPlanSnapshot(t *testing.T) {
	body := func(epoch uint64, models ...string) []byte {
		rs := make([]routes.Route, len(models))
		for i, m := range models {
			rs[i] = routes.Route{Model: m}
		}
		b, err := store.EncodeTable(epoch, rs)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// The state: table {a} at epoch 3, written at revision 10; the last
	// snapshot applied was read at 12; "x" is drained.
	state := func() *State {
		tb, _ := routes.NewTable([]routes.Route{{Model: "a"}})
		s := NewState(tb, 3)
		s.tableRev, s.rev = 10, 12
		s.MarkDrained([]string{"x"}, true)
		return s
	}
	cases := []struct {
		name       string
		snap       store.Snapshot
		drainRev   int64
		stale      bool
		install    []string // the installed table's models; nil: none
		epoch      uint64
		refused    bool
		drain, res []string
		tableRev   int64
	}{
		{name: "older than the last applied", snap: store.Snapshot{Rev: 11, TableRev: 11, Table: body(4, "b")}, stale: true},
		{name: "same table, same drains", snap: store.Snapshot{Rev: 13, TableRev: 10, Table: body(3, "a"), Drained: []string{"x"}}, tableRev: 10},
		{name: "a newer table", snap: store.Snapshot{Rev: 14, TableRev: 14, Table: body(4, "b", "c"), Drained: []string{"x"}}, install: []string{"b", "c"}, epoch: 4, tableRev: 14},
		{name: "an older table is not reinstalled", snap: store.Snapshot{Rev: 14, TableRev: 9, Table: body(2, "old"), Drained: []string{"x"}}, tableRev: 10},
		{name: "an invalid table is refused", snap: store.Snapshot{Rev: 14, TableRev: 14, Table: []byte(`{"epoch":4,"routes":[{"model":""}]}`), Drained: []string{"x"}}, refused: true, tableRev: 14},
		{name: "not JSON is refused", snap: store.Snapshot{Rev: 14, TableRev: 14, Table: []byte(`{`), Drained: []string{"x"}}, refused: true, tableRev: 14},
		{name: "no epoch is refused", snap: store.Snapshot{Rev: 14, TableRev: 14, Table: []byte(`{"routes":[]}`), Drained: []string{"x"}}, refused: true, tableRev: 14},
		{name: "drains follow the store", snap: store.Snapshot{Rev: 13, TableRev: 10, Table: body(3, "a"), Drained: []string{"y", "z"}}, drain: []string{"y", "z"}, res: []string{"x"}, tableRev: 10},
		{name: "a drain written here after the snapshot wins", snap: store.Snapshot{Rev: 13, TableRev: 10, Table: body(3, "a")}, drainRev: 15, tableRev: 10},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := state()
			s.drainRev = c.drainRev
			p := s.PlanSnapshot(&c.snap)
			if p.Stale != c.stale {
				t.Fatalf("stale %v, want %v", p.Stale, c.stale)
			}
			if c.stale {
				return
			}
			switch {
			case c.install == nil && p.Table != nil:
				t.Fatalf("installs %v, want no table", p.Table.Models())
			case c.install != nil && (p.Table == nil || !slices.Equal(p.Table.Models(), c.install) || p.Version.Epoch != c.epoch || p.Version.Rev != c.snap.TableRev):
				t.Fatalf("plan %+v, want table %v at epoch %d", p, c.install, c.epoch)
			}
			if (p.Refused != nil) != c.refused || c.refused && !errors.Is(p.Refused, store.ErrInvalidTable) && !errors.Is(p.Refused, ErrInvalidRoutes) {
				t.Fatalf("refused %v, want refused=%v", p.Refused, c.refused)
			}
			if !slices.Equal(p.Drain, c.drain) || !slices.Equal(p.Resume, c.res) {
				t.Fatalf("drain %v resume %v, want %v %v", p.Drain, p.Resume, c.drain, c.res)
			}
			if p.Table != nil {
				s.CommitVersion(p.Table, p.Version)
			}
			s.ApplySnapshot(p)
			if s.tableRev != c.tableRev || s.rev != c.snap.Rev {
				t.Fatalf("after apply: tableRev %d rev %d, want %d %d", s.tableRev, s.rev, c.tableRev, c.snap.Rev)
			}
			if c.refused && s.epoch != 3 {
				t.Fatalf("a refused table changed the epoch to %d", s.epoch)
			}
			// Applied, the same snapshot changes nothing more.
			if again := s.PlanSnapshot(&c.snap); again.Table != nil || again.Refused != nil || len(again.Drain)+len(again.Resume) > 0 && c.drainRev == 0 {
				t.Fatalf("the same snapshot again plans %+v", again)
			}
		})
	}
}

func TestInstalls(t *testing.T) {
	s := NewState(nil, 1)
	s.tableRev = 10
	for _, c := range []struct {
		v    store.Version
		want bool
	}{{store.Version{Epoch: 2}, true}, {store.Version{Epoch: 2, Rev: 11}, true}, {store.Version{Epoch: 2, Rev: 10}, false}, {store.Version{Epoch: 2, Rev: 9}, false}} {
		if got := s.Installs(c.v); got != c.want {
			t.Errorf("Installs(%+v) at rev 10 = %v, want %v", c.v, got, c.want)
		}
	}
}

// TestStoredEpochNeverGoesBack: a stored table whose epoch is below the
// one in force, or within EpochMargin of the largest epoch, is refused and
// the table in force stays; so is one over the table bounds (routes,
// bytes). A later epoch within the bounds is installed.
func TestStoredEpochNeverGoesBack(t *testing.T) {
	enc := func(epoch uint64, n int) []byte {
		rs := make([]routes.Route, n)
		for i := range rs {
			rs[i] = routes.Route{Model: fmt.Sprintf("m%d", i)}
		}
		b, err := store.EncodeTable(epoch, rs)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name    string
		body    []byte
		refused error
	}{
		{"epoch lowered from 100 to 50", enc(50, 1), ErrEpochBack},
		{"epoch 2^64-1", enc(math.MaxUint64, 1), ErrEpochTooHigh},
		{"epoch within the margin", enc(math.MaxUint64-EpochMargin+1, 1), ErrEpochTooHigh},
		{"too many routes", enc(101, 11), ErrTableTooBig},
		{"too many bytes", append(enc(101, 1), bytes.Repeat([]byte(" "), 2000)...), ErrTableTooBig},
		{"a later epoch", enc(101, 2), nil},
		{"the margin's edge", enc(math.MaxUint64-EpochMargin, 1), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tb, _ := routes.NewTable([]routes.Route{{Model: "kept"}})
			s := NewState(tb, 100)
			s.SetBounds(Bounds{MaxRoutes: 10, MaxTableBytes: 1500})
			s.tableRev, s.rev = 10, 10
			p := s.PlanSnapshot(&store.Snapshot{Rev: 11, TableRev: 11, Table: tc.body})
			if tc.refused != nil {
				if !errors.Is(p.Refused, tc.refused) || p.Table != nil {
					t.Fatalf("plan %+v, want refused with %v", p, tc.refused)
				}
				s.ApplySnapshot(p)
				if s.epoch != 100 || !slices.Equal(s.table.Models(), []string{"kept"}) {
					t.Fatalf("the table in force changed: epoch %d, %v", s.epoch, s.table.Models())
				}
				// Not tried again.
				if again := s.PlanSnapshot(&store.Snapshot{Rev: 12, TableRev: 11, Table: tc.body}); again.Table != nil || again.Refused != nil {
					t.Fatalf("tried again: %+v", again)
				}
				return
			}
			if p.Refused != nil || p.Table == nil {
				t.Fatalf("plan %+v, want installed", p)
			}
		})
	}

}

// TestPutBounds: a PUT is held to the bounds a stored table is read with:
// over max_routes, or over max_table_bytes as it will be stored (at the
// next epoch), it is refused as invalid routes naming the key; at the
// bounds it is accepted.
func TestPutBounds(t *testing.T) {
	rs := []routes.Route{{Model: "a"}, {Model: "b"}, {Model: "c"}}
	stored, err := store.EncodeTable(2, rs)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		bounds Bounds
		says   string // "": accepted
	}{
		{"no bounds", Bounds{}, ""},
		{"at max_routes", Bounds{MaxRoutes: 3}, ""},
		{"over max_routes", Bounds{MaxRoutes: 2}, "3 routes, at most 2 (gateway.max_routes)"},
		{"at max_table_bytes", Bounds{MaxTableBytes: len(stored)}, ""},
		{"over max_table_bytes", Bounds{MaxTableBytes: len(stored) - 1}, fmt.Sprintf("%d bytes stored, at most %d (gateway.max_table_bytes)", len(stored), len(stored)-1)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewState(nil, 1)
			s.SetBounds(c.bounds)
			_, epoch, err := s.Prepare(&PutRoutes{IfMatch: ETag(1), Routes: rs})
			if c.says == "" {
				if err != nil || epoch != 2 {
					t.Fatalf("Prepare: epoch %d, %v; want epoch 2", epoch, err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidRoutes) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Prepare: %v, want invalid routes saying %q", err, c.says)
			}
		})
	}
}

// TestPutOverRefusedTableTakesLaterEpoch: a PUT on a replica that refused
// a stored table (one its bounds do not allow, that another replica put in
// force) replaces it at an epoch after it, so that the replicas that
// installed it take the new table instead of refusing it as older; the
// ETag the PUT checks is still the table in force here. A table every
// replica refuses (an invalid one, or an epoch within EpochMargin of the
// largest) is in force nowhere: its epoch is not followed.
func TestPutOverRefusedTableTakesLaterEpoch(t *testing.T) {
	three := []routes.Route{{Model: "a"}, {Model: "b"}, {Model: "c"}}
	for _, tc := range []struct {
		name   string
		stored uint64
		body   string // the stored table, when not three routes at stored
		want   uint64
	}{
		{"a later table over max_routes", 8, "", 9},
		{"an epoch at the end", math.MaxUint64, "", 6},
		{"an invalid table", 8, `{"epoch":8,"routes":[{"model":"a","backends":[{"model":"","weight":1}]}]}`, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := store.EncodeTable(tc.stored, three)
			if err != nil {
				t.Fatal(err)
			}
			if tc.body != "" {
				body = []byte(tc.body)
			}
			a := NewState(nil, 5)
			a.SetBounds(Bounds{MaxRoutes: 2})
			p := a.PlanSnapshot(&store.Snapshot{Rev: 20, TableRev: 20, Table: body})
			if p.Refused == nil {
				t.Fatalf("plan %+v, want refused", p)
			}
			a.ApplySnapshot(p)
			_, epoch, err := a.Prepare(&PutRoutes{IfMatch: ETag(5), Routes: three[:1]})
			if err != nil || epoch != tc.want {
				t.Fatalf("Prepare: epoch %d, %v; want %d", epoch, err, tc.want)
			}
			if tc.want > 6 {
				b := NewState(nil, tc.stored) // put the refused table in force
				if err := b.checkStored(100, epoch, 1); err != nil {
					t.Fatalf("the replica at epoch %d refuses the PUT's table: %v", tc.stored, err)
				}
			}
		})
	}
}
