package fleetsync

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync/embednats"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/testkit/promsum"
)

// fakeRouter is an actor that keeps what the client sends the router,
// answering a snapshot request with an empty snapshot. While hold is not
// nil, it waits for it to close before taking its inbox.
type fakeRouter struct {
	mu      sync.Mutex
	inboxes int                // SyncInbox messages
	batches []router.PeerBatch // taken from the inbox
	applied []*router.ApplySnapshot
	stored  int // ApplyStored messages
	hold    chan struct{}
}

func (f *fakeRouter) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *router.SyncSnapshot:
		ctx.Respond(&router.Snapshot{})
	case *router.SyncInbox:
		f.mu.Lock()
		hold := f.hold
		f.inboxes++
		f.mu.Unlock()
		if hold != nil {
			<-hold
		}
		bs := m.Take()
		f.mu.Lock()
		f.batches = append(f.batches, bs...)
		f.mu.Unlock()
	case *router.ApplySnapshot:
		f.mu.Lock()
		f.applied = append(f.applied, m)
		f.mu.Unlock()
	case *router.ApplyStored:
		f.mu.Lock()
		f.stored++
		f.mu.Unlock()
	}
}

func (f *fakeRouter) storedApplied() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stored
}

// testClient is a started client of a NATS server, its router a
// fakeRouter, its metrics on a registry of its own.
type testClient struct {
	*Client
	sys    *actor.ActorSystem
	router *fakeRouter
	reg    *prometheus.Registry
}

func startNATS(t *testing.T) *embednats.Server {
	t.Helper()
	ns, err := embednats.Start(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Close)
	return ns
}

func syncConfig(t *testing.T, ns *embednats.Server, tweak func(*config.Sync)) config.Sync {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf("[gateway.sync]\nkind = \"nats\"\nurl = %q\ntoken = %q\n", ns.URL(), ns.Token())))
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Gateway.Sync
	if tweak != nil {
		tweak(&s)
	}
	return s
}

func startClient(t *testing.T, id string, cfg config.Sync) *testClient {
	t.Helper()
	return startClientWith(t, id, cfg, nil)
}

// startClientWith is startClient with the stored responses a replica
// relayed itself (nil: none kept).
func startClientWith(t *testing.T, id string, cfg config.Sync, stored OwnRecords) *testClient {
	t.Helper()
	sys := actor.NewActorSystem()
	fr := &fakeRouter{}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return fr }))
	reg := prometheus.NewRegistry()
	m, err := metrics.NewSyncMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	c := New(cfg, Options{Root: sys.Root, Logger: zerolog.Nop(), Metrics: m, ChunkBytes: 128, Stored: stored})
	if err := c.Start(id, pid); err != nil {
		t.Fatal(err)
	}
	tc := &testClient{Client: c, sys: sys, router: fr, reg: reg}
	t.Cleanup(func() {
		c.Close()
		_ = sys.Root.StopFuture(pid).Wait()
		sys.Shutdown()
	})
	return tc
}

// metric sums the samples of family name whose labels include every
// pair of labels ("k", "v", ...).
func (tc *testClient) metric(name string, labels ...string) float64 {
	total, _ := promsum.Sum(tc.reg, name, labels...)
	return total
}

func (tc *testClient) dropped(reason string) float64 {
	return tc.metric("tlgate_sync_messages_dropped_total", "kind", metrics.SyncBatch, "reason", reason)
}

func connect(t *testing.T, ns *embednats.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.URL(), nats.Token(ns.Token()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestSyncSlowConsumerCountsDrops: a replica whose subscription cannot
// keep up counts every message NATS's client dropped for it, not one per
// slow-consumer episode.
func TestSyncSlowConsumerCountsDrops(t *testing.T) {
	ns := startNATS(t)
	tc := startClient(t, "me", syncConfig(t, ns, nil))
	pub := connect(t, ns)
	data := EncodeBatch(nil, &router.PeerBatch{Replica: "peer", Sent: time.Now(), Events: []router.PeerEvent{{Kind: router.PeerRelease, Worker: "w"}}})
	subject := tc.subject(subjectEvents + ".peer")
	tc.mu.Lock() // the subscription's handler waits for it
	nc := tc.nc
	const sent = pendingMessages + 1000
	for range sent {
		if err := pub.Publish(subject, data); err != nil {
			tc.mu.Unlock()
			t.Fatal(err)
		}
	}
	if err := pub.Flush(); err != nil {
		tc.mu.Unlock()
		t.Fatal(err)
	}
	err := nc.Flush() // the client has read every message before this answer
	tc.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, s := range tc.subs {
		n, err := s.Dropped()
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if total < 2 {
		t.Fatalf("NATS dropped %d of %d messages: the test did not overflow the subscription", total, sent)
	}
	// The error handler counts them, or the next load tick.
	deadline := time.Now().Add(10 * time.Second)
	for tc.dropped(metrics.SyncDropSlowConsumer) != float64(total) {
		if time.Now().After(deadline) {
			t.Fatalf("slow_consumer drops counted %v, NATS dropped %d", tc.dropped(metrics.SyncDropSlowConsumer), total)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSyncCloseEndsWarmStart: Close does not return while a warm start is
// waiting for a snapshot, and leaves no goroutine of it behind.
func TestSyncCloseEndsWarmStart(t *testing.T) {
	ns := startNATS(t)
	asked := make(chan struct{}, 1)
	silent := connect(t, ns) // a peer that never answers
	if _, err := silent.Subscribe("tlgate.sync."+subjectSnapshot, func(*nats.Msg) {
		select {
		case asked <- struct{}{}:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := silent.Flush(); err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	sys := actor.NewActorSystem()
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &fakeRouter{} }))
	c := New(syncConfig(t, ns, func(s *config.Sync) { s.SnapshotTimeout = config.D(time.Hour) }), Options{Root: sys.Root, Logger: zerolog.Nop()})
	if err := c.Start("me", pid); err != nil {
		t.Fatal(err)
	}
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("no snapshot request reached the silent peer")
	}
	c.Close()
	if c.warming.Load() {
		t.Fatal("a warm start still runs after Close")
	}
	_ = sys.Root.StopFuture(pid).Wait()
	sys.Shutdown()
	goleak.VerifyNone(t, leakcheck.Options(before)...)
}

// TestSyncPeerBatchesCoalesced: the batches peers send while the router is
// busy reach it in one message, one batch per peer with all its events.
func TestSyncPeerBatchesCoalesced(t *testing.T) {
	ns := startNATS(t)
	tc := startClient(t, "me", syncConfig(t, ns, nil))
	hold := make(chan struct{})
	tc.router.mu.Lock()
	tc.router.hold = hold
	tc.router.mu.Unlock()
	pub := connect(t, ns)
	const each = 10
	for i := range each {
		for _, peer := range []string{"p1", "p2"} {
			b := &router.PeerBatch{Replica: peer, Sent: time.Now(), Events: []router.PeerEvent{{Kind: router.PeerRelease, Worker: fmt.Sprint(i)}}}
			if err := pub.Publish(tc.subject(subjectEvents+"."+peer), EncodeBatch(nil, b)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for tc.metric("tlgate_sync_messages_received_total", "kind", metrics.SyncBatch) < 2*each {
		if time.Now().After(deadline) {
			t.Fatalf("%v of %d batches received (%v dropped)", tc.metric("tlgate_sync_messages_received_total", "kind", metrics.SyncBatch), 2*each,
				tc.metric("tlgate_sync_messages_dropped_total", "kind", metrics.SyncBatch))
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(hold)
	for {
		tc.router.mu.Lock()
		inboxes, batches := tc.router.inboxes, append([]router.PeerBatch(nil), tc.router.batches...)
		tc.router.mu.Unlock()
		if len(batches) == 2 {
			if inboxes != 1 {
				t.Fatalf("the router was told %d times of waiting batches, want once", inboxes)
			}
			for _, b := range batches {
				if len(b.Events) != each {
					t.Fatalf("peer %s's batch holds %d events, want its %d batches' %d", b.Replica, len(b.Events), each, each)
				}
				for i, ev := range b.Events {
					if ev.Worker != fmt.Sprint(i) {
						t.Fatalf("peer %s's events out of order: %d is %s", b.Replica, i, ev.Worker)
					}
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router took %d batches, want 2 (one per peer)", len(batches))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSyncBatchOnAnotherReplicasSubject: a batch that names another
// replica than the one whose subject it came on is dropped (spoofed).
func TestSyncBatchOnAnotherReplicasSubject(t *testing.T) {
	ns := startNATS(t)
	tc := startClient(t, "me", syncConfig(t, ns, nil))
	pub := connect(t, ns)
	b := &router.PeerBatch{Replica: "honest", Sent: time.Now(), Events: []router.PeerEvent{{Kind: router.PeerRelease, Worker: "w"}}}
	if err := pub.Publish(tc.subject(subjectEvents+".mallory"), EncodeBatch(nil, b)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for tc.dropped(metrics.SyncDropSpoofed) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the spoofed batch was not dropped as spoofed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	tc.router.mu.Lock()
	defer tc.router.mu.Unlock()
	if len(tc.router.batches) != 0 {
		t.Fatalf("the router was given %d batches", len(tc.router.batches))
	}
}

// noRecords keeps no stored response of its own.
type noRecords struct{}

func (noRecords) ExportOwn(int, time.Time, func(digest, owner, worker string, ttl time.Duration)) {}

// recordsFrom returns a function that publishes n times, on pub, a list
// of stored responses as replica's answer to tc.
func (tc *testClient) recordsFrom(pub *nats.Conn, replica string) func(t *testing.T, n int) {
	records := EncodeRecords(nil, replica, []router.StoredRecord{{ID: "d1", Owner: "o", Worker: "w", For: time.Minute}})
	subject := tc.subject(subjectSnapshots + "." + replica + "." + tc.ID())
	return func(t *testing.T, n int) {
		t.Helper()
		for range n {
			if err := pub.Publish(subject, records); err != nil {
				t.Fatal(err)
			}
		}
		if err := pub.Flush(); err != nil {
			t.Fatal(err)
		}
	}
}

// unaskedRecords counts the answers of stored responses dropped as not
// asked for.
func (tc *testClient) unaskedRecords() float64 {
	return tc.metric("tlgate_sync_messages_dropped_total", "kind", metrics.SyncStored, "reason", metrics.SyncDropUnasked)
}

// TestSyncRecordsOnlyWhenAsked: a peer's stored responses are taken once,
// as the answer to this replica's request; records it publishes unasked
// (on its own subject, so NATS's permissions let it) are dropped before
// they reach the router.
func TestSyncRecordsOnlyWhenAsked(t *testing.T) {
	ns := startNATS(t)
	tc := startClientWith(t, "me", syncConfig(t, ns, nil), noRecords{})
	pub := connect(t, ns)
	answer := tc.recordsFrom(pub, "peer")
	answer(t, 50)
	unasked := tc.unaskedRecords
	deadline := time.Now().Add(10 * time.Second)
	for unasked() < 50 {
		if time.Now().After(deadline) {
			t.Fatalf("%v of 50 unasked answers dropped", unasked())
		}
		time.Sleep(time.Millisecond)
	}
	if n := tc.router.storedApplied(); n != 0 {
		t.Fatalf("%d unasked answers reached the router", n)
	}
	tc.askRecords("peer")
	answer(t, 2)
	for tc.router.storedApplied() < 1 || unasked() < 51 {
		if time.Now().After(deadline) {
			t.Fatalf("asked once: %d answers applied, %v dropped; want 1 and 51", tc.router.storedApplied(), unasked())
		}
		time.Sleep(time.Millisecond)
	}
	if n := tc.router.storedApplied(); n != 1 {
		t.Fatalf("asked once: %d answers applied", n)
	}
}

// TestSyncStoredSentAgainAfterLoss: a stored (or deleted) response the
// peers could not be told of (the connection down, the queue full) is
// queued again once the connection is back, its TTL less the time it
// waited; one whose TTL ran out meanwhile is not, nor are events that
// later messages repeat (load, picks). At most maxUnsent are kept, the
// newest.
func TestSyncStoredSentAgainAfterLoss(t *testing.T) {
	ns := startNATS(t)
	m, err := metrics.NewSyncMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c := New(syncConfig(t, ns, nil), Options{Logger: zerolog.Nop(), Metrics: m, ChunkBytes: 128}) // never connected
	now := time.Now()
	c.publish(nil, []router.PeerEvent{
		{Kind: router.PeerStored, ID: "d1", Owner: "o", Worker: "w1", For: time.Minute},
		{Kind: router.PeerPick, Model: "m", Worker: "w1"},
		{Kind: router.PeerForget, ID: "d0"},
		{Kind: router.PeerStored, ID: "d2", Owner: "o", Worker: "w1", For: time.Second},
	})
	c.resend(now.Add(10 * time.Second))
	var got []string
	for len(c.queue) > 0 {
		ev := <-c.queue
		got = append(got, fmt.Sprintf("%s %s %v", ev.Kind, ev.ID, ev.For.Round(time.Second)))
	}
	if want := []string{"stored d1 50s", "forget d0 0s"}; !slices.Equal(got, want) {
		t.Fatalf("queued again %q, want %q", got, want)
	}
	for i := range maxUnsent + 5 {
		c.keepUnsent(&router.PeerEvent{Kind: router.PeerForget, ID: fmt.Sprint(i)}, now)
	}
	c.mu.Lock()
	n, first := len(c.unsent), c.unsent[0].ev.ID
	c.mu.Unlock()
	if n != maxUnsent || first != "5" {
		t.Fatalf("kept %d, the oldest %s; want %d, the oldest 5", n, first, maxUnsent)
	}
}

// TestSyncRecordsAskedAgainAfterReconnect: after its connection comes
// back, a replica asks each replica it hears from again (once) for its
// stored responses, whose announcements it may have missed meanwhile;
// before a reconnection only a joining replica is asked.
func TestSyncRecordsAskedAgainAfterReconnect(t *testing.T) {
	ns := startNATS(t)
	tc := startClientWith(t, "me", syncConfig(t, ns, nil), noRecords{})
	send := tc.recordsFrom(connect(t, ns), "peer")
	answer := func(want int) {
		t.Helper()
		send(t, 1)
		deadline := time.Now().Add(10 * time.Second)
		for tc.router.storedApplied()+int(tc.unaskedRecords()) < want {
			if time.Now().After(deadline) {
				t.Fatalf("%d answers applied, %v dropped; want %d handled", tc.router.storedApplied(), tc.unaskedRecords(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	tc.Applied(router.PeerApplied{Replica: "peer"}) // heard from, not joining
	answer(1)
	if n := tc.router.storedApplied(); n != 0 {
		t.Fatalf("asked before any reconnection: %d answers applied", n)
	}
	tc.connected("reconnected")
	tc.Applied(router.PeerApplied{Replica: "peer"})
	tc.Applied(router.PeerApplied{Replica: "peer"}) // once only
	answer(2)
	answer(3)
	if n := tc.router.storedApplied(); n != 1 {
		t.Fatalf("after the reconnection: %d answers applied, want 1", n)
	}
}
