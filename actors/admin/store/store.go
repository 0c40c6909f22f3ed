// Package store is the admin actor's port to where the gateway keeps its
// control state: the route table with its epoch, and the served models an
// operator drained. It holds the Store interface, its errors and the
// stored table's codec; the adapters implement it: filestore (one
// replica, the table in state_dir/routes.json through
// internal/adapter/statefile, drains in memory only) and etcdstore
// (several replicas share the table and the drains, each watching for
// changes), both under internal/adapter/store.
//
// A write is a compare-and-swap: PutRoutes names the version (epoch and
// store revision) the writer read, and fails with ErrConflict when the
// stored table has moved on, so two replicas racing on one ETag get one
// success and one conflict. A write whose answer was lost (a shared
// store's connection dropped, its deadline passed) may have committed:
// it fails with an *UnknownOutcomeError, whose Settle tells which it was.
// Liveness (which workers are up) is not stored: every replica keeps its
// own registry and timers.
package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Errors a store's writes can wrap.
var (
	// ErrConflict: the stored table is not the version the writer read
	// (a *ConflictError carries the stored epoch).
	ErrConflict = errors.New("store: the stored route table has changed")
	// ErrUnavailable: the store could not be reached. A write failing so
	// was not made, unless its error also wraps ErrOutcomeUnknown.
	ErrUnavailable = errors.New("store: unavailable")
	// ErrOutcomeUnknown: a write was sent and its answer lost (the
	// connection dropped, the deadline passed): the store may have
	// committed it, or may still (an *UnknownOutcomeError).
	ErrOutcomeUnknown = errors.New("store: the write's answer was lost")
	// ErrNotWritten: a write whose answer was lost is known, read back,
	// not to have committed, and can no longer: the stored table is still
	// the one it was to replace.
	ErrNotWritten = errors.New("store: not written")
	// ErrInvalidTable: a stored table that is not a valid route table.
	ErrInvalidTable = errors.New("store: invalid stored route table")
)

// Version names a stored table: its epoch and the store revision that
// wrote it (0 for the file store, which has no revisions).
type Version struct {
	Epoch uint64
	Rev   int64
}

// ConflictError is PutRoutes's error when the stored table has moved on;
// Epoch is the stored table's epoch (the ETag a client should reread).
type ConflictError struct{ Epoch uint64 }

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%v (stored epoch %d)", ErrConflict, e.Epoch)
}

// Unwrap lets errors.Is(err, ErrConflict) match.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// UnknownOutcomeError is the error of a write whose answer was lost. It
// wraps ErrOutcomeUnknown, ErrUnavailable and the client's error.
type UnknownOutcomeError struct {
	Err error
	// Settle, when not nil, finds out what became of a PutRoutes: it makes
	// the write unable to commit from then on and reads the store back. It
	// returns the version written when the write committed; a
	// *ConflictError when another write moved the table on; an error
	// wrapping ErrNotWritten when the stored table is still the one the
	// write was to replace; else (the store cannot be read) an
	// *UnknownOutcomeError again. A drain's has none: a drain sets a state,
	// which reading the store shows.
	Settle func(ctx context.Context) (Version, error)
}

func (e *UnknownOutcomeError) Error() string { return fmt.Sprintf("%v: %v", ErrOutcomeUnknown, e.Err) }

// Unwrap lets errors.Is match ErrOutcomeUnknown, ErrUnavailable and the
// client's error.
func (e *UnknownOutcomeError) Unwrap() []error {
	return []error{ErrOutcomeUnknown, ErrUnavailable, e.Err}
}

// Store is a place for the route table and the drains.
type Store interface {
	// PutRoutes stores rs at epoch next if the stored table is still prev,
	// and returns the version written. It fails with a *ConflictError when
	// the stored table changed, with ErrUnavailable when the store is out
	// of reach, and with an *UnknownOutcomeError when the write was sent
	// and its answer lost.
	PutRoutes(ctx context.Context, prev Version, next uint64, rs []routes.Route) (Version, error)
	// SetDrained records served models as drained (on) or resumed, and
	// returns the store revision of the write (0 when the store has none).
	// It fails as PutRoutes does, never with a conflict.
	SetDrained(ctx context.Context, models []string, on bool) (int64, error)
	// Up reports whether the store can be reached now; a store that is
	// down answers writes with ErrUnavailable.
	Up() bool
}

// Reader is a shared store that can be read whole at its current
// revision (the etcd store); the file store is the only writer of its
// table and needs none.
type Reader interface {
	Current(ctx context.Context) (Snapshot, error)
}

// Snapshot is a shared store's whole state at one revision, as a watching
// replica receives it: the raw table (to be decoded and validated by the
// receiver, which refuses an invalid one and keeps its table), the
// revision that last wrote it, and the drained served models.
type Snapshot struct {
	// Rev is the store's revision when the snapshot was read.
	Rev int64
	// TableRev is the revision that last wrote the table; 0 when there is
	// no table stored.
	TableRev int64
	// Table is the stored table's body, {"epoch":N,"routes":[...]}.
	Table []byte
	// Drained are the drained served models, sorted.
	Drained []string
}

// DecodeTable decodes a stored table body, {"epoch":N,"routes":[...]}
// (the body of GET /admin/v1/routes and of routes.json), and validates
// it. Errors wrap ErrInvalidTable and name the problem.
func DecodeTable(body []byte) (uint64, []routes.Route, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return 0, nil, fmt.Errorf("%w: empty", ErrInvalidTable)
	}
	rs, err := routes.ParseJSON(body)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %v", ErrInvalidTable, err)
	}
	var doc struct {
		Epoch *uint64 `json:"epoch"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return 0, nil, fmt.Errorf("%w: epoch: %v", ErrInvalidTable, err)
	}
	if doc.Epoch == nil {
		return 0, nil, fmt.Errorf("%w: epoch: required", ErrInvalidTable)
	}
	if err := routes.Validate(rs); err != nil {
		return 0, nil, fmt.Errorf("%w: %s", ErrInvalidTable, bytes.ReplaceAll([]byte(err.Error()), []byte("\n"), []byte("; ")))
	}
	return *doc.Epoch, rs, nil
}

// EncodeTable is the stored body of rs at epoch (DecodeTable's input).
func EncodeTable(epoch uint64, rs []routes.Route) ([]byte, error) {
	b, err := routes.EncodeJSON(epoch, rs)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return b, nil
}
