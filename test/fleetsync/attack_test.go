package fleetsync

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// TestDrillSyncAttack reruns the black-box attack on fleet sync: a
// nats-server with one token for the whole fleet (the setup attacked: the
// attacker holds the token, so it can publish under any replica id), three
// gateways with admission control on (worker_concurrency 8) and the
// fleet's replica ids listed in [gateway.sync] peers, three engines, three
// API keys. Each attack is run as it was and what it gets now is checked
// and logged (docs/SECURITY.md reports the figures):
//
//   - forged load: 256 requests claimed on two workers of three, six times
//     a second, under a made-up id: requests still spread over all three,
//     none answered 503;
//   - a stored-record flood: 5,000 forged records at replicas keeping 500
//     of their peers': the honest peers' records stay found;
//   - forged ejections of two workers, renewed every 150 ms under two
//     made-up ids: no worker is ejected, all take requests;
//   - peer slots: forty made-up ids send empty load reports every 0.5 s; a
//     new replica (listed) still gets a place, and a response it stores is
//     found through an old replica; it learns no forged record;
//   - another key's stored response: 404 for GET, DELETE and
//     previous_response_id.
func TestDrillSyncAttack(t *testing.T) {
	ns := cluster.StartNATS(t)
	late := cluster.Reserve(t) // gw-3's registry, heartbeated before it runs
	f := &fleet{Fleet: cluster.New(t, opsKey), nats: ns, policy: "least_outstanding", named: true, tweak: func(g *config.Gateway) {
		withTenants(g)
		g.Admission.Enabled = true
		g.Admission.WorkerConcurrency = 8
		g.Admission.QueueTimeout = config.D(2 * time.Second)
		g.Responses.StoreMaxEntries = 500
		g.Sync.Peers = []string{replicaID(0), replicaID(1), replicaID(2), replicaID(3)}
	}}
	for range 3 {
		f.startReplica(nil)
	}
	f.StartEngines(engineConfigs(3, 5*time.Millisecond), late.Addr())
	attacker, err := nats.Connect(ns.URL(), nats.Token(ns.Token()))
	if err != nil {
		t.Fatal(err)
	}
	defer attacker.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// 1. Forged load under a made-up id, with admission on.
	repeat(t, attacker, "forger", time.Second/6,
		router.PeerEvent{Kind: router.PeerLoad, Loads: []router.WorkerLoad{{Worker: "w0", N: 256}, {Worker: "w1", N: 256}}})
	for i := range f.Replicas {
		f.WaitWorker(i, "w0", func(w router.WorkerView) bool { return w.PeerInFlight == 256 }, "claimed by the forger")
	}
	spread := map[string]int{}
	for round := range 5 {
		for _, r := range f.concurrently(round%3, 9, 8) {
			if r.Err != nil || r.Status != http.StatusOK {
				t.Fatalf("forged load: a request answered %d %v %s", r.Status, r.Err, r.Body)
			}
			spread[r.Route()]++
		}
	}
	if spread["w0"] == 0 || spread["w1"] == 0 {
		t.Fatalf("forged load: 45 requests went %v", spread)
	}
	t.Logf("forged load (256 on w0 and w1, 6/s): 45 requests went %v, none refused; uncorroborated claims seen: %v",
		spread, f.Metric(0, "tlgate_sync_peer_claims_uncorroborated"))

	// 2. A stored-record flood from a made-up id.
	var honest []string
	for c := range 10 {
		id, _ := f.respond(ctx, c%2, "", fmt.Sprintf("an honest conversation %d", c))
		honest = append(honest, id)
	}
	forged := make([]string, 0, 5000)
	for range 10 {
		ids, evs := forgedRecords(500, "w0")
		forged = append(forged, ids...)
		publishAs(t, attacker, "flooder", "flooder", evs...)
	}
	f.WaitMetric(2, 10*time.Second, 5010, "tlgate_sync_messages_received_total", "kind", "stored")
	for _, id := range honest {
		if r := f.stored(ctx, 2, http.MethodGet, id); r.Status != http.StatusOK {
			t.Fatalf("stored flood: gw-2 lost honest record %s: %d %s", id, r.Status, r.Body)
		}
	}
	t.Logf("stored flood (5,000 forged records, 500 kept per replica for its peers): the 10 honest records stayed found on gw-2")

	// 3. Forged ejections of w0 and w1 under two made-up ids.
	eject := func(id string) router.PeerEvent {
		return router.PeerEvent{Kind: router.PeerEject, Model: model, Worker: id, Reason: "refused", For: 5 * time.Minute}
	}
	for _, id := range []string{"ejector-1", "ejector-2"} {
		repeat(t, attacker, id, 150*time.Millisecond, eject("w0"), eject("w1"))
	}
	f.WaitMetric(0, 10*time.Second, 4, "tlgate_sync_messages_dropped_total", "kind", "eject", "reason", "no_evidence")
	// A replica's first requests try w0 and w1 one at a time (each a
	// suspect on the forgers' word); their answers belie the word, which
	// is then ignored until the end it claimed.
	first, after := map[string]int{}, map[string]int{}
	for round := range 9 {
		took := after
		if round < 3 {
			took = first
		}
		for _, r := range f.concurrently(round%3, 9, 8) {
			if r.Err != nil || r.Status != http.StatusOK {
				t.Fatalf("forged ejections: a request answered %d %v %s", r.Status, r.Err, r.Body)
			}
			took[r.Route()]++
		}
	}
	for i := range f.Replicas {
		for _, w := range f.Workers(i) {
			if !w.EjectedUntil.IsZero() {
				t.Fatalf("forged ejections: %s ejected on gw-%d", w.ID, i)
			}
		}
	}
	if first["w0"] == 0 || first["w1"] == 0 || after["w0"] < 9 || after["w1"] < 9 {
		t.Fatalf("forged ejections: 27 requests went %v, the next 54 %v", first, after)
	}
	t.Logf("forged ejections (w0 and w1, every 150 ms, two made-up ids): no worker ejected on any replica; each replica's first 9 requests went %v (w0 and w1 one at a time, as suspects), the next 54 %v",
		first, after)

	// 4. Peer slots: forty made-up ids; then gw-3 (listed) starts.
	for k := range 40 {
		repeat(t, attacker, fmt.Sprintf("slot-%d", k), 500*time.Millisecond, router.PeerEvent{Kind: router.PeerLoad})
	}
	cluster.Eventually(t, 10*time.Second, func() bool { return f.Metric(0, "tlgate_sync_peers") == 32 }, "the made-up ids to fill max_peers (32)")
	f.startReplica(late) // gw-3
	f.WaitRoutable(3)
	newID, _ := f.respond(ctx, 3, "", "stored through the new replica")
	cluster.Eventually(t, 10*time.Second, func() bool {
		return f.stored(ctx, 0, http.MethodGet, newID).Status == http.StatusOK
	}, "gw-0 to find a response stored through gw-3")
	for _, id := range forged[:50] {
		if r := f.stored(ctx, 3, http.MethodGet, id); r.Status != http.StatusNotFound || r.Route() != "" {
			t.Fatalf("peer slots: gw-3 learnt forged record %s from a peer: %d from %q", id, r.Status, r.Route())
		}
	}
	t.Logf("peer slots (40 made-up ids): gw-0 tracks %v replicas and dropped %v messages of the others (too_many_peers); gw-3 got a place and its stored response was found through gw-0; it learnt no forged record",
		f.Metric(0, "tlgate_sync_peers"), f.Metric(0, "tlgate_sync_messages_dropped_total", "reason", "too_many_peers"))

	// 5. Another key's stored response.
	alice, bob := f.as(aliceKey), f.as(bobKey)
	r := alice.Do(ctx, http.MethodPost, f.Replicas[0].URL+"/v1/responses", `{"model":"`+model+`","input":"alice's","max_output_tokens":2}`)
	id := gjson.GetBytes(r.Body, "id").Str
	if r.Status != http.StatusOK {
		t.Fatalf("alice's response: %d %s", r.Status, r.Body)
	}
	cluster.Eventually(t, 5*time.Second, func() bool {
		return alice.Do(ctx, http.MethodGet, f.Replicas[1].URL+"/v1/responses/"+id, "").Status == http.StatusOK
	}, "gw-1 to learn alice's response")
	for _, m := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/responses/" + id, ""},
		{http.MethodDelete, "/v1/responses/" + id, ""},
		{http.MethodPost, "/v1/responses", fmt.Sprintf(`{"model":%q,"input":"go on","previous_response_id":%q}`, model, id)},
	} {
		if r := bob.Do(ctx, m.method, f.Replicas[1].URL+m.path, m.body); r.Status != http.StatusNotFound {
			t.Fatalf("bob's %s %s: %d %s, want 404", m.method, m.path, r.Status, r.Body)
		}
	}
	t.Logf("another key's stored response: 404 for GET, DELETE and previous_response_id on every replica")
}
