package test

import (
	"net/http"
	"testing"

	"github.com/tlgate/tlgate/internal/adapter/config"
)

// TestConsoleCanBeSwitchedOff: the web console is served under /ui/ by
// default; with console = false its paths answer 404 and the admin API it
// reads is still there.
func TestConsoleCanBeSwitchedOff(t *testing.T) {
	on := newCluster(t, "", []clusterOpt{keys()})
	if r := on.get("/ui/", ""); r.status != http.StatusOK {
		t.Fatalf("console on: GET /ui/ = %d", r.status)
	}
	off := newCluster(t, "", []clusterOpt{keys(), func(c *config.Config) { c.Gateway.Console = false }})
	for _, p := range []string{"/ui/", "/ui", "/ui/app.js"} {
		if r := off.get(p, ""); r.status != http.StatusNotFound {
			t.Errorf("console off: GET %s = %d, want 404", p, r.status)
		}
	}
	if r := off.get("/admin/v1/workers", "key-admin"); r.status != http.StatusOK {
		t.Fatalf("console off: the admin API answered %d", r.status)
	}
}
