package test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tlgate/tlgate/enginesim"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// dotModelIDs are model ids that name another model once a URL path is
// normalised: every one is refused wherever a model id comes in.
var dotModelIDs = []string{"rogue/../m1", "./m1", "m1/.", "a//m1", "/m1", "m1/", "..", "."}

// TestModelIDPathSegmentsRefused: a model id with an empty, "." or ".."
// segment is refused in a heartbeat (InvalidArgument, nothing registered),
// in a route table (400 invalid_routes, the table in force kept), in a
// request (400 invalid_request naming model) and in a drain's path
// (404), so no engine can name a model that drains another; an id with a
// "/" sent as %2F drains that model and no other.
func TestModelIDPathSegmentsRefused(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys()},
		enginesim.Config{ID: "m1-a", Model: "m1"}, enginesim.Config{ID: "team-m1", Model: "team/m1"})
	conn, err := grpc.NewClient(c.gw.RegistryAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := controlv1.NewWorkerRegistryClient(conn)
	for _, id := range dotModelIDs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := client.Heartbeat(ctx, &controlv1.WorkerStatus{WorkerId: "rogue", Model: id,
			HttpAddress: c.engines["m1-a"].HTTPAddr(), Role: controlv1.Role_ROLE_UNIFIED})
		cancel()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "segment") {
			t.Errorf("heartbeat with model %q: %v, want InvalidArgument naming the segment", id, err)
		}
	}
	if w, ok := c.drillWorker("rogue"); ok {
		t.Fatalf("a refused model id registered a worker: %+v", w)
	}

	etag := c.get("/admin/v1/routes", "key-admin").header.Get("ETag")
	for _, id := range dotModelIDs {
		for _, table := range []string{
			`{"routes":[{"model":"` + id + `","backends":[{"model":"m1","weight":1}]}]}`,
			`{"routes":[{"model":"r","backends":[{"model":"` + id + `","weight":1}]}]}`,
			`{"routes":[{"model":"r","aliases":["` + id + `"]}]}`,
		} {
			req, _ := http.NewRequest(http.MethodPut, c.url+"/admin/v1/routes", strings.NewReader(table))
			req.Header.Set("Authorization", "Bearer key-admin")
			req.Header.Set("If-Match", etag)
			if r := c.do(req); r.status != http.StatusBadRequest || errorCode(t, r.body) != "invalid_routes" {
				t.Errorf("PUT %s: %d %s, want 400 invalid_routes", table, r.status, r.body)
			}
		}
		r := c.post("/v1/completions", "key-debug", map[string]any{"model": id, "prompt": "hi", "max_tokens": 1})
		if r.status != http.StatusBadRequest || errorCode(t, r.body) != "invalid_request" || !strings.Contains(string(r.body), `"param":"model"`) {
			t.Errorf("request for model %q: %d %s, want 400 invalid_request on model", id, r.status, r.body)
		}
	}
	if got := c.get("/admin/v1/routes", "key-admin").header.Get("ETag"); got != etag {
		t.Fatalf("a refused table was installed: ETag %s, was %s", got, etag)
	}

	// The admin API refuses such an id in its path, however it is escaped.
	for _, p := range []string{"rogue%2F..%2Fm1", "rogue%2F%2E%2E%2Fm1", "%2Fm1", "m1%2F"} {
		if r := c.post("/admin/v1/models/"+p+":drain", "key-admin", ""); r.status != http.StatusNotFound {
			t.Errorf("drain %s: %d %s, want 404", p, r.status, r.body)
		}
	}
	if w, _ := c.drillWorker("m1-a"); w.Drained || !w.Routable {
		t.Fatalf("m1 drained by a refused drain: %+v", w)
	}
	// team/m1, with its "/" escaped, drains team/m1 alone.
	if b := c.drillAdmin(t, "team%2Fm1", "drain"); b.Model != "team/m1" || len(b.Drained) != 1 || b.Drained[0] != "team/m1" || b.Workers != 1 {
		t.Fatalf("drain team%%2Fm1: %+v, want team/m1 drained, 1 worker", b)
	}
	if w, _ := c.drillWorker("m1-a"); w.Drained {
		t.Fatal("draining team/m1 drained m1")
	}
	c.drillAdmin(t, "team%2Fm1", "resume")
}
