// Package statefile persists the gateway's route table and its epoch in
// state_dir as routes.json, {"epoch":N,"routes":[...]}, the same body the
// admin API serves. Writes are atomic: a temporary file in the same
// directory is written, synced and renamed over the old one, and the
// directory is synced, so a crash leaves either the old table or the new
// one, never half of one. A file that cannot be read back whole and valid is
// an error naming the file and the problem; it never silently becomes an
// empty table.
package statefile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tlgate/tlgate/internal/routing/routes"
)

// FileName is the route table's file inside the state directory.
const FileName = "routes.json"

// tempPattern names the temporary files of Save (os.CreateTemp adds a
// random suffix); the leading dot keeps them out of casual listings.
const tempPattern = ".routes.json.tmp-*"

// ErrCorrupt is wrapped by Load's errors for a file that exists but does
// not hold a valid route table.
var ErrCorrupt = errors.New("statefile: corrupt route table file")

// Path returns the route table's file in dir.
func Path(dir string) string { return filepath.Join(dir, FileName) }

// ErrNotSaved is wrapped by SaveContext's error when its context ended
// before the file was replaced: the previous file is in force.
var ErrNotSaved = errors.New("statefile: not saved")

// Save writes epoch and rs to dir/routes.json atomically, creating dir
// (mode 0700) if needed. The file is mode 0600. On any error the previous
// file is left as it was and no temporary file remains.
func Save(dir string, epoch uint64, rs []routes.Route) error {
	return SaveContext(context.Background(), dir, epoch, rs)
}

// SaveContext is Save, which gives up once ctx is done, up to the moment
// the new file replaces the old one (the temporary file written and
// synced, a slow disk's part): then the old file stays, and the error
// wraps ErrNotSaved and ctx's error. Past that moment it completes.
func SaveContext(ctx context.Context, dir string, epoch uint64, rs []routes.Route) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotSaved, err)
	}
	body, err := routes.EncodeJSON(epoch, rs)
	if err != nil {
		return fmt.Errorf("statefile: %w", err)
	}
	body = append(body, '\n')
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("statefile: create state dir: %w", err)
	}
	tmp, err := os.CreateTemp(dir, tempPattern)
	if err != nil {
		return fmt.Errorf("statefile: create temporary file: %w", err)
	}
	tmpName := tmp.Name()
	fail := func(step string, err error) error {
		_ = tmp.Close()
		_ = os.Remove(tmpName)
		return fmt.Errorf("statefile: %s %s: %w", step, tmpName, err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		return fail("chmod", err)
	}
	if _, err := tmp.Write(body); err != nil {
		return fail("write", err)
	}
	if err := tmp.Sync(); err != nil {
		return fail("sync", err)
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmpName)
		return fmt.Errorf("statefile: close %s: %w", tmpName, err)
	}
	if err := ctx.Err(); err != nil {
		_ = os.Remove(tmpName)
		return fmt.Errorf("%w: %w", ErrNotSaved, err)
	}
	if err := os.Rename(tmpName, Path(dir)); err != nil {
		_ = os.Remove(tmpName)
		return fmt.Errorf("statefile: rename into %s: %w", Path(dir), err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("statefile: sync state dir %s: %w", dir, err)
	}
	return nil
}

// syncDir makes the rename durable: the directory entry is on disk once
// the directory itself is synced.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Load reads dir/routes.json, after removing the temporary files that
// interrupted Saves left behind. A missing file (or directory) gives
// found = false and no error; a dangling symlink is an error wrapping
// ErrCorrupt. A file that is not one JSON object with a
// non-negative integer "epoch" and a "routes" list that passes
// routes.Validate is an error wrapping ErrCorrupt that names the file and
// what is wrong; the caller should refuse to start rather than serve a
// table it did not mean to.
func Load(dir string) (epoch uint64, rs []routes.Route, found bool, err error) {
	if err := removeStale(dir); err != nil {
		return 0, nil, false, err
	}
	path := Path(dir)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		// A symlink whose target is gone is not "no table yet": the
		// operator meant a table to be there.
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			return 0, nil, true, fmt.Errorf("%w: %s: dangling symlink to %q", ErrCorrupt, path, target)
		}
		return 0, nil, false, nil
	}
	if err != nil {
		return 0, nil, false, fmt.Errorf("statefile: read %s: %w", path, err)
	}
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrCorrupt, path, fmt.Sprintf(format, args...))
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return 0, nil, true, corrupt("empty file")
	}
	rs, err = routes.ParseJSON(b)
	if err != nil {
		return 0, nil, true, corrupt("%v", err)
	}
	// ParseJSON has checked the shape (epoch, when present, is a
	// non-negative integer); the file must carry it.
	var doc struct {
		Epoch *uint64 `json:"epoch"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return 0, nil, true, corrupt("epoch: %v", err)
	}
	if doc.Epoch == nil {
		return 0, nil, true, corrupt("epoch: required")
	}
	if err := routes.Validate(rs); err != nil {
		return 0, nil, true, corrupt("%s", oneLine(err))
	}
	return *doc.Epoch, rs, true, nil
}

// BodySize is the size in bytes of the table body in dir/routes.json: the
// file's, less the newline Save ends it with, so that it is the size of
// the body Save was given to write (routes.EncodeJSON's).
func BodySize(dir string) (int64, error) {
	path := Path(dir)
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("statefile: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("statefile: %w", err)
	}
	n := fi.Size()
	if n == 0 {
		return 0, nil
	}
	var last [1]byte
	if _, err := f.ReadAt(last[:], n-1); err != nil {
		return 0, fmt.Errorf("statefile: read %s: %w", path, err)
	}
	if last[0] == '\n' {
		n--
	}
	return n, nil
}

// removeStale deletes the temporary files of Saves that a crash (kill -9)
// interrupted before their rename: they are never read, and would pile up.
// Load runs it at start, when no Save of this process is under way.
func removeStale(dir string) error {
	stale, err := filepath.Glob(filepath.Join(dir, tempPattern))
	if err != nil {
		return fmt.Errorf("statefile: list temporary files: %w", err)
	}
	for _, name := range stale {
		if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("statefile: remove stale temporary file: %w", err)
		}
	}
	return nil
}

// oneLine joins the lines of an errors.Join error with "; ".
func oneLine(err error) string {
	return string(bytes.ReplaceAll([]byte(err.Error()), []byte("\n"), []byte("; ")))
}

// CheckWritable makes sure Save can write in dir: it creates dir (mode
// 0700) if needed, then creates and removes a temporary file there. The
// error names dir and what failed.
func CheckWritable(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%s cannot be created: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, tempPattern)
	if err != nil {
		return fmt.Errorf("%s is not writable: %w", dir, err)
	}
	name := tmp.Name()
	_ = tmp.Close()
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("%s: remove %s: %w", dir, name, err)
	}
	return nil
}
