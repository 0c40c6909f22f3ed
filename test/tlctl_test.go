package test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/tool/tlctl"
)

// tlctlRun runs one tlctl command line against the cluster with env as its
// environment.
func (c *cluster) tlctl(env map[string]string, args ...string) (code int, stdout, stderr string) {
	c.t.Helper()
	var out, errOut bytes.Buffer
	code = tlctl.Run(context.Background(), args, func(k string) string { return env[k] }, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestTLCtl drives every tlctl command against a running gateway: the
// workers table and JSON, routes get (file and ETag beside it), put with
// that ETag, a stale ETag refused with the server's message, drain and
// resume, and the errors a user meets (no key, unknown model, bad usage).
func TestTLCtl(t *testing.T) {
	c := newCluster(t, `
[[gateway.routes]]
model = "smol"
backends = [{ model = "m", weight = 1 }]
`, []clusterOpt{keys()}, enginesim.Config{ID: "w1", Model: "m"}, enginesim.Config{ID: "w2", Model: "m"})
	env := map[string]string{"TLGATE_URL": c.url, "TLGATE_KEY": "key-admin"}

	code, out, errOut := c.tlctl(env, "workers")
	if code != 0 || !strings.Contains(out, "w1") || !strings.Contains(out, "w2") || !strings.Contains(out, "routable") ||
		!strings.Contains(out, "CACHE VIEW") || strings.Count(out, "approximate") != 2 {
		t.Fatalf("workers (both routable, on the prefix index): %d\n%s%s", code, out, errOut)
	}
	code, out, _ = c.tlctl(env, "-o", "json", "workers")
	var ws struct {
		Workers []struct{ ID string } `json:"workers"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &ws) != nil || len(ws.Workers) != 2 {
		t.Fatalf("workers -o json: %d %q", code, out)
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "routes.json")
	if code, out, errOut = c.tlctl(env, "routes", "get", "-f", file); code != 0 {
		t.Fatalf("routes get: %d %s%s", code, out, errOut)
	}
	etag, err := os.ReadFile(file + ".etag")
	if err != nil || strings.TrimSpace(string(etag)) != c.get("/admin/v1/routes", "key-admin").header.Get("ETag") {
		t.Fatalf("ETag file %q, %v", etag, err)
	}
	stale := strings.TrimSpace(string(etag))

	// Edit the table and put it back with the ETag beside the file.
	b, _ := os.ReadFile(file)
	edited := strings.Replace(string(b), `"model": "smol"`, `"model": "smol", "aliases": ["smol-latest"]`, 1)
	if err := os.WriteFile(file, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut = c.tlctl(env, "routes", "put", "-f", file); code != 0 || !strings.Contains(out, "installed") {
		t.Fatalf("routes put: %d %s%s", code, out, errOut)
	}
	if r := c.get("/v1/models/smol-latest", "key-plain"); r.status != 200 {
		t.Fatalf("the put table is not in force: %d", r.status)
	}
	if next, _ := os.ReadFile(file + ".etag"); strings.TrimSpace(string(next)) == stale {
		t.Fatalf("the ETag file was not updated after the put: %q", next)
	}
	code, out, _ = c.tlctl(env, "routes", "get")
	if code != 0 || !strings.Contains(out, "smol-latest") || !strings.Contains(out, "m (1)") {
		t.Fatalf("routes get (table): %d\n%s", code, out)
	}

	// A stale ETag: refused, with the server's message and a non-zero exit.
	code, _, errOut = c.tlctl(env, "routes", "put", "-f", file, "-etag", stale)
	if code != tlctl.ExitFailed || !strings.Contains(errOut, "412 etag_mismatch") || !strings.Contains(errOut, "changed since") {
		t.Fatalf("stale put: %d %q", code, errOut)
	}
	// An invalid table: the field the server names is shown.
	bad := filepath.Join(dir, "bad.json")
	_ = os.WriteFile(bad, []byte(`{"routes":[{"model":"x","cascade":[{"model":"m"}]}]}`), 0o644)
	_ = os.WriteFile(bad+".etag", []byte(c.get("/admin/v1/routes", "key-admin").header.Get("ETag")), 0o644)
	code, _, errOut = c.tlctl(env, "routes", "put", "-f", bad)
	if code != tlctl.ExitFailed || !strings.Contains(errOut, "invalid_routes") || !strings.Contains(errOut, "routes[0].cascade") {
		t.Fatalf("invalid put: %d %q", code, errOut)
	}

	if code, out, errOut = c.tlctl(env, "drain", "m"); code != 0 || !strings.Contains(out, "drained m") {
		t.Fatalf("drain: %d %s%s", code, out, errOut)
	}
	eventually(t, 10*eventuallyUnit, func() bool {
		_, out, _ := c.tlctl(env, "workers")
		return strings.Count(out, "drained") == 2
	}, "both workers shown drained")
	if code, out, errOut = c.tlctl(env, "resume", "m"); code != 0 || !strings.Contains(out, "resumed m") {
		t.Fatalf("resume: %d %s%s", code, out, errOut)
	}

	keyFile := filepath.Join(dir, "admin.key")
	if err := os.WriteFile(keyFile, []byte("key-admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string
	}{
		{"unknown model", env, []string{"drain", "nope"}, tlctl.ExitFailed, "404 model_not_found"},
		{"no key", map[string]string{"TLGATE_URL": c.url}, []string{"workers"}, tlctl.ExitFailed, "401 invalid_api_key"},
		{"no key says which to set", map[string]string{"TLGATE_URL": c.url}, []string{"workers"}, tlctl.ExitFailed, "set TLGATE_KEY"},
		{"wrong scope", map[string]string{"TLGATE_URL": c.url, "TLGATE_KEY": "key-plain"}, []string{"workers"}, tlctl.ExitFailed, "403 insufficient_scope"},
		{"-key-file overrides", map[string]string{"TLGATE_URL": c.url, "TLGATE_KEY": "key-plain"}, []string{"-key-file", keyFile, "workers"}, 0, ""},
		{"-key refused", env, []string{"-key", "key-admin", "workers"}, tlctl.ExitUsage, "-key is refused"},
		{"no command", env, nil, tlctl.ExitUsage, "no command"},
		{"unknown command", env, []string{"frobnicate"}, tlctl.ExitUsage, "unknown command"},
		{"put without file", env, []string{"routes", "put"}, tlctl.ExitUsage, "routes put -f FILE"},
		{"bad output", env, []string{"-o", "yaml", "workers"}, tlctl.ExitUsage, "want table or json"},
		{"bad url", map[string]string{"TLGATE_URL": "ftp://x"}, []string{"workers"}, tlctl.ExitUsage, "want http(s)"},
		{"put missing etag file", env, []string{"routes", "put", "-f", filepath.Join(dir, "none.json")}, tlctl.ExitFailed, "none.json"},
	} {
		code, _, errOut := c.tlctl(tc.env, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d with %q", tc.name, code, errOut, tc.code, tc.want)
		}
	}
}

// TestAdminCrossSiteWriteRefused: without API keys (loopback), a web page
// of another site can make a browser POST a drain without a preflight (a
// "simple" request: text/plain body, no custom header). Such a write, its
// Origin another site's, is refused 403 cross_origin and drains nothing;
// the console's drain (its Origin the gateway's own, no body) and tlctl's
// (no Origin) are taken.
func TestAdminCrossSiteWriteRefused(t *testing.T) {
	c := newClusterGateway(t, "", nil, nil, nil)
	c.addFake("w1", "m", func(w http.ResponseWriter, r *http.Request) {})
	for _, origin := range []string{"https://evil.example", "null", "http://" + c.gw.HTTPAddr() + ".evil.example"} {
		req, _ := http.NewRequest(http.MethodPost, c.url+"/admin/v1/models/m:drain", strings.NewReader("x"))
		req.Header.Set("Origin", origin)
		req.Header.Set("Content-Type", "text/plain")
		r := c.do(req)
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		if r.status != http.StatusForbidden || json.Unmarshal(r.body, &e) != nil || e.Error.Code != "cross_origin" {
			t.Fatalf("drain from Origin %s: %d %s, want 403 cross_origin", origin, r.status, r.body)
		}
	}
	if w, _ := c.drillWorker("w1"); !w.Routable {
		t.Fatal("a refused cross-site drain drained m")
	}

	// The console: fetch() from its own page sends the gateway's origin.
	req, _ := http.NewRequest(http.MethodPost, c.url+"/admin/v1/models/m:drain", nil)
	req.Header.Set("Origin", c.url)
	if r := c.do(req); r.status != http.StatusAccepted {
		t.Fatalf("the console's drain: %d %s", r.status, r.body)
	}
	if code, out, errOut := c.tlctl(map[string]string{"TLGATE_URL": c.url}, "resume", "m"); code != 0 {
		t.Fatalf("tlctl resume: %d %s%s", code, out, errOut)
	}
	if code, out, errOut := c.tlctl(map[string]string{"TLGATE_URL": c.url}, "drain", "m"); code != 0 {
		t.Fatalf("tlctl drain: %d %s%s", code, out, errOut)
	}
	// Reads stay open to any origin: a browser does not show another
	// site's page their answers (no CORS headers).
	req, _ = http.NewRequest(http.MethodGet, c.url+"/admin/v1/workers", nil)
	req.Header.Set("Origin", "https://evil.example")
	if r := c.do(req); r.status != http.StatusOK {
		t.Fatalf("GET workers with another Origin: %d %s", r.status, r.body)
	}
}
