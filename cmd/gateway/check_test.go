package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCheckFlag: -check -config FILE validates a configuration without
// starting anything: a valid one prints "FILE: ok" and returns nil (exit
// 0); an invalid one returns every problem, each naming the file and its
// key once (exit 1).
func TestCheckFlag(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	check := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), args, &stdout, &stderr, nil)
		return stdout.String(), err
	}

	good := write("good.toml", "[gateway]\nlisten = \"127.0.0.1:0\"\nregistry_listen = \"127.0.0.1:0\"\nstate_dir = "+quote(filepath.Join(dir, "state"))+"\n")
	out, err := check("-check", "-config", good)
	if err != nil || out != good+": ok\n" {
		t.Fatalf("valid config: %q %v", out, err)
	}

	notDir := write("not-a-dir", "x")
	corruptDir := filepath.Join(dir, "corrupt")
	if err := os.MkdirAll(corruptDir, 0o700); err != nil {
		t.Fatal(err)
	}
	write("corrupt/routes.json", `{"epoch":"one"}`)
	for _, tc := range []struct {
		name, body string
		want       []string
	}{
		{"unknown key", "[gateway]\nstate_dir = " + quote(filepath.Join(dir, "s2")) + "\nlisten_addr = \"x\"\n", []string{"unknown key gateway.listen_addr"}},
		{"state_dir is a file", "[gateway]\nstate_dir = " + quote(notDir) + "\n", []string{"gateway.state_dir: " + notDir + " cannot be created"}},
		{"corrupt state file", "[gateway]\nstate_dir = " + quote(corruptDir) + "\n", []string{"gateway.state_dir: ", filepath.Join(corruptDir, "routes.json")}},
		{"missing TLS files and unset env", "[gateway]\nstate_dir = " + quote(filepath.Join(dir, "s3")) + "\n" +
			"tls_cert_file = " + quote(filepath.Join(dir, "none.crt")) + "\ntls_key_file = " + quote(filepath.Join(dir, "none.key")) + "\n" +
			"registry_token_env = \"TLGATE_TEST_CHECK_UNSET\"\n",
			[]string{"gateway.tls_cert_file", "registry_token_env", "TLGATE_TEST_CHECK_UNSET"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := write(strings.ReplaceAll(tc.name, " ", "-")+".toml", tc.body)
			out, err := check("-check", "-config", path)
			if err == nil {
				t.Fatalf("-check accepted %s (printed %q)", tc.body, out)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Fatalf("error %q does not contain %q", msg, w)
				}
			}
			if !strings.HasPrefix(msg, path+": ") || strings.Contains(msg, "gateway: gateway") {
				t.Fatalf("error %q does not start with the file %s, or repeats a prefix", msg, path)
			}
			if out != "" {
				t.Fatalf("printed %q for an invalid config", out)
			}
		})
	}
	if _, err := check("-check"); err == nil || !strings.Contains(err.Error(), "-check needs -config FILE") {
		t.Fatalf("-check without -config: %v", err)
	}
}

// TestStartupErrorNamesFileAndKey: a gateway that cannot start says so
// naming the config file and the key once, not "gateway: gateway: ...".
func TestStartupErrorNamesFileAndKey(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "state")
	if err := os.WriteFile(notDir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tlgate.toml")
	if err := os.WriteFile(path, []byte("[gateway]\nlisten = \"127.0.0.1:0\"\nregistry_listen = \"127.0.0.1:0\"\nstate_dir = "+quote(notDir)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-config", path}, &stdout, &stderr, nil)
	if err == nil {
		t.Fatal("the gateway started with a state_dir that is a file")
	}
	want := regexp.MustCompile("^" + regexp.QuoteMeta(path+": gateway.state_dir: "+notDir+" cannot be created: "))
	if !want.MatchString(err.Error()) || strings.Count(err.Error(), "gateway.state_dir") != 1 {
		t.Fatalf("error %q, want it to start with %v and name the key once", err, want)
	}
}

// TestVersionFlag: -version prints the version and the build information.
func TestVersionFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"-version"}, &stdout, &stderr, nil); err != nil {
		t.Fatal(err)
	}
	out := stdout.String()
	for _, w := range []string{"tlgate gateway ", "\ngo        go1.", "\nplatform  "} {
		if !strings.Contains(out, w) {
			t.Fatalf("-version printed %q, want it to contain %q", out, w)
		}
	}
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `\`, `\\`) + `"` }

// TestSIGHUPNamesRestartKeys: a reload applies what it can and names, in
// one warning, every changed key it did not apply because it needs a
// restart (nested tables key by key); keys overridden by flags and the
// keys a reload applies are not named.
func TestSIGHUPNamesRestartKeys(t *testing.T) {
	path, head, write := configFile(t, "")
	write(head)
	r := startRun(t, "-config", path, "-listen", "127.0.0.1:0")
	r.await(r.stderr, regexp.MustCompile(`"message":"(gateway started)"`))

	write(head + "heartbeat_interval = \"3s\"\nmax_attempts = 2\n" +
		"[[gateway.engines]]\nid = \"e1\"\nhttp_address = \"127.0.0.1:1\"\nmodel = \"m\"\nkind = \"vllm\"\n" +
		"[gateway.ejection]\nbase_time = \"20s\"\n[gateway.responses]\nstore_ttl = \"2h\"\n")
	r.sendReload()
	got := r.await(r.stderr, regexp.MustCompile(`"keys":(\[[^\]]*\])[^\n]*"message":"reload: these changed keys take effect only at a restart and were not applied"`))
	if want := `["gateway.ejection.base_time","gateway.heartbeat_interval","gateway.max_attempts","gateway.responses.store_ttl"]`; got != want {
		t.Fatalf("restart keys %s, want %s", got, want)
	}
	if !strings.Contains(r.stderr.String(), `"config":"`+path+`"`) {
		t.Fatalf("the warning does not name the file %s:\n%s", path, r.stderr)
	}
}
