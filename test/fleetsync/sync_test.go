package fleetsync

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// conversation is the prompt of a conversation's turn: every turn extends
// the one before, so an engine that served the last turn holds most of it.
func conversation(id, turn int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "conversation %d. ", id)
	for range 40 {
		fmt.Fprintf(&b, "system words of conversation %d; ", id)
	}
	for t := 1; t <= turn; t++ {
		fmt.Fprintf(&b, "user: question %d of conversation %d? assistant: an answer to it. ", t, id)
	}
	return b.String()
}

// firstTurns sends turn 1 of n conversations to replica i at once (the
// engines are slow enough that they spread by load) and returns the
// worker each went to.
func (f *fleet) firstTurns(i, n int) []string {
	f.T.Helper()
	workers := make([]string, n)
	var wg sync.WaitGroup
	for c := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r := f.complete(ctx, i, conversation(c, 1), 8)
			if r.Err != nil || r.Status != 200 {
				f.T.Errorf("conversation %d turn 1: %d %v %s", c, r.Status, r.Err, r.Body)
			}
			workers[c] = r.Route()
		}()
	}
	wg.Wait()
	if f.T.Failed() {
		f.T.FailNow()
	}
	distinct := map[string]bool{}
	for _, w := range workers {
		distinct[w] = true
	}
	if len(distinct) < 2 {
		f.T.Fatalf("turn 1 of %d conversations all went to %v: the test cannot tell sync from chance", n, workers)
	}
	return workers
}

// turn sends turn t of conversation c to replica i and returns its worker.
func (f *fleet) turn(i, c, t int) string {
	f.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := f.complete(ctx, i, conversation(c, t), 2)
	if r.Err != nil || r.Status != 200 {
		f.T.Fatalf("conversation %d turn %d on replica %d: %d %v %s", c, t, i, r.Status, r.Err, r.Body)
	}
	return r.Route()
}

func TestSyncSharesPrefixIndex(t *testing.T) {
	f := newFleet(t, cluster.StartNATS(t), "cache_aware", 2, engineConfigs(3, 25*time.Millisecond))
	const convs = 6
	workers := f.firstTurns(0, convs)
	indexed := float64(convs)
	for turn := 2; turn <= 4; turn++ {
		i := (turn - 1) % 2 // turns alternate: B, A, B
		// B has applied every prompt A indexed (and the other way round).
		f.WaitMetric(i, 5*time.Second, indexed, "tlgate_sync_messages_received_total", "kind", "index")
		for c := range convs {
			if got := f.turn(i, c, turn); got != workers[c] {
				t.Errorf("conversation %d turn %d on replica %d went to %s, turn 1 to %s", c, turn, i, got, workers[c])
			}
		}
		if turn >= 3 {
			indexed += convs
		}
	}
}

func TestSyncSharesInFlight(t *testing.T) {
	f := newFleet(t, cluster.StartNATS(t), "least_outstanding", 2, engineConfigs(3, 20*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	held := make(chan string, 2)
	busy := func() []string { // the workers with one of A's requests
		var ids []string
		for _, w := range f.Workers(0) {
			if w.InFlight == 1 {
				ids = append(ids, w.ID)
			}
		}
		return ids
	}
	for c := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// 1,000 tokens at 20 ms: held open until the test ends.
			r := f.complete(ctx, 0, fmt.Sprintf("held request %d", c), 1000)
			held <- r.Route()
		}()
		// A's least_outstanding puts the second beside the first.
		cluster.Eventually(t, 10*time.Second, func() bool { return len(busy()) == c+1 }, "%d workers with one of A's requests each", c+1)
	}
	ids := busy()
	free := ""
	for _, id := range []string{"w0", "w1", "w2"} {
		if !slices.Contains(ids, id) {
			free = id
		}
	}
	for _, id := range ids {
		f.WaitWorker(1, id, func(w router.WorkerView) bool { return w.PeerInFlight == 1 }, "one peer request in flight on B")
	}
	for range 3 {
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		r := f.complete(rctx, 1, "a short one", 1)
		rcancel()
		if r.Err != nil || r.Status != 200 || r.Route() != free {
			t.Fatalf("B routed to %q (%d %v), want %s: %v each carry one of A's", r.Route(), r.Status, r.Err, free, ids)
		}
	}
	cancel()
	wg.Wait()
	// A's requests ended: B forgets them.
	for _, id := range ids {
		f.WaitWorker(1, id, func(w router.WorkerView) bool { return w.PeerInFlight == 0 }, "no peer request left on B")
	}
}

func TestSyncWarmStart(t *testing.T) {
	ns := cluster.StartNATS(t)
	late := cluster.Reserve(t) // replica B's registry, heartbeated before B runs
	f := newFleet(t, ns, "cache_aware", 1, engineConfigs(3, 25*time.Millisecond), late.Addr())
	const convs = 6
	workers := f.firstTurns(0, convs)
	f.startReplica(late)
	f.WaitMetric(1, 5*time.Second, 1, "tlgate_sync_snapshots_total", "outcome", "applied")
	f.WaitRoutable(1)
	cluster.Eventually(t, 5*time.Second, func() bool {
		n := 0
		for _, w := range f.Workers(1) {
			n += w.PrefixIndexChunks
		}
		return n > 0
	}, "replica B to hold A's index")
	for c := range convs {
		if got := f.turn(1, c, 2); got != workers[c] {
			t.Errorf("conversation %d turn 2 on the new replica went to %s, turn 1 to %s", c, got, workers[c])
		}
	}
	if f.Metric(0, "tlgate_sync_snapshots_total", "outcome", "served") < 1 {
		t.Error("replica A served no snapshot")
	}
}

func TestSyncNATSDownKeepsServing(t *testing.T) {
	ns := cluster.StartNATS(t)
	f := newFleet(t, ns, "cache_aware", 2, engineConfigs(2, 0))
	stop := f.load(4, func(n int) string { return conversation(n%10, 1+n%3) })
	defer stop()
	for i := range f.Replicas {
		f.WaitMetric(i, 5*time.Second, 5, "tlgate_sync_messages_received_total", "kind", "batch")
	}
	ns.Stop()
	for i := range f.Replicas {
		cluster.Eventually(t, 10*time.Second, func() bool { return f.Metric(i, "tlgate_sync_up") == 0 }, "replica %d: tlgate_sync_up 0", i)
	}
	// Requests keep being answered while NATS is away.
	for i := range f.Replicas {
		served := f.Metric(i, "tlgate_requests_total", "outcome", "ok")
		f.WaitMetric(i, 10*time.Second, served+20, "tlgate_requests_total", "outcome", "ok")
	}
	if err := ns.Restart(); err != nil {
		t.Fatal(err)
	}
	for i := range f.Replicas {
		cluster.Eventually(t, 10*time.Second, func() bool { return f.Metric(i, "tlgate_sync_up") == 1 }, "replica %d: tlgate_sync_up 1", i)
	}
	for i := range f.Replicas {
		got := f.Metric(i, "tlgate_sync_messages_received_total", "kind", "batch")
		f.WaitMetric(i, 10*time.Second, got+5, "tlgate_sync_messages_received_total", "kind", "batch")
	}
	if failures := stop(); len(failures) > 0 {
		t.Fatalf("%d requests failed, first: %s", len(failures), failures[0])
	}
}

// TestSyncSharesEjection: an ejection is shared with evidence. A ejects a
// dead engine on its own failure; B takes A's word as a suspicion, tries
// the engine once and ejects it on that failure; C, with the word of two
// peers (ejection_quorum 2), ejects it without trying it.
func TestSyncSharesEjection(t *testing.T) {
	// Ejections last a minute, so a slow machine cannot see one expire
	// before C is asked.
	f := newTweakedFleet(t, cluster.StartNATS(t), "least_outstanding", 3, engineConfigs(2, 0), func(g *config.Gateway) {
		g.Ejection.BaseTime = config.D(time.Minute)
	})
	if err := f.Engines[0].SetFaults(enginesim.Faults{Refuse: true}); err != nil {
		t.Fatal(err)
	}
	// w1 holds its answers for a while, so a replica's second request
	// finds it busy and tries w0, whichever worker its tie-break put
	// first: w0 refuses, the replica ejects it and fails over to w1.
	if err := f.Engines[1].SetFaults(enginesim.Faults{StallMS: 500}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, who := range []string{"A", "B"} {
		first := make(chan cluster.Reply, 1)
		go func() { first <- f.complete(ctx, i, "hello", 2) }()
		f.WaitWorker(i, "w1", func(w router.WorkerView) bool { return w.InFlight > 0 }, "busy")
		for _, r := range []cluster.Reply{f.complete(ctx, i, "hello", 2), <-first} {
			if r.Err != nil || r.Status != 200 || r.Route() != "w1" {
				t.Fatalf("%s: %d %v %q, want 200 from w1", who, r.Status, r.Err, r.Route())
			}
		}
		f.WaitWorker(i, "w0", func(w router.WorkerView) bool { return !w.EjectedUntil.IsZero() }, "ejected")
		if n := f.Metric(i, "tlgate_failovers_total"); n > 1 {
			t.Fatalf("%s failed over %v times, want at most one failure of its own", who, n)
		}
	}
	if err := f.Engines[1].SetFaults(enginesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	// B took A's word alone as no evidence.
	if n := f.Metric(1, "tlgate_sync_messages_dropped_total", "kind", "eject", "reason", "no_evidence"); n < 1 {
		t.Fatalf("B counted %v ejections without evidence, want A's", n)
	}
	f.WaitWorker(2, "w0", func(w router.WorkerView) bool { return !w.EjectedUntil.IsZero() }, "ejected on C by A's and B's word")
	for range 4 {
		if r := f.complete(ctx, 2, "hello", 2); r.Err != nil || r.Status != 200 || r.Route() != "w1" {
			t.Fatalf("C: %d %v %q, want 200 from w1", r.Status, r.Err, r.Route())
		}
	}
	if n := f.Metric(2, "tlgate_failovers_total"); n > 0 {
		t.Fatalf("C failed over %v times: it tried the engine two peers had ejected", n)
	}
}

func TestSyncRejectsMalformed(t *testing.T) {
	ns := cluster.StartNATS(t)
	// Messages above 4 KiB are refused by the replica (NATS takes 1 MiB).
	f := newTweakedFleet(t, ns, "cache_aware", 1, engineConfigs(2, 0), func(g *config.Gateway) {
		g.Sync.MaxMessageBytes, g.Sync.MaxBatchBytes = 4096, 4096
	})
	nc, err := nats.Connect(ns.URL(), nats.Token(ns.Token()))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const subject = "tlgate.sync.events.liar"
	batch := func(replica string, sent time.Time, evs ...router.PeerEvent) []byte {
		return fleetsync.EncodeBatch(nil, &router.PeerBatch{Replica: replica, Sent: sent, ChunkBytes: 128, Events: evs})
	}
	pick := func(model, worker string) router.PeerEvent {
		return router.PeerEvent{Kind: router.PeerPick, Model: model, Worker: worker, Hashes: []uint64{1, 2, 3}}
	}
	now := time.Now()
	msgs := []struct {
		name   string
		data   []byte
		metric []string // the drop it must count
	}{
		{"garbage", []byte("\x00garbage\xff"), []string{"kind", "batch", "reason", "malformed"}},
		{"truncated", batch("liar", now, pick(model, "w0"))[:20], []string{"kind", "batch", "reason", "malformed"}},
		{"oversized", batch("liar", now, router.PeerEvent{Kind: router.PeerPick, Model: model, Worker: "w0", Hashes: make([]uint64, 1000)}), []string{"kind", "batch", "reason", "oversized"}},
		{"stale", batch("liar", now.Add(-time.Hour), pick(model, "w0")), []string{"kind", "batch", "reason", "stale"}},
		{"its own id", batch(f.Replicas[0].GW.SyncID(), now, pick(model, "w0")), []string{"kind", "batch", "reason", "duplicate_id"}},
		{"a foreign model", batch("liar", now, pick("other-model", "w0")), []string{"kind", "pick", "reason", "other_model"}},
		{"an unknown worker", batch("liar", now, pick(model, "nobody")), []string{"kind", "pick", "reason", "unknown_worker"}},
		{"a stored response on an unknown worker", batch("liar", now, router.PeerEvent{Kind: router.PeerStored, ID: "resp_lie", Worker: "nobody", For: time.Hour}),
			[]string{"kind", "stored", "reason", "unknown_worker"}},
	}
	for _, m := range msgs {
		subject := subject
		if m.name == "its own id" {
			subject = "tlgate.sync.events." + f.Replicas[0].GW.SyncID()
		}
		if err := nc.Publish(subject, m.data); err != nil {
			t.Fatalf("%s: publish: %v", m.name, err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		f.WaitMetric(0, 5*time.Second, 1, "tlgate_sync_messages_dropped_total", m.metric...)
	}
	// Nothing of it changed the view, and the replica still serves.
	for _, w := range f.Workers(0) {
		if w.PeerInFlight != 0 || w.PrefixIndexChunks != 0 {
			t.Errorf("worker %s: peer_in_flight %d, index chunks %d after garbage", w.ID, w.PeerInFlight, w.PrefixIndexChunks)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r := f.Do(ctx, "GET", f.Replicas[0].URL+"/v1/responses/resp_lie", ""); r.Status != 404 {
		t.Fatalf("a lie's stored response: %d %s, want the gateway's 404", r.Status, r.Body)
	}
	if r := f.complete(ctx, 0, "still here?", 2); r.Err != nil || r.Status != 200 {
		t.Fatalf("after the garbage: %d %v", r.Status, r.Err)
	}
}

// TestSyncDuplicateReplicaIDCounted: two replicas given one replica_id
// drop each other's messages as their own, and say so in a metric rather
// than silently routing as if alone.
func TestSyncDuplicateReplicaIDCounted(t *testing.T) {
	ns := cluster.StartNATS(t)
	f := newTweakedFleet(t, ns, "cache_aware", 2, engineConfigs(2, 0), func(g *config.Gateway) { g.Sync.ReplicaID = "twin" })
	f.WaitRoutable(0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r := f.complete(ctx, 0, "who am I?", 2); r.Err != nil || r.Status != 200 {
		t.Fatalf("A: %d %v", r.Status, r.Err)
	}
	f.WaitMetric(1, 5*time.Second, 1, "tlgate_sync_messages_dropped_total", "kind", "batch", "reason", "duplicate_id")
	for _, w := range f.Workers(1) {
		if w.PeerInFlight != 0 || w.PrefixIndexChunks != 0 {
			t.Errorf("worker %s on B: peer_in_flight %d, index chunks %d from its twin", w.ID, w.PeerInFlight, w.PrefixIndexChunks)
		}
	}
}
