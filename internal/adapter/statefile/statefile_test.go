package statefile_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/adapter/statefile"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func table() []routes.Route {
	return []routes.Route{
		{Model: "smol", Aliases: []string{"smol-latest"}, Backends: []routes.Backend{{Model: "smol-v3", Weight: 0.9}, {Model: "smol-v4", Weight: 0.1}}},
		{Model: "auto", Cascade: []routes.Step{{Model: "smol", AcceptIf: "mean_logprob > -1.2"}, {Model: "big"}}},
		{Model: "big-pd", Backends: []routes.Backend{{Model: "big", Weight: 1}}, Targets: []string{"disaggregated"}},
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "nested")
	if _, _, found, err := statefile.Load(dir); found || err != nil {
		t.Fatalf("Load of a missing dir: found=%v err=%v, want not found and no error", found, err)
	}
	if err := statefile.Save(dir, 7, table()); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("state dir mode %v, want 0700", perm)
	}
	fi, err = os.Stat(statefile.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("routes.json mode %v, want 0600", perm)
	}
	epoch, rs, found, err := statefile.Load(dir)
	if err != nil || !found {
		t.Fatalf("Load: found=%v err=%v", found, err)
	}
	if epoch != 7 || !reflect.DeepEqual(rs, table()) {
		t.Fatalf("Load = %d %+v, want 7 %+v", epoch, rs, table())
	}

	// Overwrite: the new table replaces the old one whole.
	if err := statefile.Save(dir, 8, nil); err != nil {
		t.Fatal(err)
	}
	epoch, rs, found, err = statefile.Load(dir)
	if err != nil || !found || epoch != 8 || len(rs) != 0 {
		t.Fatalf("after overwrite: %d %+v found=%v err=%v, want 8 and an empty table", epoch, rs, found, err)
	}
	b, _ := os.ReadFile(statefile.Path(dir))
	if string(b) != `{"epoch":8,"routes":[]}`+"\n" {
		t.Errorf("file holds %q", b)
	}
}

// TestSaveLeavesNoTempFiles: after many writes the directory holds the one
// file; a write that fails (the target is a directory) leaves the old
// table and no temporary file either.
func TestSaveLeavesNoTempFiles(t *testing.T) {
	dir := t.TempDir()
	for i := range 5 {
		if err := statefile.Save(dir, uint64(i), table()); err != nil {
			t.Fatal(err)
		}
	}
	if names := list(t, dir); !reflect.DeepEqual(names, []string{statefile.FileName}) {
		t.Fatalf("dir holds %v, want only %s", names, statefile.FileName)
	}

	bad := t.TempDir()
	if err := os.Mkdir(statefile.Path(bad), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(statefile.Path(bad), "keep"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := statefile.Save(bad, 1, table())
	if err == nil {
		t.Fatal("Save over a non-empty directory succeeded")
	}
	if !strings.Contains(err.Error(), "rename") {
		t.Errorf("error %q does not say the rename failed", err)
	}
	if names := list(t, bad); !reflect.DeepEqual(names, []string{statefile.FileName}) {
		t.Fatalf("after a failed save dir holds %v, want only the old %s", names, statefile.FileName)
	}
}

func list(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestLoadCorrupt(t *testing.T) {
	cases := []struct {
		name, body, want string
	}{
		{"empty", "", "empty file"},
		{"blank", " \n", "empty file"},
		{"not json", "epoch=3", "not valid JSON (at byte 1)"},
		{"truncated", `{"epoch":3,"routes":[{"model":"smol"}`, "not valid JSON: it ends inside a value"},
		{"trailing", `{"epoch":3,"routes":[]} {}`, "trailing data"},
		{"no epoch", `{"routes":[]}`, "epoch: required"},
		{"null epoch", `{"epoch":null,"routes":[]}`, "epoch: required"},
		{"negative epoch", `{"epoch":-1,"routes":[]}`, "epoch: want a non-negative integer"},
		{"no routes", `{"epoch":3}`, "routes: required"},
		{"null routes", `{"epoch":3,"routes":null}`, "routes: required, got null"},
		{"unknown field", `{"epoch":3,"routes":[{"model":"smol","weight":1}]}`, "routes[0].weight: unknown field"},
		{"invalid rule", `{"epoch":3,"routes":[{"model":"a","cascade":[{"model":"b","accept_if":"mean > 1"},{"model":"c"}]}]}`, "routes[0].cascade[0].accept_if"},
		{"duplicate model", `{"epoch":3,"routes":[{"model":"a"},{"model":"a"}]}`, "routes[1].model"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := statefile.Path(dir)
			if err := os.WriteFile(path, []byte(c.body), 0o600); err != nil {
				t.Fatal(err)
			}
			_, rs, found, err := statefile.Load(dir)
			if err == nil {
				t.Fatalf("Load accepted %q as %+v", c.body, rs)
			}
			if !errors.Is(err, statefile.ErrCorrupt) {
				t.Errorf("error %v does not wrap ErrCorrupt", err)
			}
			if !found {
				t.Error("found = false for a file that exists")
			}
			if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, c.want) {
				t.Errorf("error %q should name %s and say %q", msg, path, c.want)
			}
		})
	}
}

func TestLoadUnreadable(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(statefile.Path(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	_, _, _, err := statefile.Load(dir)
	if err == nil || !strings.Contains(err.Error(), statefile.Path(dir)) {
		t.Fatalf("Load of a directory named routes.json: %v, want an error naming it", err)
	}
}

// TestLoadDanglingSymlink: a routes.json that points nowhere is an error,
// not a missing table (which would start on the config's routes silently).
func TestLoadDanglingSymlink(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(dir, "gone.json"), statefile.Path(dir)); err != nil {
		t.Fatal(err)
	}
	_, _, found, err := statefile.Load(dir)
	if !errors.Is(err, statefile.ErrCorrupt) || !found || !strings.Contains(err.Error(), "dangling symlink") {
		t.Fatalf("Load of a dangling symlink: found=%v err=%v, want a dangling-symlink error", found, err)
	}
	// A symlink to a good file is followed.
	if err := statefile.Save(filepath.Join(dir, "real"), 4, table()); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if err := os.Symlink(statefile.Path(filepath.Join(dir, "real")), statefile.Path(other)); err != nil {
		t.Fatal(err)
	}
	if epoch, _, found, err := statefile.Load(other); err != nil || !found || epoch != 4 {
		t.Fatalf("Load through a good symlink = %d, %v, %v", epoch, found, err)
	}
}

// TestLoadRemovesStaleTempFiles: temporary files a crash left behind are
// removed at start; other files are kept.
func TestLoadRemovesStaleTempFiles(t *testing.T) {
	dir := t.TempDir()
	if err := statefile.Save(dir, 2, table()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{".routes.json.tmp-123", ".routes.json.tmp-abc", "keep.txt"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(`{"epoch":9,"rou`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if epoch, _, found, err := statefile.Load(dir); err != nil || !found || epoch != 2 {
		t.Fatalf("Load = %d, %v, %v", epoch, found, err)
	}
	left, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	hidden, _ := filepath.Glob(filepath.Join(dir, ".*"))
	left = append(left, hidden...)
	want := []string{statefile.Path(dir), filepath.Join(dir, "keep.txt")}
	slices.Sort(left)
	slices.Sort(want)
	if !reflect.DeepEqual(left, want) {
		t.Fatalf("after Load the state dir holds %v, want %v", left, want)
	}
}

// TestBodySize: the size of the table body in routes.json is the file's
// less the newline Save ends it with: the size of the body Save was
// given.
func TestBodySize(t *testing.T) {
	rs := []routes.Route{{Model: "a"}, {Model: "b"}}
	body, err := routes.EncodeJSON(7, rs)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		write func(dir string) error
		want  int64
	}{
		{"written by Save", func(dir string) error { return statefile.Save(dir, 7, rs) }, int64(len(body))},
		{"without a final newline", func(dir string) error { return os.WriteFile(statefile.Path(dir), body, 0o600) }, int64(len(body))},
		{"with two", func(dir string) error { return os.WriteFile(statefile.Path(dir), append(body, '\n', '\n'), 0o600) }, int64(len(body)) + 1},
		{"empty", func(dir string) error { return os.WriteFile(statefile.Path(dir), nil, 0o600) }, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := c.write(dir); err != nil {
				t.Fatal(err)
			}
			if got, err := statefile.BodySize(dir); err != nil || got != c.want {
				t.Fatalf("BodySize = %d, %v; want %d", got, err, c.want)
			}
		})
	}
	if _, err := statefile.BodySize(t.TempDir()); err == nil {
		t.Fatal("BodySize of a state_dir without routes.json: no error")
	}
}
