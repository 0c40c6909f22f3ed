package fleetsync

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// connectAs connects to the fleet's NATS as user (a server of
// cluster.StartNATSUsers); errs gets its asynchronous errors (a
// publish its permissions refuse).
func (f *fleet) connectAs(user string) (nc *nats.Conn, errs <-chan error) {
	f.T.Helper()
	ch := make(chan error, 16)
	nc, err := nats.Connect(f.nats.URL(), nats.UserInfo(user, cluster.NATSPassword(user)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case ch <- err:
			default:
			}
		}))
	if err != nil {
		f.T.Fatal(err)
	}
	f.T.Cleanup(nc.Close)
	return nc, ch
}

// publishAs publishes replica's batch of events on subject's replica's
// events subject over nc and waits until the server has it.
func publishAs(t testing.TB, nc *nats.Conn, subjectReplica, replica string, evs ...router.PeerEvent) {
	t.Helper()
	data := fleetsync.EncodeBatch(nil, &router.PeerBatch{Replica: replica, Sent: time.Now(), ChunkBytes: 128, Events: evs})
	if err := nc.Publish(config.DefaultSyncSubjectPrefix+".events."+subjectReplica, data); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestSyncSpoofedReplicaRejected: with one NATS user per replica, an
// intruder holding its own credentials can speak for no other replica: a
// batch naming gw-1 on its own subject is dropped (spoofed), and NATS
// refuses its publishing on gw-1's subject. gw-1 itself is heard.
func TestSyncSpoofedReplicaRejected(t *testing.T) {
	f := newUsersFleet(t, "least_outstanding", 1, engineConfigs(2, 0), nil, nil, "mallory")
	mallory, errs := f.connectAs("mallory")
	claim := router.PeerEvent{Kind: router.PeerLoad, Loads: []router.WorkerLoad{{Worker: "w0", N: 200}, {Worker: "w1", N: 200}}}

	publishAs(t, mallory, "mallory", "gw-1", claim)
	f.WaitMetric(0, 5*time.Second, 1, "tlgate_sync_messages_dropped_total", "kind", "batch", "reason", "spoofed")

	publishAs(t, mallory, "gw-1", "gw-1", claim)
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("publishing on gw-1's subject as mallory: %v, want a permissions violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("NATS did not refuse mallory's publishing on gw-1's subject")
	}
	for _, w := range f.Workers(0) {
		if w.PeerInFlight != 0 {
			t.Fatalf("worker %s: peer_in_flight %d from claims made in gw-1's name", w.ID, w.PeerInFlight)
		}
	}
	if peers := f.Metric(0, "tlgate_sync_peers"); peers > 0 {
		t.Fatalf("%v peers tracked after the spoofing", peers)
	}

	// The real gw-1 is heard.
	f.startReplica(nil)
	f.WaitMetric(0, 10*time.Second, 1, "tlgate_sync_messages_received_total", "kind", "load")
	cluster.Eventually(t, 10*time.Second, func() bool { return f.Metric(0, "tlgate_sync_peers") == 1 }, "gw-0 to track gw-1")
}

// TestSnapshotAnsweredOnce: a replica that starts into a fleet of three
// asks for a snapshot once and exactly one replica answers it (a queue
// group), where every peer used to.
func TestSnapshotAnsweredOnce(t *testing.T) {
	ns := cluster.StartNATS(t)
	late := cluster.Reserve(t)
	f := newFleet(t, ns, "cache_aware", 3, engineConfigs(2, 0), late.Addr())
	f.startReplica(late)
	f.WaitMetric(3, 10*time.Second, 1, "tlgate_sync_snapshots_total", "outcome", "applied")
	served := func() (n float64) {
		for i := range 3 {
			n += f.Metric(i, "tlgate_sync_snapshots_total", "outcome", "served")
		}
		return n
	}
	// The three first replicas' own warm starts asked too: count the
	// answers the fourth's request got by the drop in the unasked ones.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	<-ctx.Done() // any other answer would have come by now
	if unasked := f.Metric(3, "tlgate_sync_messages_dropped_total", "kind", "snapshot", "reason", "unasked"); unasked > 0 {
		t.Fatalf("the new replica got %v snapshots it had not asked for (answers beyond the first)", unasked)
	}
	if got, want := served(), f.Metric(1, "tlgate_sync_snapshots_total", "outcome", "applied")+f.Metric(2, "tlgate_sync_snapshots_total", "outcome", "applied")+f.Metric(3, "tlgate_sync_snapshots_total", "outcome", "applied"); got != want {
		t.Fatalf("%v snapshots served for %v warm starts that found a peer: more than one answer each", got, want)
	}
}

// TestSyncKnownPeersKeptAtMaxPeers: intruders with credentials of their
// own fill max_peers first; the fleet's listed replica still gets a place
// (an intruder goes), a third intruder is refused, counted and alerted
// on, and the replicas tracked stay at max_peers.
func TestSyncKnownPeersKeptAtMaxPeers(t *testing.T) {
	late := cluster.Reserve(t) // gw-1's registry, heartbeated before gw-1 runs
	f := newUsersFleet(t, "least_outstanding", 1, engineConfigs(2, 20*time.Millisecond), func(g *config.Gateway) {
		g.Sync.MaxPeers = 2
		g.Sync.Peers = []string{replicaID(0), replicaID(1)}
	}, []string{late.Addr()}, "x1", "x2", "x3")
	empty := router.PeerEvent{Kind: router.PeerLoad}
	stop := make(chan struct{})
	defer close(stop)
	for _, x := range []string{"x1", "x2"} {
		nc, _ := f.connectAs(x)
		publishAs(t, nc, x, x, empty)
		go func() { // as the attack did: every 100 ms, never silent
			tk := time.NewTicker(100 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
					_ = nc.Publish(config.DefaultSyncSubjectPrefix+".events."+x,
						fleetsync.EncodeBatch(nil, &router.PeerBatch{Replica: x, Sent: time.Now(), Events: []router.PeerEvent{empty}}))
				}
			}
		}()
	}
	cluster.Eventually(t, 5*time.Second, func() bool { return f.Metric(0, "tlgate_sync_peers") == 2 }, "the intruders to fill max_peers")

	// gw-1, listed, starts: its request in flight shows on gw-0.
	f.startReplica(late)
	f.WaitRoutable(1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := make(chan cluster.Reply, 1)
	go func() { held <- f.complete(ctx, 1, "a long one", 1000) }() // 20 s of decode: held until the test ends
	var worker string
	cluster.Eventually(t, 10*time.Second, func() bool {
		for _, w := range f.Workers(0) {
			if w.PeerInFlight == 1 {
				worker = w.ID
				return true
			}
		}
		return false
	}, "gw-1's request in flight to show on gw-0")

	// A third intruder is refused, counted; gw-1 keeps its place.
	before := max(0, f.Metric(0, "tlgate_sync_messages_dropped_total", "kind", "load", "reason", "too_many_peers"))
	nc3, _ := f.connectAs("x3")
	publishAs(t, nc3, "x3", "x3", empty)
	f.WaitMetric(0, 5*time.Second, before+1, "tlgate_sync_messages_dropped_total", "kind", "load", "reason", "too_many_peers")
	if n := f.Metric(0, "tlgate_sync_peers"); n > 2 {
		t.Fatalf("%v replicas tracked, above max_peers 2", n)
	}
	time.Sleep(500 * time.Millisecond) // a few of gw-1's load reports and the intruders' messages
	if w := f.Worker(0, worker); w.PeerInFlight != 1 {
		t.Fatalf("gw-1's request on %s no longer counted on gw-0 (peer_in_flight %d): it lost its place", worker, w.PeerInFlight)
	}
	cancel()
	<-held
}
