package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/tlgate/tlgate/actors/admin/store"
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
	// TableGone: the stored table was deleted (by hand: the gateway never
	// deletes it). The table in force stays, and the next PUT stores a
	// table again, where the key is absent.
	TableGone bool
	// StoredEpoch is the epoch the stored table names when it is installed
	// or refused for this replica's bounds alone (another replica's may
	// allow it); 0 otherwise.
	StoredEpoch uint64
	// Drain and Resume are the served models to drain and resume so that
	// the drains match the store's. Both are empty when a drain this
	// replica wrote is newer than the snapshot.
	Drain, Resume []string
}

// EpochMargin is how close to the largest epoch (2^64 − 1) a stored table's
// epoch may come: one within it is refused, since every later PUT would
// have no epoch left to take.
const EpochMargin = 1 << 32

// Refusals of a stored table.
var (
	ErrEpochBack    = errors.New("admin: the stored epoch is below the one in force")
	ErrEpochTooHigh = errors.New("admin: the stored epoch is within the margin of the largest epoch")
	ErrTableTooBig  = errors.New("admin: the stored route table is over its bounds")
)

// Bounds limit a route table: its stored size in bytes and its routes; 0
// is no bound.
type Bounds struct {
	MaxRoutes     int
	MaxTableBytes int
}

// SetBounds sets the bounds stored tables (and PUTs) are held to.
func (s *State) SetBounds(b Bounds) { s.bounds = b }

// Check refuses a stored table of size bytes with epoch and n routes that
// breaks the bounds or whose epoch is within EpochMargin of the largest:
// the checks of a stored table that need no table in force, as at start.
// The error wraps ErrTableTooBig or ErrEpochTooHigh and names the figures
// (and the configuration key of a bound).
func (b Bounds) Check(size int, epoch uint64, n int) error {
	switch {
	case b.MaxTableBytes > 0 && size > b.MaxTableBytes:
		return fmt.Errorf("%w: %d bytes, at most %d (gateway.max_table_bytes)", ErrTableTooBig, size, b.MaxTableBytes)
	case b.MaxRoutes > 0 && n > b.MaxRoutes:
		return fmt.Errorf("%w: %d routes, at most %d (gateway.max_routes)", ErrTableTooBig, n, b.MaxRoutes)
	case epoch > math.MaxUint64-EpochMargin:
		return fmt.Errorf("%w: epoch %d, at most %d (2^64 − 1 − 2^32)", ErrEpochTooHigh, epoch, uint64(math.MaxUint64-EpochMargin))
	}
	return nil
}

// checkStored refuses a stored table of size bytes with epoch and n routes
// that breaks the bounds or would take the epoch back or to its end.
func (s *State) checkStored(size int, epoch uint64, n int) error {
	if err := s.bounds.Check(size, epoch, n); err != nil {
		return err
	}
	if epoch < s.epoch {
		return fmt.Errorf("%w: stored %d, in force %d", ErrEpochBack, epoch, s.epoch)
	}
	return nil
}

// tableEpoch is the epoch a stored table body names, if it names one
// (whether or not the table is valid).
func tableEpoch(body []byte) (uint64, bool) {
	var doc struct {
		Epoch *uint64 `json:"epoch"`
	}
	if json.Unmarshal(body, &doc) != nil || doc.Epoch == nil {
		return 0, false
	}
	return *doc.Epoch, true
}

// Version is the stored version of the table in force.
func (s *State) Version() store.Version { return store.Version{Epoch: s.epoch, Rev: s.tableRev} }

// CommitVersion installs a table at the stored version v.
func (s *State) CommitVersion(t *routes.Table, v store.Version) {
	s.Commit(t, v.Epoch)
	s.storedEpoch = max(s.storedEpoch, v.Epoch)
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
// decoded and validated: valid, it is installed; invalid, over the bounds,
// with an epoch below the one in force or within EpochMargin of the
// largest, it is refused (and not tried again). The drains become the snapshot's, unless this
// replica wrote a drain after the snapshot was read.
func (s *State) PlanSnapshot(snap *store.Snapshot) SnapshotPlan {
	if snap.Rev < s.rev {
		return SnapshotPlan{Stale: true}
	}
	p := SnapshotPlan{Rev: snap.Rev, TableRev: s.tableRev}
	p.TableGone = snap.TableRev == 0 && s.tableRev > 0
	if snap.TableRev > s.tableRev {
		p.TableRev = snap.TableRev
		var (
			epoch uint64
			rs    []routes.Route
			t     *routes.Table
			err   error
		)
		if s.bounds.MaxTableBytes > 0 && len(snap.Table) > s.bounds.MaxTableBytes {
			err = s.checkStored(len(snap.Table), s.epoch, 0)
		} else if epoch, rs, err = store.DecodeTable(snap.Table); err == nil {
			if err = s.checkStored(len(snap.Table), epoch, len(rs)); err == nil {
				t, err = ParseTable(nil, rs)
			}
		}
		if err == nil || errors.Is(err, ErrTableTooBig) {
			// In force, or maybe in force on a replica whose bounds allow
			// it (a table every replica refuses is no other's either).
			if e, ok := tableEpoch(snap.Table); ok && e <= math.MaxUint64-EpochMargin {
				p.StoredEpoch = e
			}
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
	if p.TableGone {
		s.tableRev = 0 // a PUT's compare-and-swap is on the key being absent
	}
	s.storedEpoch = max(s.storedEpoch, p.StoredEpoch)
	s.MarkDrained(p.Drain, true)
	s.MarkDrained(p.Resume, false)
}
