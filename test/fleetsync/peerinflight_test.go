package fleetsync

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/cluster"
	"github.com/tlgate/tlgate/internal/tool/tlctl"
)

// TestPeerInFlightShown: three streams held on replica 0 show on replica
// 1 as its workers' peer_in_flight: in GET /admin/v1/workers and in
// tlctl workers (table and JSON), and fall back to 0 once they end.
func TestPeerInFlightShown(t *testing.T) {
	f := newFleet(t, cluster.StartNATS(t), "least_outstanding", 2, engineConfigs(2, 20*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for c := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// 1,000 tokens at 20 ms: held open until the test ends.
			body := fmt.Sprintf(`{"model":%q,"prompt":"held stream %d","max_tokens":1000,"stream":true}`, model, c)
			f.Do(ctx, "POST", f.Replicas[0].URL+"/v1/completions", body)
		}()
	}
	type worker struct {
		ID           string `json:"id"`
		InFlight     int    `json:"in_flight"`
		PeerInFlight *int   `json:"peer_in_flight"`
	}
	workers := func(i int) []worker {
		r := f.Do(context.Background(), "GET", f.Replicas[i].URL+"/admin/v1/workers", "")
		var body struct{ Workers []worker }
		if r.Err != nil || r.Status != 200 || json.Unmarshal(r.Body, &body) != nil {
			t.Fatalf("GET /admin/v1/workers of replica %d: %d %v %s", i, r.Status, r.Err, r.Body)
		}
		return body.Workers
	}
	sum := func(ws []worker, peer bool) int {
		n := 0
		for _, w := range ws {
			if w.PeerInFlight == nil {
				t.Fatalf("worker %s listed without peer_in_flight", w.ID)
			}
			if peer {
				n += *w.PeerInFlight
			} else {
				n += w.InFlight
			}
		}
		return n
	}
	cluster.Eventually(t, 10*time.Second, func() bool { return sum(workers(0), false) == 3 }, "three streams in flight on replica 0")
	cluster.Eventually(t, 10*time.Second, func() bool { return sum(workers(1), true) == 3 }, "replica 1's peer_in_flight adding up to 3")
	if n := sum(workers(1), false); n != 0 {
		t.Fatalf("replica 1 counts %d requests of its own, want 0", n)
	}

	run := func(args ...string) string {
		var out, errOut bytes.Buffer
		env := map[string]string{"TLGATE_URL": f.Replicas[1].URL, "TLGATE_KEY": opsKey}
		if code := tlctl.Run(context.Background(), args, func(k string) string { return env[k] }, &out, &errOut); code != 0 {
			t.Fatalf("tlctl %v: exit %d: %s", args, code, errOut.String())
		}
		return out.String()
	}
	table := run("workers")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	col := strings.Index(lines[0], "PEER IN FLIGHT")
	if col < 0 {
		t.Fatalf("tlctl workers has no PEER IN FLIGHT column:\n%s", table)
	}
	peers := 0
	for _, l := range lines[1:] {
		var n int
		if _, err := fmt.Sscan(l[col:], &n); err != nil {
			t.Fatalf("tlctl workers row %q: no peer count under the column: %v", l, err)
		}
		peers += n
	}
	if peers != 3 {
		t.Fatalf("tlctl workers shows %d peer requests, want 3:\n%s", peers, table)
	}
	if js := run("-o", "json", "workers"); !strings.Contains(js, `"peer_in_flight":`) {
		t.Fatalf("tlctl -o json workers lacks peer_in_flight: %s", js)
	}

	cancel()
	wg.Wait()
	cluster.Eventually(t, 10*time.Second, func() bool { return sum(workers(1), true) == 0 }, "no peer request left on replica 1")
}
