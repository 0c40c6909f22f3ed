package test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// TestRequestIDNotClientChosen: the gateway names every request with its
// own id. A client's X-Request-Id does not pick the backend of a weighted
// split (the same id lands on both halves of a 50/50 canary), two tenants
// sending one id get two gateway ids, the client's id is logged apart
// (client_request_id) and echoed as X-Client-Request-Id, and one outside
// the allowed charset or length is neither logged nor echoed.
func TestRequestIDNotClientChosen(t *testing.T) {
	var logs lockedBuffer
	c := newClusterGateway(t, `
[[gateway.routes]]
model = "split"
backends = [{ model = "a", weight = 0.5 }, { model = "b", weight = 0.5 }]
`, []clusterOpt{keys()}, nil, func(o *gateway.Options) { o.Logger = zerolog.New(&logs) },
		enginesim.Config{ID: "wa", Model: "a"}, enginesim.Config{ID: "wb", Model: "b"})
	body := map[string]any{"model": "split", "prompt": "hi", "max_tokens": 2}

	served := map[string]int{}
	ids := map[string]bool{}
	const n = 40
	for i := range n {
		key := "key-debug"
		if i%2 == 1 {
			key = "key-plain"
		}
		r := c.post("/v1/completions", key, body, "X-Request-Id", "pick-me")
		if r.status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
		gid := r.header.Get("X-Request-Id")
		if gid == "pick-me" || !strings.HasPrefix(gid, "req-") || ids[gid] {
			t.Fatalf("request %d: gateway id %q (seen before: %v)", i, gid, ids[gid])
		}
		ids[gid] = true
		if got := r.header.Get("X-Client-Request-Id"); got != "pick-me" {
			t.Fatalf("request %d: X-Client-Request-Id %q", i, got)
		}
	}
	routed, _, _ := c.hooks.snapshot()
	for _, w := range routed {
		served[w]++
	}
	if served["wa"] == 0 || served["wb"] == 0 {
		t.Fatalf("one client id chose the backend: %v", served)
	}

	// The access log: the gateway's id as request_id, the client's beside.
	eventually(t, 10*time.Second, func() bool { return strings.Count(logs.String(), `"client_request_id":"pick-me"`) == n }, "%d access-log lines", n)
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	keysSeen := map[string]bool{}
	for sc.Scan() {
		var v map[string]any
		if json.Unmarshal(sc.Bytes(), &v) != nil || v["message"] != "request" || v["client_request_id"] != "pick-me" {
			continue
		}
		id, _ := v["request_id"].(string)
		if !ids[id] {
			t.Fatalf("access log request_id %q is not a gateway id of these requests", id)
		}
		keysSeen[v["key"].(string)] = true
	}
	if !keysSeen["dbg"] || !keysSeen["plain"] {
		t.Fatalf("lines of both tenants: %v", keysSeen)
	}

	// An id outside the charset or the length is dropped.
	for _, bad := range []string{`evil id"}`, "<script>", strings.Repeat("x", 129)} {
		r := c.post("/v1/completions", "key-plain", body, "X-Request-Id", bad)
		if r.status != http.StatusOK || r.header.Get("X-Client-Request-Id") != "" || !strings.HasPrefix(r.header.Get("X-Request-Id"), "req-") {
			t.Fatalf("id %.20q: %d, X-Client-Request-Id %q, X-Request-Id %q", bad, r.status, r.header.Get("X-Client-Request-Id"), r.header.Get("X-Request-Id"))
		}
	}
	eventually(t, 10*time.Second, func() bool { return strings.Count(logs.String(), `"message":"request"`) >= n+3 }, "the last lines")
	for _, bad := range []string{"evil id", "script", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"} {
		if strings.Contains(logs.String(), bad) {
			t.Fatalf("a refused client id reached the log: %q", bad)
		}
	}
}
