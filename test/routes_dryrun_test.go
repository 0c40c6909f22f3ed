package test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/enginesim"
)

// putRoutes sends PUT path (the routes endpoint, with its query) with the
// admin key, body and If-Match (none when empty).
func (c *cluster) putRoutes(path, body, ifMatch string) reply {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPut, c.url+path, bytes.NewReader([]byte(body)))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer key-admin")
	req.Header.Set("Content-Type", "application/json")
	if ifMatch != "" {
		req.Header.Set("If-Match", ifMatch)
	}
	return c.do(req)
}

// TestRoutesDryRun: PUT /admin/v1/routes?dry_run=true checks a table as a
// PUT does and answers it with what it would change (routes added,
// removed, changed and which fields) and warnings for the models no worker
// serves, changing nothing, with or without If-Match (a stale one is
// refused); tlctl routes diff shows the same. A real PUT's answer carries
// the warnings too.
func TestRoutesDryRun(t *testing.T) {
	c := newCluster(t, `
[[gateway.routes]]
model = "smol"
backends = [{ model = "m", weight = 1 }]

[[gateway.routes]]
model = "auto"
cascade = [{ model = "smol", accept_if = "mean_logprob > -1.2" }, { model = "m" }]
`, []clusterOpt{keys()}, enginesim.Config{ID: "w1", Model: "m"})
	before := c.get("/admin/v1/routes", "key-admin")
	etag := before.header.Get("ETag")
	typo := `{"routes":[{"model":"smol","backends":[{"model":"mm","weight":1}]},{"model":"new","aliases":["fresh"]}]}`

	type body struct {
		DryRun  bool `json:"dry_run"`
		Epoch   uint64
		Routes  []json.RawMessage
		Changes []struct {
			Model  string   `json:"model"`
			Change string   `json:"change"`
			Fields []string `json:"fields"`
		}
		Warnings []struct{ Path, Message string }
	}
	for _, ifMatch := range []string{"", etag} {
		r := c.putRoutes("/admin/v1/routes?dry_run=true", typo, ifMatch)
		var b body
		if r.status != http.StatusOK || json.Unmarshal(r.body, &b) != nil || !b.DryRun || r.header.Get("ETag") != etag {
			t.Fatalf("dry run (If-Match %q): %d %s (ETag %q), want 200, a dry run, the ETag in force", ifMatch, r.status, r.body, r.header.Get("ETag"))
		}
		got := map[string]string{}
		for _, ch := range b.Changes {
			got[ch.Model] = ch.Change + ":" + strings.Join(ch.Fields, ",")
		}
		if len(got) != 3 || got["auto"] != "removed:" || got["new"] != "added:" || got["smol"] != "changed:backends" || len(b.Routes) != 2 {
			t.Fatalf("dry run changes %v (routes %d), want auto removed, new added, smol's backends changed: %s", got, len(b.Routes), r.body)
		}
		if len(b.Warnings) != 2 || b.Warnings[0].Path != "routes[0].backends[0].model" || !strings.Contains(b.Warnings[0].Message, `"mm"`) ||
			!strings.Contains(b.Warnings[0].Message, "never seen") || b.Warnings[1].Path != "routes[1].model" {
			t.Fatalf("dry run warnings %+v, want mm (never seen) and new's own model", b.Warnings)
		}
	}
	if after := c.get("/admin/v1/routes", "key-admin"); after.header.Get("ETag") != etag || !bytes.Equal(after.body, before.body) {
		t.Fatalf("a dry run changed the table: %s -> %s", before.body, after.body)
	}
	if r := c.post("/v1/completions", "key-plain", completion("auto", false)); r.status != http.StatusOK {
		t.Fatalf("a route a dry run would remove is gone: %d %s", r.status, r.body)
	}

	// The same refusals as a PUT's.
	if r := c.putRoutes("/admin/v1/routes?dry_run=true", typo, `"999"`); r.status != http.StatusPreconditionFailed {
		t.Fatalf("dry run with a stale If-Match: %d %s, want 412", r.status, r.body)
	}
	if r := c.putRoutes("/admin/v1/routes?dry_run=true", `{"routes":[{"model":"x","cascade":[{"model":"m"}]}]}`, ""); r.status != http.StatusBadRequest ||
		errorCode(t, r.body) != "invalid_routes" {
		t.Fatalf("dry run of an invalid table: %d %s, want 400 invalid_routes", r.status, r.body)
	}
	if r := c.putRoutes("/admin/v1/routes?dry_run=perhaps", typo, ""); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "dry_run") {
		t.Fatalf("dry_run=perhaps: %d %s, want 400 naming dry_run", r.status, r.body)
	}

	// tlctl routes diff: the same, in words.
	dir := t.TempDir()
	file := filepath.Join(dir, "routes.json")
	if err := os.WriteFile(file, []byte(typo), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"TLGATE_URL": c.url, "TLGATE_KEY": "key-admin"}
	code, out, errOut := c.tlctl(env, "routes", "diff", "-f", file)
	if code != 0 || !strings.Contains(out, "- auto (removed)") || !strings.Contains(out, "+ new (added)") || !strings.Contains(out, "~ smol (backends changed)") ||
		!strings.Contains(out, `warning: routes[0].backends[0].model: no worker serves "mm"`) || !strings.Contains(errOut, "nothing was changed") {
		t.Fatalf("tlctl routes diff: %d\n%s%s", code, out, errOut)
	}
	if after := c.get("/admin/v1/routes", "key-admin"); after.header.Get("ETag") != etag {
		t.Fatalf("tlctl routes diff changed the table")
	}

	// A real PUT answers its warnings.
	r := c.putRoutes("/admin/v1/routes", typo, etag)
	var b body
	if r.status != http.StatusOK || json.Unmarshal(r.body, &b) != nil || b.DryRun || len(b.Warnings) != 2 || b.Changes != nil {
		t.Fatalf("PUT of the typo: %d %s, want 200 with two warnings", r.status, r.body)
	}
}
