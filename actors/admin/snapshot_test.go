package admin

import (
	"errors"
	"slices"
	"testing"

	"github.com/tlgate/tlgate/internal/adapter/store"
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
