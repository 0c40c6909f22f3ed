package fleetsync

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// TestDrillKillNATSUnderLoad: three cache_aware replicas under load from
// clients spread over them, syncing through one NATS; NATS is killed mid
// run and brought back. The drill passes when no request failed at any
// point, every replica reports tlgate_sync_up 0 while NATS is away and 1
// after, and once it is back the replicas agree again: a new conversation
// started on one replica continues on the same worker through the other
// two. It logs how long after NATS's return the replicas agreed, and the
// sync messages and bytes per request.
func TestDrillKillNATSUnderLoad(t *testing.T) {
	ns := cluster.StartNATS(t)
	f := newFleet(t, ns, "cache_aware", 3, engineConfigs(3, time.Millisecond))
	stop := f.load(6, func(n int) string { return conversation(100+n%12, 1+n%4) })
	defer stop()
	for i := range f.Replicas {
		f.WaitMetric(i, 10*time.Second, 10, "tlgate_sync_messages_received_total", "kind", "batch")
	}

	ns.Stop()
	killed := time.Now()
	for i := range f.Replicas {
		cluster.Eventually(t, 10*time.Second, func() bool { return f.Metric(i, "tlgate_sync_up") == 0 }, "replica %d: tlgate_sync_up 0", i)
	}
	for i := range f.Replicas {
		served := f.Metric(i, "tlgate_requests_total", "outcome", "ok")
		f.WaitMetric(i, 10*time.Second, served+20, "tlgate_requests_total", "outcome", "ok")
	}
	// The peers' claims have expired (peer_timeout): each replica routes
	// on its own view.
	cluster.Eventually(t, 10*time.Second, func() bool {
		for i := range f.Replicas {
			for _, w := range f.Workers(i) {
				if w.PeerInFlight != 0 {
					return false
				}
			}
		}
		return true
	}, "the peers' in-flight claims to expire")
	down := time.Since(killed)

	if err := ns.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	for i := range f.Replicas {
		cluster.Eventually(t, 10*time.Second, func() bool { return f.Metric(i, "tlgate_sync_up") == 1 }, "replica %d: tlgate_sync_up 1", i)
	}
	// Agreement: a conversation begun on replica 0 now is known to the
	// other two, which route its next turns to the same worker. Its first
	// prompt is long and new (64 chunks): the other two know it once their
	// index of its worker grew by that much (the load's prompts, all known
	// by now, add nothing).
	opening := strings.Repeat("a new conversation begun after NATS came back; ", 180)[:64*128]
	chunks := func(i int) (n int) {
		for _, w := range f.Workers(i) {
			n += w.PrefixIndexChunks
		}
		return n
	}
	held := []int{0, chunks(1), chunks(2)}
	r := f.complete(context.Background(), 0, opening, 2)
	if r.Err != nil || r.Status != 200 {
		t.Fatalf("the new conversation's first turn: %d %v %s", r.Status, r.Err, r.Body)
	}
	first := r.Route()
	for i := 1; i < 3; i++ {
		cluster.Eventually(t, 10*time.Second, func() bool { return chunks(i) >= held[i]+64 }, "replica %d: the new conversation's prompt indexed", i)
	}
	agreed := time.Since(back)
	for i := 1; i < 3; i++ {
		next := opening + fmt.Sprintf(" user: turn %d? assistant: an answer.", 1+i)
		if r := f.complete(context.Background(), i, next, 2); r.Err != nil || r.Status != 200 {
			t.Fatalf("turn %d on replica %d: %d %v %s", 1+i, i, r.Status, r.Err, r.Body)
		} else if got := r.Route(); got != first {
			t.Errorf("after NATS's return, turn %d on replica %d went to %s, turn 1 on replica 0 to %s", 1+i, i, got, first)
		}
	}
	failures := stop()
	if len(failures) > 0 {
		t.Fatalf("%d requests failed, first: %s", len(failures), failures[0])
	}
	var requests, msgs, bytes float64
	for i := range f.Replicas {
		requests += f.Metric(i, "tlgate_requests_total")
		msgs += f.Metric(i, "tlgate_sync_messages_sent_total", "kind", "batch")
		bytes += f.Metric(i, "tlgate_sync_sent_bytes_total")
	}
	t.Logf("NATS away %v; replicas agreed %v after its return; %.0f requests, %.2f batches and %.0f bytes published per request",
		down.Round(time.Millisecond), agreed.Round(time.Millisecond), requests, msgs/requests, bytes/requests)
}
