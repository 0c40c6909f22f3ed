package admin

import (
	"slices"

	"github.com/tlgate/tlgate/internal/adapter/store"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// SnapshotPlan is what a store snapshot changes, decided by
// State.PlanSnapshot from the state and the snapshot alone.
type SnapshotPlan struct {
	// Stale: the snapshot is older than one already applied; it changes
	// nothing.
	Stale bool
	// Rev is the snapshot's revision.
	Rev int64
	// Table, when not nil, is the stored table to install at Version.
	Table   *routes.Table
	Version store.Version
	// TableRev is the revision of the stored table seen (installed or
	// refused).
	TableRev int64
	// Refused is why a stored table newer than the one in force was not
	// installed; the table in force stays.
	Refused error
	// Drain and Resume are the served models to drain and resume so that
	// the drains match the store's. Both are empty when a drain this
	// replica wrote is newer than the snapshot.
	Drain, Resume []string
}

// Version is the stored version of the table in force.
func (s *State) Version() store.Version { return store.Version{Epoch: s.epoch, Rev: s.tableRev} }

// CommitVersion installs a table at the stored version v.
func (s *State) CommitVersion(t *routes.Table, v store.Version) {
	s.Commit(t, v.Epoch)
	if v.Rev > s.tableRev {
		s.tableRev = v.Rev
	}
}

// Installs reports whether a table this replica wrote at v still needs
// installing: the file store has no revisions (always), a shared store's
// watch may have installed it first (its revision is then in force).
func (s *State) Installs(v store.Version) bool { return v.Rev == 0 || v.Rev > s.tableRev }

// DrainWritten records the revision of a drain this replica wrote, so an
// older snapshot does not undo it before the watch brings the write back.
func (s *State) DrainWritten(rev int64) {
	if rev > s.drainRev {
		s.drainRev = rev
	}
}

// PlanSnapshot decides what snap changes. A snapshot older than the last
// one applied is stale. A stored table written after the one in force is
// decoded and validated: valid, it is installed; invalid, it is refused
// (and not tried again). The drains become the snapshot's, unless this
// replica wrote a drain after the snapshot was read.
func (s *State) PlanSnapshot(snap *store.Snapshot) SnapshotPlan {
	if snap.Rev < s.rev {
		return SnapshotPlan{Stale: true}
	}
	p := SnapshotPlan{Rev: snap.Rev, TableRev: s.tableRev}
	if snap.TableRev > s.tableRev {
		p.TableRev = snap.TableRev
		epoch, rs, err := store.DecodeTable(snap.Table)
		var t *routes.Table
		if err == nil {
			t, err = ParseTable(nil, rs)
		}
		if err != nil {
			p.Refused = err
		} else {
			p.Table, p.Version = t, store.Version{Epoch: epoch, Rev: snap.TableRev}
		}
	}
	if snap.Rev >= s.drainRev {
		want := map[string]bool{}
		for _, m := range snap.Drained {
			want[m] = true
			if !s.drained[m] {
				p.Drain = append(p.Drain, m)
			}
		}
		for m := range s.drained {
			if !want[m] {
				p.Resume = append(p.Resume, m)
			}
		}
		slices.Sort(p.Drain)
		slices.Sort(p.Resume)
	}
	return p
}

// ApplySnapshot records a plan as applied (the table itself is installed
// by CommitVersion): the revisions seen and the drains.
func (s *State) ApplySnapshot(p SnapshotPlan) {
	if p.Stale {
		return
	}
	s.rev = p.Rev
	if p.TableRev > s.tableRev {
		s.tableRev = p.TableRev
	}
	s.MarkDrained(p.Drain, true)
	s.MarkDrained(p.Resume, false)
}
