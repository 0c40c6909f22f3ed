package tlctl

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestState(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		w    worker
		want string
	}{
		{"routable", worker{Routable: true}, "routable"},
		{"suspect", worker{Routable: true, ConsecutiveFailures: 2}, "suspect"},
		{"ejected", worker{Routable: true, EjectedUntil: now.Add(time.Second).Format(time.RFC3339Nano)}, "ejected"},
		{"ejection over", worker{Routable: true, EjectedUntil: now.Add(-time.Second).Format(time.RFC3339Nano)}, "routable"},
		{"drained first", worker{Routable: true, Drained: true, ConsecutiveFailures: 1}, "drained"},
		{"draining", worker{Draining: true}, "draining"},
		{"unroutable", worker{ConsecutiveFailures: 1}, "unroutable"},
	}
	for _, tc := range cases {
		if got := state(tc.w, now); got != tc.want {
			t.Errorf("%s: state %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestKeyNeverOnTheCommandLine: -key is refused (ps would show it);
// -key-file reads the key from a file, an empty or missing file is an
// error.
func TestKeyNeverOnTheCommandLine(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "key")
	if err := os.WriteFile(file, []byte("  secret-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(k string) string { return map[string]string{"TLGATE_KEY": "env-key"}[k] }
	var out, errOut bytes.Buffer
	if code := Run(context.Background(), []string{"-key", "secret-key", "workers"}, env, &out, &errOut); code != ExitUsage ||
		!strings.Contains(errOut.String(), "-key is refused") || strings.Contains(errOut.String(), "secret-key") {
		t.Fatalf("-key: exit %d, %q", code, errOut.String())
	}
	for _, tc := range []struct {
		file, want string
		err        bool
	}{{"", "env-key", false}, {file, "secret-key", false}, {empty, "", true}, {filepath.Join(dir, "none"), "", true}} {
		k, err := adminKey(env, tc.file)
		if k != tc.want || (err != nil) != tc.err {
			t.Errorf("adminKey(%q) = %q, %v", tc.file, k, err)
		}
	}
}

// TestURLCredentialsRedacted: no error shows a URL's user name or password.
func TestURLCredentialsRedacted(t *testing.T) {
	env := func(k string) string {
		return map[string]string{"TLGATE_URL": "http://admin:hunter2@127.0.0.1:1", "TLGATE_KEY": "k"}[k]
	}
	var out, errOut bytes.Buffer
	if code := Run(context.Background(), []string{"-timeout", "2s", "workers"}, env, &out, &errOut); code != ExitFailed ||
		strings.Contains(errOut.String(), "hunter2") || strings.Contains(errOut.String(), "admin:") || !strings.Contains(errOut.String(), "redacted@127.0.0.1:1") {
		t.Fatalf("unreachable gateway: exit %d, %q", code, errOut.String())
	}
	errOut.Reset()
	bad := func(k string) string { return map[string]string{"TLGATE_URL": "ftp://alice:pw@host"}[k] }
	if code := Run(context.Background(), []string{"workers"}, bad, &out, &errOut); code != ExitUsage ||
		strings.Contains(errOut.String(), "alice") || strings.Contains(errOut.String(), "pw@") {
		t.Fatalf("bad URL: exit %d, %q", code, errOut.String())
	}
	for in, want := range map[string]string{
		"parse \"http://u:p@h:x/\": bad port": "parse \"http://redacted@h:x/\": bad port",
		"http://h/a@b":                        "http://h/a@b",
		"no url":                              "no url",
		"a://x@y and b://z@w/q":               "a://redacted@y and b://redacted@w/q",
	} {
		if got := redactText(in); got != want {
			t.Errorf("redactText(%q) = %q, want %q", in, got, want)
		}
	}
}
