package fleetsync

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/adapter/traffic"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// TestTrafficShowsFleet: GET /admin/v1/traffic (the console's Traffic
// page) on either replica sums the traffic of the whole fleet, each
// replica's requests counted once; with the other replica gone, the one
// left shows its own.
func TestTrafficShowsFleet(t *testing.T) {
	f := newFleet(t, cluster.StartNATS(t), "least_outstanding", 2, engineConfigs(1, 0))
	for i, n := range []int{3, 2} {
		for k := range n {
			if r := f.complete(context.Background(), i, fmt.Sprintf("replica %d request %d", i, k), 1); r.Err != nil || r.Status != 200 {
				t.Fatalf("request to replica %d: %d %v", i, r.Status, r.Err)
			}
		}
	}
	snap := func(i int) traffic.Snapshot {
		r := f.Do(context.Background(), "GET", f.Replicas[i].URL+"/admin/v1/traffic", "")
		var s traffic.Snapshot
		if r.Err != nil || r.Status != 200 || json.Unmarshal(r.Body, &s) != nil {
			t.Fatalf("GET /admin/v1/traffic of replica %d: %d %v %s", i, r.Status, r.Err, r.Body)
		}
		return s
	}
	requests := func(s traffic.Snapshot) uint64 {
		for _, m := range s.Models {
			if m.Model == model {
				return m.Totals.Requests
			}
		}
		return 0
	}
	for i := range 2 {
		var s traffic.Snapshot
		cluster.Eventually(t, 10*time.Second, func() bool { s = snap(i); return s.Replicas == 2 && requests(s) == 5 }, "replica %d's traffic of the fleet", i)
	}
	f.Replicas[0].Stop()
	cluster.Eventually(t, 10*time.Second, func() bool { s := snap(1); return s.Replicas == 1 && requests(s) == 2 }, "replica 1's own traffic once replica 0 is gone")
}
