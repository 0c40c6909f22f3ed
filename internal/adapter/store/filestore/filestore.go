// Package filestore is the single-replica implementation of the admin's
// store port (actors/admin/store): the route table in a state directory's
// routes.json, through internal/adapter/statefile.
package filestore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/internal/adapter/statefile"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// File is the single-replica store: the route table in dir/routes.json
// (internal/adapter/statefile: atomic writes, a corrupt file stops the
// start) and the drains in memory, in the admin actor.
// The epoch it last wrote is the compare of the compare-and-swap, under a
// mutex, so the file store needs no other serialisation than its own.
type File struct {
	dir   string
	mu    sync.Mutex
	epoch uint64
}

// PutRoutes writes rs at epoch next when prev.Epoch is the epoch in force.
// A write that ctx ends before the file is replaced (a slow disk) is not
// made, and fails with ErrUnavailable: the admin, which stops waiting
// then, keeps the table in force, as the file does.
func (f *File) PutRoutes(ctx context.Context, prev store.Version, next uint64, rs []routes.Route) (store.Version, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if prev.Epoch != f.epoch {
		return store.Version{}, &store.ConflictError{Epoch: f.epoch}
	}
	if err := statefile.SaveContext(ctx, f.dir, next, rs); err != nil {
		if errors.Is(err, statefile.ErrNotSaved) {
			return store.Version{}, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		}
		return store.Version{}, fmt.Errorf("store: %w", err)
	}
	f.epoch = next
	return store.Version{Epoch: next}, nil
}

// SetDrained keeps nothing: a single replica's drains live in its actors.
func (f *File) SetDrained(context.Context, []string, bool) (int64, error) { return 0, nil }

// Up is always true: the state directory is local.
func (f *File) Up() bool { return true }

// New returns the file store over dir whose table in force is at epoch
// (the table the gateway loaded from dir, or the configuration's).
func New(dir string, epoch uint64) *File { return &File{dir: dir, epoch: epoch} }
