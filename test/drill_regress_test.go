// Defects the drills and hostile-input tests found (fixed in ea9c5b3),
// kept as regression tests.

package test

import (
	"net/http"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
)

// TestDrillInferenceMethodNotAllowedIsOpenAIShaped: a wrong method on the
// OpenAI endpoints gets an OpenAI-shaped 405 (code method_not_allowed,
// like the admin API's), not net/http's plain-text "Method Not Allowed".
func TestDrillInferenceMethodNotAllowedIsOpenAIShaped(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys()}, enginesim.Config{ID: "w1", Model: "m"})
	for _, m := range []struct{ method, path string }{
		{http.MethodGet, "/v1/chat/completions"},
		{http.MethodPut, "/v1/completions"},
		{http.MethodPost, "/v1/models"},
	} {
		req, err := http.NewRequest(m.method, c.url+m.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer key-plain")
		r := c.do(req)
		if r.status != http.StatusMethodNotAllowed {
			t.Fatalf("%s %s: %d", m.method, m.path, r.status)
		}
		if code, _, _ := hostileError(t, r.body); code != "method_not_allowed" {
			t.Fatalf("%s %s: code %q", m.method, m.path, code)
		}
	}
}

// TestDrillResumeUndrainsReferenceEngine: after POST :drain the reference
// engine's next HeartbeatAck says drain and the engine drains itself
// (reporting draining: true); after POST :resume the acks say drain: false
// and the engine stops draining, so the gateway routes to it again.
func TestDrillResumeUndrainsReferenceEngine(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys()}, enginesim.Config{ID: "w1", Model: "m"})
	e := c.engines["w1"]
	c.drillAdmin(t, "m", "drain")
	eventually(t, 5*time.Second, func() bool {
		w, ok := c.drillWorker("w1")
		return e.Draining() && ok && w.Draining
	}, "the engine obeys the drain ack and reports draining")
	c.drillAdmin(t, "m", "resume")
	c.waitRoutable("w1")
}
