package fleetsync

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
	"github.com/tlgate/tlgate/internal/tool/tlctl"
)

// TestSyncForgedEjectionNeedsEvidence: a replica's credentials in the
// wrong hands eject two workers of three every 150 ms. One peer's word is
// no evidence: the workers stay routable, requests reach all three (each
// trial answers, and drops the word), and the words are counted as
// no_evidence. Two peers saying the same (ejection_quorum 2) are.
func TestSyncForgedEjectionNeedsEvidence(t *testing.T) {
	f := newUsersFleet(t, "least_outstanding", 1, engineConfigs(3, 5*time.Millisecond), func(g *config.Gateway) {
		g.Ejection.MaxPercent = 100
	}, nil, "rogue", "rogue2")
	eject := func(id string) router.PeerEvent {
		return router.PeerEvent{Kind: router.PeerEject, Model: model, Worker: id, Reason: "refused", For: 5 * time.Minute}
	}
	rogue, _ := f.connectAs("rogue")
	repeat(t, rogue, "rogue", 150*time.Millisecond, eject("w0"), eject("w1"))
	f.WaitMetric(0, 10*time.Second, 4, "tlgate_sync_messages_dropped_total", "kind", "eject", "reason", "no_evidence")

	got := map[string]int{}
	for range 3 {
		for _, r := range f.concurrently(0, 6, 8) {
			if r.Err != nil || r.Status != 200 {
				t.Fatalf("a request: %d %v %s", r.Status, r.Err, r.Body)
			}
			got[r.Route()]++
		}
	}
	if got["w0"] == 0 || got["w1"] == 0 {
		t.Fatalf("18 requests went %v: a forged ejection kept a worker out", got)
	}
	for _, w := range f.Workers(0) {
		if !w.EjectedUntil.IsZero() {
			t.Fatalf("worker %s ejected on one peer's word", w.ID)
		}
	}

	// Two replicas' word is the quorum (about w2: their words about w0 and
	// w1 were belied by answers, and are ignored for the 5 minutes they
	// claim).
	rogue2, _ := f.connectAs("rogue2")
	publishAs(t, rogue, "rogue", "rogue", eject("w2"))
	publishAs(t, rogue2, "rogue2", "rogue2", eject("w2"))
	f.WaitWorker(0, "w2", func(w router.WorkerView) bool { return !w.EjectedUntil.IsZero() }, "ejected on two peers' word")
}

// storedOn stores responses through replica i until one is stored on
// worker and returns its id (requests go two at a time, so both workers
// take some).
func (f *fleet) storedOn(ctx context.Context, i int, worker string) string {
	f.T.Helper()
	for range 20 {
		rs := make([]cluster.Reply, 2)
		done := make(chan int, 2)
		for k := range rs {
			go func() {
				rs[k] = f.Do(ctx, http.MethodPost, f.Replicas[i].URL+"/v1/responses", `{"model":"`+model+`","input":"keep this","max_output_tokens":8}`)
				done <- k
			}()
		}
		<-done
		<-done
		for _, r := range rs {
			if r.Err != nil || r.Status != http.StatusOK {
				f.T.Fatalf("POST /v1/responses: %d %v %s", r.Status, r.Err, r.Body)
			}
			if r.Route() == worker {
				return gjson.GetBytes(r.Body, "id").Str
			}
		}
	}
	f.T.Fatalf("no response stored on %s in 40 tries", worker)
	return ""
}

// TestAdminLiftEjection: an operator lifts an ejection on one replica
// (POST /admin/v1/workers/{id}:lift-ejection, here through tlctl lift),
// and it ends on every replica: the worker takes requests again
// everywhere. Unknown workers and actions are 404s.
func TestAdminLiftEjection(t *testing.T) {
	f := newTweakedFleet(t, cluster.StartNATS(t), "least_outstanding", 3, engineConfigs(2, 20*time.Millisecond), func(g *config.Gateway) {
		g.Ejection.BaseTime = config.D(time.Hour)
		g.Ejection.MaxTime = config.D(time.Hour)
		g.Sync.EjectionQuorum = 1 // any peer's word: the fleet ejects on A's failure
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stored := f.storedOn(ctx, 0, "w0")
	if err := f.Engines[0].SetFaults(enginesim.Faults{Refuse: true}); err != nil {
		t.Fatal(err)
	}
	cluster.Eventually(t, 10*time.Second, func() bool {
		for _, r := range f.concurrently(0, 4, 8) { // some find w1 busy and try w0
			if r.Err != nil || r.Status != 200 {
				t.Fatalf("A: %d %v %s", r.Status, r.Err, r.Body)
			}
		}
		return !f.Worker(0, "w0").EjectedUntil.IsZero()
	}, "A to eject w0")
	for i := range f.Replicas {
		f.WaitWorker(i, "w0", func(w router.WorkerView) bool { return !w.EjectedUntil.IsZero() && !w.Routable }, "ejected")
	}
	if err := f.Engines[0].SetFaults(enginesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	// The response stored on w0 cannot be reached meanwhile, and the
	// answer says why.
	r := f.Do(ctx, http.MethodGet, f.Replicas[2].URL+"/v1/responses/"+stored, "")
	if r.Status != http.StatusServiceUnavailable || !strings.Contains(string(r.Body), stored) || !strings.Contains(string(r.Body), "is ejected until") {
		t.Fatalf("GET a response stored on the ejected worker: %d %s, want 503 naming the response and the ejection", r.Status, r.Body)
	}

	var out, errOut bytes.Buffer
	env := map[string]string{"TLGATE_URL": f.Replicas[1].URL, "TLGATE_KEY": opsKey}
	if code := tlctl.Run(ctx, []string{"lift", "w0"}, func(k string) string { return env[k] }, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), "ejection lifted on this replica") || !strings.Contains(out.String(), "other replicas were told") {
		t.Fatalf("tlctl lift w0: %d\n%s%s", code, out.String(), errOut.String())
	}
	for i := range f.Replicas {
		f.WaitWorker(i, "w0", func(w router.WorkerView) bool { return w.EjectedUntil.IsZero() && w.Routable && w.Ejections == 0 }, "lifted")
	}
	for i := range f.Replicas {
		seen := false
		for _, r := range f.concurrently(i, 4, 8) { // two at least on each worker
			if r.Err != nil || r.Status != 200 {
				t.Fatalf("replica %d after the lift: %d %v %s", i, r.Status, r.Err, r.Body)
			}
			seen = seen || r.Route() == "w0"
		}
		if !seen {
			t.Fatalf("replica %d sent nothing to w0 after the lift", i)
		}
	}

	if r := f.Do(ctx, http.MethodGet, f.Replicas[2].URL+"/v1/responses/"+stored, ""); r.Status != http.StatusOK || r.Route() != "w0" {
		t.Fatalf("GET the response stored on w0 after the lift: %d from %q %s", r.Status, r.Route(), r.Body)
	}

	// The same through the API: lifting again is no error; unknown
	// workers and actions are 404s.
	r = f.Do(ctx, http.MethodPost, f.Replicas[0].URL+"/admin/v1/workers/w0:lift-ejection", "")
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"lifted":false`) || !strings.Contains(string(r.Body), `"fleet":true`) {
		t.Fatalf("lifting w0 again: %d %s", r.Status, r.Body)
	}
	for _, path := range []string{"/admin/v1/workers/nobody:lift-ejection", "/admin/v1/workers/w0:explode", "/admin/v1/workers/w0"} {
		if r := f.Do(ctx, http.MethodPost, f.Replicas[0].URL+path, ""); r.Status != http.StatusNotFound {
			t.Fatalf("POST %s: %d %s, want 404", path, r.Status, r.Body)
		}
	}
}
