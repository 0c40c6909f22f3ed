package fleetsync

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/routing/sticky"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// Two tenants' keys, besides the fleet's ops key.
const (
	aliceKey = "fleetsync-alice-key"
	bobKey   = "fleetsync-bob-key"
)

// withTenants adds alice's and bob's keys (inference and debug).
func withTenants(g *config.Gateway) {
	for name, key := range map[string]string{"alice": aliceKey, "bob": bobKey} {
		g.APIKeys = append(g.APIKeys, config.APIKey{Name: name, Key: key, Scopes: []string{"inference", "debug"}})
	}
}

// as is the fleet's client with key as its API key.
func (f *fleet) as(key string) *cluster.Fleet {
	c := *f.Fleet
	c.Key = key
	return &c
}

// TestResponsesOwnedByKey: a response alice stored through one replica is
// alice's on every replica: bob gets the same 404 an unknown id gets for
// GET, DELETE and previous_response_id through either replica (and the
// response survives his DELETE), while alice reads it, follows it up and
// deletes it through the other.
func TestResponsesOwnedByKey(t *testing.T) {
	f := newTweakedFleet(t, cluster.StartNATS(t), "least_outstanding", 2, engineConfigs(2, 0), withTenants)
	alice, bob := f.as(aliceKey), f.as(bobKey)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := alice.Do(ctx, http.MethodPost, f.Replicas[0].URL+"/v1/responses", `{"model":"`+model+`","input":"alice's secret","max_output_tokens":2}`)
	id := gjson.GetBytes(r.Body, "id").Str
	if r.Status != http.StatusOK || id == "" {
		t.Fatalf("alice's POST: %d %s", r.Status, r.Body)
	}
	f.WaitMetric(1, 5*time.Second, 1, "tlgate_sync_messages_received_total", "kind", "stored")

	unknown := bob.Do(ctx, http.MethodGet, f.Replicas[0].URL+"/v1/responses/resp_nobody_has_this", "")
	notFound := func(what string, r cluster.Reply) {
		t.Helper()
		if r.Err != nil || r.Status != http.StatusNotFound || gjson.GetBytes(r.Body, "error.code").Str != "response_not_found" || r.Route() != "" {
			t.Fatalf("%s: %d %v %s (route %q), want the gateway's 404 response_not_found", what, r.Status, r.Err, r.Body, r.Route())
		}
	}
	notFound("an unknown id", unknown)
	for i := range f.Replicas {
		notFound(fmt.Sprintf("bob's GET through replica %d", i), bob.Do(ctx, http.MethodGet, f.Replicas[i].URL+"/v1/responses/"+id, ""))
		notFound(fmt.Sprintf("bob's DELETE through replica %d", i), bob.Do(ctx, http.MethodDelete, f.Replicas[i].URL+"/v1/responses/"+id, ""))
		// HEAD goes where GET goes (net/http's mux), and answers as GET would, without a body.
		if r := bob.Do(ctx, http.MethodHead, f.Replicas[i].URL+"/v1/responses/"+id, ""); r.Err != nil || r.Status != http.StatusNotFound || r.Route() != "" {
			t.Fatalf("bob's HEAD through replica %d: %d %v (route %q), want the gateway's 404", i, r.Status, r.Err, r.Route())
		}
		notFound(fmt.Sprintf("bob's follow-up through replica %d", i), bob.Do(ctx, http.MethodPost, f.Replicas[i].URL+"/v1/responses",
			fmt.Sprintf(`{"model":%q,"input":"tell me","max_output_tokens":2,"previous_response_id":%q}`, model, id)))
	}
	if r := alice.Do(ctx, http.MethodGet, f.Replicas[1].URL+"/v1/responses/"+id, ""); r.Status != http.StatusOK || gjson.GetBytes(r.Body, "id").Str != id {
		t.Fatalf("alice's GET through replica 1 after bob's tries: %d %s", r.Status, r.Body)
	}
	r = alice.Do(ctx, http.MethodPost, f.Replicas[1].URL+"/v1/responses",
		fmt.Sprintf(`{"model":%q,"input":"and then?","max_output_tokens":2,"previous_response_id":%q}`, model, id))
	if r.Status != http.StatusOK {
		t.Fatalf("alice's follow-up through replica 1: %d %s", r.Status, r.Body)
	}
	if r := alice.Do(ctx, http.MethodDelete, f.Replicas[1].URL+"/v1/responses/"+id, ""); r.Status != http.StatusOK {
		t.Fatalf("alice's DELETE through replica 1: %d %s", r.Status, r.Body)
	}
}

// forgedRecords are n stored responses of made-up ids on worker, for
// the ops key, as a peer's events.
func forgedRecords(n int, worker string) (ids []string, evs []router.PeerEvent) {
	for range n {
		id := "resp_" + rand.Text()
		ids = append(ids, id)
		evs = append(evs, router.PeerEvent{Kind: router.PeerStored, ID: sticky.Digest(id), Owner: sticky.OwnerTag(id, "ops"), Worker: worker, For: time.Hour})
	}
	return ids, evs
}

// TestStoredRecordsQuotaPerPeer: a replica's credentials in the wrong
// hands flood 5,000 stored responses at a replica keeping 50 of its
// peers'; the honest peer's 10 stay found: each peer pushes out its own
// once it holds more than its share.
func TestStoredRecordsQuotaPerPeer(t *testing.T) {
	f := newUsersFleet(t, "least_outstanding", 2, engineConfigs(2, 0), func(g *config.Gateway) {
		g.Responses.StoreMaxEntries = 50
	}, nil, "rogue")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var honest []string
	for c := range 10 {
		id, _ := f.respond(ctx, 1, "", fmt.Sprintf("conversation %d", c))
		honest = append(honest, id)
	}
	f.WaitMetric(0, 5*time.Second, 10, "tlgate_sync_messages_received_total", "kind", "stored")

	rogue, _ := f.connectAs("rogue")
	for range 10 {
		_, evs := forgedRecords(500, "w0")
		publishAs(t, rogue, "rogue", "rogue", evs...)
	}
	f.WaitMetric(0, 10*time.Second, 5010, "tlgate_sync_messages_received_total", "kind", "stored")
	for _, id := range honest {
		if r := f.stored(ctx, 0, http.MethodGet, id); r.Status != http.StatusOK || gjson.GetBytes(r.Body, "id").Str != id {
			t.Fatalf("replica 0: GET %s (stored through replica 1) after the flood: %d %s", id, r.Status, r.Body)
		}
	}
}

// TestSnapshotHoldsNoPeerRecords: a replica vouches only for the stored
// responses it relayed itself. Records a rogue planted on gw-0 never
// reach a replica that starts later (neither in gw-0's snapshot nor in
// gw-0's answer when asked for its records), while gw-1's own responses
// do, from gw-1.
func TestSnapshotHoldsNoPeerRecords(t *testing.T) {
	late := cluster.Reserve(t)
	f := newUsersFleet(t, "least_outstanding", 2, engineConfigs(2, 0), nil, []string{late.Addr()}, "rogue")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var honest []string
	for c := range 3 {
		id, _ := f.respond(ctx, 1, "", fmt.Sprintf("conversation %d", c))
		honest = append(honest, id)
	}
	rogue, _ := f.connectAs("rogue")
	forged, evs := forgedRecords(5, "w0")
	publishAs(t, rogue, "rogue", "rogue", evs...)
	f.WaitMetric(0, 5*time.Second, 8, "tlgate_sync_messages_received_total", "kind", "stored")
	// On gw-0 a forged id leads to w0 (whose engine knows nothing of it).
	if r := f.stored(ctx, 0, http.MethodGet, forged[0]); r.Route() != "w0" {
		t.Fatalf("gw-0: GET a planted id: %d from %q %s, want it sent to w0 by the planted record", r.Status, r.Route(), r.Body)
	}

	f.startReplica(late) // gw-2
	f.WaitMetric(2, 10*time.Second, 1, "tlgate_sync_snapshots_total", "outcome", "applied")
	f.WaitRoutable(2)
	cluster.Eventually(t, 10*time.Second, func() bool {
		r := f.stored(ctx, 2, http.MethodGet, honest[2])
		return r.Status == http.StatusOK
	}, "gw-2 to learn gw-1's stored responses from gw-1")
	for _, id := range honest {
		if r := f.stored(ctx, 2, http.MethodGet, id); r.Status != http.StatusOK || gjson.GetBytes(r.Body, "id").Str != id {
			t.Fatalf("gw-2: GET %s (stored through gw-1): %d %s", id, r.Status, r.Body)
		}
	}
	time.Sleep(500 * time.Millisecond) // gw-0's answer, had it any
	for _, id := range forged {
		r := f.stored(ctx, 2, http.MethodGet, id)
		if r.Status != http.StatusNotFound || r.Route() != "" {
			t.Fatalf("gw-2: GET planted %s: %d from %q %s, want the gateway's 404: gw-0 passed on a peer's record", id, r.Status, r.Route(), r.Body)
		}
	}
}
