package fleetsync

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// repeat publishes replica's batch of evs on its own events subject over
// nc every period until the test ends, as the attack did.
func repeat(t testing.TB, nc *nats.Conn, replica string, period time.Duration, evs ...router.PeerEvent) {
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	publishAs(t, nc, replica, replica, evs...)
	go func() {
		defer close(done)
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				_ = nc.Publish(config.DefaultSyncSubjectPrefix+".events."+replica,
					fleetsync.EncodeBatch(nil, &router.PeerBatch{Replica: replica, Sent: time.Now(), ChunkBytes: 128, Events: evs}))
			}
		}
	}()
}

// concurrently sends n completions of maxTokens to replica i at once and
// returns their answers.
func (f *fleet) concurrently(i, n, maxTokens int) []cluster.Reply {
	out := make([]cluster.Reply, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			out[k] = f.complete(ctx, i, "a request of the fleet's own", maxTokens)
		}()
	}
	wg.Wait()
	return out
}

// TestSyncForgedLoadCappedByEngine: a replica's credentials in the wrong
// hands claim 256 requests on two workers of three, six times a second,
// while the engines report nothing running. The claims count only as far
// as the engines bear them out: requests still spread over the three
// workers (they all went to the third), and the excess shows in
// tlgate_sync_peer_claims_uncorroborated.
func TestSyncForgedLoadCappedByEngine(t *testing.T) {
	f := newUsersFleet(t, "least_outstanding", 1, engineConfigs(3, 20*time.Millisecond), nil, nil, "rogue")
	rogue, _ := f.connectAs("rogue")
	repeat(t, rogue, "rogue", 150*time.Millisecond,
		router.PeerEvent{Kind: router.PeerLoad, Loads: []router.WorkerLoad{{Worker: "w0", N: 256}, {Worker: "w1", N: 256}}})
	for _, id := range []string{"w0", "w1"} {
		f.WaitWorker(0, id, func(w router.WorkerView) bool { return w.PeerInFlight == 256 }, "claimed by the rogue")
	}
	f.WaitMetric(0, 10*time.Second, 512, "tlgate_sync_peer_claims_uncorroborated")

	got := map[string]int{}
	for _, r := range f.concurrently(0, 9, 20) {
		if r.Err != nil || r.Status != 200 {
			t.Fatalf("a request: %d %v %s", r.Status, r.Err, r.Body)
		}
		got[r.Route()]++
	}
	if got["w0"] < 2 || got["w1"] < 2 {
		t.Fatalf("9 requests went %v: the forged claims still steer them off w0 and w1", got)
	}
}

// TestSyncPeerLoadNeverFillsAdmission: with admission control on (2 per
// worker), forged claims of 256 on every worker, and a stream of forged
// picks, fill no slot the engines do not show busy: 6 requests at once
// are all served, none answered overloaded.
func TestSyncPeerLoadNeverFillsAdmission(t *testing.T) {
	f := newUsersFleet(t, "least_outstanding", 1, engineConfigs(3, 20*time.Millisecond), func(g *config.Gateway) {
		g.Admission.Enabled = true
		g.Admission.WorkerConcurrency = 2
		g.Admission.QueueSize = 8
		g.Admission.QueueTimeout = config.D(2 * time.Second)
	}, nil, "rogue")
	rogue, _ := f.connectAs("rogue")
	claims := []router.PeerEvent{{Kind: router.PeerLoad, Loads: []router.WorkerLoad{{Worker: "w0", N: 256}, {Worker: "w1", N: 256}, {Worker: "w2", N: 256}}}}
	for _, id := range []string{"w0", "w1", "w2"} { // and picks, which count in routing until the next report
		for range 4 {
			claims = append(claims, router.PeerEvent{Kind: router.PeerPick, Model: model, Worker: id})
		}
	}
	repeat(t, rogue, "rogue", 150*time.Millisecond, claims...)
	for _, id := range []string{"w0", "w1", "w2"} {
		f.WaitWorker(0, id, func(w router.WorkerView) bool { return w.PeerInFlight >= 256 }, "claimed by the rogue")
	}
	for _, r := range f.concurrently(0, 6, 20) {
		if r.Err != nil || r.Status != 200 {
			t.Fatalf("a request under forged claims: %d %v %s", r.Status, r.Err, r.Body)
		}
	}
	if n := f.Metric(0, "tlgate_requests_total", "outcome", "overloaded"); n > 0 {
		t.Fatalf("%v requests answered overloaded", n)
	}
}
