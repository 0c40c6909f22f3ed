package test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/adapter/config"
)

// TestPprofIsOptIn: the Go profiles are not served by default; with
// pprof = true they are, to a key with the admin scope only.
func TestPprofIsOptIn(t *testing.T) {
	off := newCluster(t, "", []clusterOpt{keys()})
	if r := off.get("/debug/pprof/heap?debug=1", "key-admin"); r.status != http.StatusNotFound {
		t.Fatalf("pprof off: GET /debug/pprof/heap = %d, want 404", r.status)
	}
	on := newCluster(t, "", []clusterOpt{keys(), func(c *config.Config) { c.Gateway.Pprof = true }})
	if r := on.get("/debug/pprof/heap?debug=1", "key-admin"); r.status != http.StatusOK || !strings.Contains(string(r.body), "heap profile:") {
		t.Fatalf("pprof on: GET /debug/pprof/heap = %d: %.200s", r.status, r.body)
	}
	if r := on.get("/debug/pprof/goroutine?debug=1", "key-debug"); r.status != http.StatusForbidden {
		t.Fatalf("pprof on, a key without the admin scope: %d, want 403", r.status)
	}
}
