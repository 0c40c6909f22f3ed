package fleetsync

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// respond sends a Responses API request to replica i (a follow-up of prev
// when not "") and returns the answer, failing the test unless it is a
// 200 with an id.
func (f *fleet) respond(ctx context.Context, i int, prev, input string) (id, worker string) {
	f.T.Helper()
	body := fmt.Sprintf(`{"model":%q,"input":%q,"max_output_tokens":2}`, model, input)
	if prev != "" {
		body = fmt.Sprintf(`{"model":%q,"input":%q,"max_output_tokens":2,"previous_response_id":%q}`, model, input, prev)
	}
	r := f.Do(ctx, "POST", f.Replicas[i].URL+"/v1/responses", body)
	id = gjson.GetBytes(r.Body, "id").Str
	if r.Err != nil || r.Status != http.StatusOK || id == "" {
		f.T.Fatalf("replica %d: POST /v1/responses (previous %q): %d %v %s", i, prev, r.Status, r.Err, r.Body)
	}
	return id, r.Route()
}

// stored sends method (GET or DELETE) /v1/responses/id to replica i.
func (f *fleet) stored(ctx context.Context, i int, method, id string) cluster.Reply {
	f.T.Helper()
	r := f.Do(ctx, method, f.Replicas[i].URL+"/v1/responses/"+id, "")
	if r.Err != nil {
		f.T.Fatalf("replica %d: %s %s: %v", i, method, id, r.Err)
	}
	return r
}

// TestSyncSharesStoredResponses: a response stored through replica A is
// followed up (previous_response_id), read and deleted through replica B,
// each time on the worker that stores it; after B's DELETE, A answers 404
// too. A replica started afterwards takes the ids from a peer's snapshot
// and routes them to their workers.
func TestSyncSharesStoredResponses(t *testing.T) {
	ns := cluster.StartNATS(t)
	late := cluster.Reserve(t) // replica C's registry, heartbeated before C runs
	// weighted takes the workers in turn: a follow-up that were not routed
	// by the stored id would meet a worker that does not know it.
	f := newFleet(t, ns, "weighted", 2, engineConfigs(3, 0), late.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const n = 6
	ids, workers := make([]string, n), map[string]string{}
	for c := range n {
		id, w := f.respond(ctx, 0, "", fmt.Sprintf("conversation %d", c))
		ids[c], workers[id] = id, w
	}
	if distinct := map[string]bool{workers[ids[0]]: true, workers[ids[1]]: true, workers[ids[2]]: true}; len(distinct) < 2 {
		t.Fatalf("responses all stored on %v: the test cannot tell routing by id from chance", workers)
	}
	f.WaitMetric(1, 5*time.Second, n, "tlgate_sync_messages_received_total", "kind", "stored")

	// Through B: a follow-up of each, then a GET of the follow-up, on
	// the worker that stores it.
	next := make([]string, n)
	for c, id := range ids {
		nid, w := f.respond(ctx, 1, id, "and then?")
		if w != workers[id] {
			t.Fatalf("B sent the follow-up of %s to %s; A stored it on %s", id, w, workers[id])
		}
		next[c], workers[nid] = nid, w
		if r := f.stored(ctx, 1, "GET", id); r.Status != http.StatusOK || r.Route() != workers[id] || gjson.GetBytes(r.Body, "id").Str != id {
			t.Fatalf("B: GET %s: %d from %q, want 200 from %s: %s", id, r.Status, r.Route(), workers[id], r.Body)
		}
	}
	// A learns B's follow-ups the same way.
	f.WaitMetric(0, 5*time.Second, n, "tlgate_sync_messages_received_total", "kind", "stored")
	for _, id := range next {
		if r := f.stored(ctx, 0, "GET", id); r.Status != http.StatusOK || r.Route() != workers[id] {
			t.Fatalf("A: GET %s (stored through B): %d from %q, want 200 from %s: %s", id, r.Status, r.Route(), workers[id], r.Body)
		}
	}

	// DELETE through B; then A answers 404 for it too.
	gone := ids[0]
	if r := f.stored(ctx, 1, "DELETE", gone); r.Status != http.StatusOK || r.Route() != workers[gone] {
		t.Fatalf("B: DELETE %s: %d from %q, want 200 from %s: %s", gone, r.Status, r.Route(), workers[gone], r.Body)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if r := f.stored(ctx, 0, m, gone); r.Status != http.StatusNotFound || gjson.GetBytes(r.Body, "error.code").Str != "response_not_found" {
			t.Fatalf("A: %s %s after B deleted it: %d %s, want 404 response_not_found", m, gone, r.Status, r.Body)
		}
	}
	if r := f.stored(ctx, 1, "GET", gone); r.Status != http.StatusNotFound {
		t.Fatalf("B: GET %s after its DELETE: %d %s", gone, r.Status, r.Body)
	}

	// A replica that starts now finds every id through a peer's snapshot,
	// its workers' first heartbeats before or after it.
	f.startReplica(late)
	f.WaitMetric(2, 5*time.Second, 1, "tlgate_sync_snapshots_total", "outcome", "applied")
	f.WaitRoutable(2)
	// C asks each peer for the responses it stored itself once it first
	// hears from it; the answers arrive on their own time.
	known := append(ids[1:], next...)
	cluster.Eventually(t, 10*time.Second, func() bool {
		for _, id := range known {
			if f.stored(ctx, 2, "GET", id).Status != http.StatusOK {
				return false
			}
		}
		return true
	}, "replica 2 to know every stored response")
	for _, id := range known {
		if r := f.stored(ctx, 2, "GET", id); r.Status != http.StatusOK || r.Route() != workers[id] {
			t.Fatalf("C: GET %s: %d from %q, want 200 from %s: %s", id, r.Status, r.Route(), workers[id], r.Body)
		}
	}
	nid, w := f.respond(ctx, 2, next[1], "and then, on the new replica?")
	if w != workers[next[1]] {
		t.Fatalf("C sent the follow-up of %s to %s; it is stored on %s", next[1], w, workers[next[1]])
	}
	if r := f.stored(ctx, 2, "DELETE", nid); r.Status != http.StatusOK || r.Route() != w {
		t.Fatalf("C: DELETE %s: %d from %q, want 200 from %s", nid, r.Status, r.Route(), w)
	}
}
