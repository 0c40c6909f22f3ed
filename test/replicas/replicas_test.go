package replicas

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// TestReplicasShareRoutes: a PUT on A is served, within 2 s, by B and C
// with the new ETag, and they route by it.
func TestReplicasShareRoutes(t *testing.T) {
	f := newFleet(t, cluster.StartEtcd(t, 1), 3, nil, engineConfigs(0))
	for i := range f.Replicas {
		if got := f.routedTo(i, "smol"); got != "smol-v3-a" {
			t.Fatalf("replica %d routes smol to %q before the PUT, want smol-v3-a", i, got)
		}
	}
	etag, _ := f.getRoutes(0)
	if etag != `"1"` {
		t.Fatalf("first ETag %s, want \"1\"", etag)
	}
	put := f.putRoutes(0, etag, routesBody("smol-v4"))
	if put.Err != nil || put.Status != 200 || put.Header.Get("ETag") != `"2"` {
		t.Fatalf("PUT on A: %d %s %v", put.Status, put.Body, put.Err)
	}
	for i := 1; i < 3; i++ {
		body := f.waitETag(i, `"2"`, 2*time.Second)
		if !sameTable(body, put.Body) {
			t.Fatalf("replica %d serves %s, want %s", i, body, put.Body)
		}
		cluster.Eventually(t, 2*time.Second, func() bool { return f.routedTo(i, "smol") == "smol-v4-a" }, "replica %d to route smol to smol-v4-a", i)
		if g := f.Metric(i, "tlgate_route_epoch"); g != 2 {
			t.Errorf("replica %d tlgate_route_epoch %v, want 2", i, g)
		}
	}
	// A stale ETag is refused on a replica that did not take the write.
	if r := f.putRoutes(2, `"1"`, routesBody("big")); r.Status != http.StatusPreconditionFailed {
		t.Fatalf("stale PUT on C: %d %s", r.Status, r.Body)
	}
}

// TestReplicasRacePut: the same If-Match PUT on A and B at once gives one
// 200 and one 412, and every replica ends with the winner's table.
func TestReplicasRacePut(t *testing.T) {
	f := newFleet(t, cluster.StartEtcd(t, 1), 3, nil, nil)
	for round := 1; round <= 5; round++ {
		etag := `"` + strconv.Itoa(round) + `"`
		for i := range f.Replicas {
			f.waitETag(i, etag, 5*time.Second)
		}
		bodies := []string{routesBody("a-" + strconv.Itoa(round)), routesBody("b-" + strconv.Itoa(round))}
		replies := make([]cluster.Reply, 2)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 2 {
			wg.Go(func() {
				<-start
				replies[i] = f.putRoutes(i, etag, bodies[i])
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, r := range replies {
			switch {
			case r.Err != nil:
				t.Fatalf("round %d: PUT on replica %d: %v", round, i, r.Err)
			case r.Status == 200:
				if winner >= 0 {
					t.Fatalf("round %d: both PUTs answered 200", round)
				}
				winner = i
			case r.Status != http.StatusPreconditionFailed:
				t.Fatalf("round %d: PUT on replica %d: %d %s, want 200 or 412", round, i, r.Status, r.Body)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no PUT answered 200: %d %s / %d %s", round, replies[0].Status, replies[0].Body, replies[1].Status, replies[1].Body)
		}
		next := `"` + strconv.Itoa(round+1) + `"`
		if loser := replies[1-winner]; loser.Header.Get("ETag") != next && loser.Header.Get("ETag") != etag {
			t.Errorf("round %d: the 412 carries ETag %s", round, loser.Header.Get("ETag"))
		}
		for i := range f.Replicas {
			body := f.waitETag(i, next, 5*time.Second)
			if !sameTable(body, replies[winner].Body) {
				t.Fatalf("round %d: replica %d serves %s, want the winner's %s", round, i, body, replies[winner].Body)
			}
		}
	}
}

// TestReplicasShareDrain: a drain on A stops routing on every replica and
// every replica's heartbeat acks carry it; a resume on C undoes it on all.
func TestReplicasShareDrain(t *testing.T) {
	f := newFleet(t, cluster.StartEtcd(t, 1), 3, nil, engineConfigs(0))
	bigAddr := ""
	for _, w := range f.Workers(0) {
		if w.ID == "big-a" {
			bigAddr = w.HTTPAddress
		}
	}
	r := f.do("POST", f.Replicas[0].URL+"/admin/v1/models/big:drain", "")
	if r.Status != http.StatusAccepted {
		t.Fatalf("drain on A: %d %s", r.Status, r.Body)
	}
	for i := range f.Replicas {
		f.WaitWorker(i, "big-a", func(w router.WorkerView) bool { return w.Drained && !w.Routable }, "drained")
		cluster.Eventually(t, 5*time.Second, func() bool {
			drain, err := f.ackDrain(i, "ack-probe-"+strconv.Itoa(i), "big", bigAddr)
			return err == nil && drain
		}, "replica %d's acks to carry the drain", i)
		if got := f.complete(i, "big"); got.Status != http.StatusServiceUnavailable {
			t.Errorf("replica %d answers big with %d while it is drained, want 503", i, got.Status)
		}
		if got := f.routedTo(i, "smol"); got != "smol-v3-a" {
			t.Errorf("replica %d routes smol to %q during the drain, want smol-v3-a", i, got)
		}
	}
	r = f.do("POST", f.Replicas[2].URL+"/admin/v1/models/big:resume", "")
	if r.Status != http.StatusAccepted {
		t.Fatalf("resume on C: %d %s", r.Status, r.Body)
	}
	for i := range f.Replicas {
		f.WaitWorker(i, "big-a", func(w router.WorkerView) bool { return !w.Drained }, "resumed")
		cluster.Eventually(t, 5*time.Second, func() bool { return f.routedTo(i, "big") == "big-a" }, "replica %d to route big again", i)
	}
}

// TestStoreOutageKeepsServing: with etcd stopped, inference keeps
// answering, /readyz stays ready, tlgate_store_up is 0 and an admin PUT
// gets 503 store_unavailable with Retry-After. With etcd back, a PUT works
// and every replica converges.
func TestStoreOutageKeepsServing(t *testing.T) {
	c := cluster.StartEtcd(t, 1)
	f := newFleet(t, c, 2, nil, engineConfigs(0))
	c.Stop(0)
	for i := range f.Replicas {
		cluster.Eventually(t, 10*time.Second, func() bool { return !f.Replicas[i].GW.StoreUp() }, "replica %d to see etcd down", i)
		if g := f.Metric(i, "tlgate_store_up"); g != 0 {
			t.Errorf("replica %d tlgate_store_up %v while etcd is down, want 0", i, g)
		}
		if got := f.routedTo(i, "smol"); got != "smol-v3-a" {
			t.Errorf("replica %d: inference during the outage went to %q, want smol-v3-a", i, got)
		}
		if r := f.do("GET", f.Replicas[i].URL+"/readyz", ""); r.Status != 200 {
			t.Errorf("replica %d /readyz %d during the outage, want 200", i, r.Status)
		}
		r := f.putRoutes(i, `"1"`, routesBody("smol-v4"))
		if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" || !contains(r.Body, "store_unavailable") {
			t.Fatalf("replica %d PUT during the outage: %d %v %s, want 503 store_unavailable with Retry-After", i, r.Status, r.Header, r.Body)
		}
		if d := f.do("POST", f.Replicas[i].URL+"/admin/v1/models/big:drain", ""); d.Status != http.StatusServiceUnavailable {
			t.Errorf("replica %d drain during the outage: %d %s, want 503", i, d.Status, d.Body)
		}
	}
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	for i := range f.Replicas {
		cluster.Eventually(t, 15*time.Second, func() bool { return f.Replicas[i].GW.StoreUp() }, "replica %d to see etcd back", i)
	}
	var put cluster.Reply
	cluster.Eventually(t, 10*time.Second, func() bool {
		put = f.putRoutes(1, `"1"`, routesBody("smol-v4"))
		return put.Status == 200
	}, "a PUT on B to succeed after the outage (last: %d %s)", put.Status, put.Body)
	for i := range f.Replicas {
		f.waitETag(i, `"2"`, 5*time.Second)
		cluster.Eventually(t, 5*time.Second, func() bool { return f.routedTo(i, "smol") == "smol-v4-a" }, "replica %d to route by the new table", i)
		if g := f.Metric(i, "tlgate_store_up"); g != 1 {
			t.Errorf("replica %d tlgate_store_up %v after the outage, want 1", i, g)
		}
	}
}

// TestStoreCompactionResync: B loses etcd while A writes several tables
// and etcd compacts its history past what B saw; when B is back it reads
// the store at its current revision and serves the last table.
func TestStoreCompactionResync(t *testing.T) {
	c := cluster.StartEtcd(t, 1)
	proxy := newCutProxy(t, c.Endpoints()[0])
	f := newFleet(t, c, 2, func(i int) []string {
		if i == 1 {
			return []string{proxy.URL()}
		}
		return c.Endpoints()
	}, nil)
	f.waitETag(1, `"1"`, 5*time.Second)
	proxy.setCut(true)
	cluster.Eventually(t, 10*time.Second, func() bool { return !f.Replicas[1].GW.StoreUp() }, "B to see etcd down")
	var last cluster.Reply
	for epoch := 1; epoch <= 5; epoch++ {
		last = f.putRoutes(0, `"`+strconv.Itoa(epoch)+`"`, routesBody("m-"+strconv.Itoa(epoch)))
		if last.Status != 200 {
			t.Fatalf("PUT %d on A: %d %s", epoch, last.Status, last.Body)
		}
	}
	cli := etcdClient(t, c.Endpoints())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cur, err := cli.Get(ctx, "/tlgate/routes")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, cur.Header.Revision); err != nil {
		t.Fatalf("compact: %v", err)
	}
	if etag, _ := f.getRoutes(1); etag != `"1"` {
		t.Fatalf("B serves %s while cut off, want its last table \"1\"", etag)
	}
	proxy.setCut(false)
	body := f.waitETag(1, `"6"`, 20*time.Second)
	if !sameTable(body, last.Body) {
		t.Fatalf("B serves %s after the resync, want %s", body, last.Body)
	}
	cluster.Eventually(t, 10*time.Second, func() bool { return f.Replicas[1].GW.StoreUp() }, "B to see etcd up")
	if r := f.putRoutes(1, `"6"`, routesBody("after")); r.Status != 200 {
		t.Fatalf("PUT on B after the resync: %d %s", r.Status, r.Body)
	}
	f.waitETag(0, `"7"`, 5*time.Second)
}

// TestEtcdThreeMembersOneDown: with one of three etcd members down the
// store keeps its quorum: PUTs and drains work and every replica follows.
// The members run in child processes and the one that goes down is
// killed, as a crashed machine would be.
func TestEtcdThreeMembersOneDown(t *testing.T) {
	c := cluster.StartEtcdProcesses(t, 3)
	f := newFleet(t, c, 2, nil, engineConfigs(0))
	// The leader goes down: the other two elect one and go on.
	leader := etcdLeader(t, c.Endpoints())
	c.Stop(leader)
	var put cluster.Reply
	cluster.Eventually(t, 15*time.Second, func() bool {
		put = f.putRoutes(0, `"1"`, routesBody("smol-v4"))
		return put.Status == 200
	}, "a PUT with one member down (last: %d %s)", put.Status, put.Body)
	f.waitETag(1, `"2"`, 5*time.Second)
	cluster.Eventually(t, 5*time.Second, func() bool { return f.routedTo(1, "smol") == "smol-v4-a" }, "B to route by the new table")
	if r := f.do("POST", f.Replicas[1].URL+"/admin/v1/models/big:drain", ""); r.Status != http.StatusAccepted {
		t.Fatalf("drain on B with one member down: %d %s", r.Status, r.Body)
	}
	f.WaitWorker(0, "big-a", func(w router.WorkerView) bool { return w.Drained }, "drained on A")
	for i := range f.Replicas {
		if !f.Replicas[i].GW.StoreUp() {
			t.Errorf("replica %d sees the store down with 2 of 3 members up", i)
		}
	}
	// The member comes back and catches up; the fleet goes on.
	if err := c.Restart(leader); err != nil {
		t.Fatal(err)
	}
	if r := f.putRoutes(1, `"2"`, routesBody("smol-v3")); r.Status != 200 {
		t.Fatalf("PUT after the member's return: %d %s", r.Status, r.Body)
	}
	f.waitETag(0, `"3"`, 5*time.Second)
}

func contains(b []byte, s string) bool { return strings.Contains(string(b), s) }

// TestStoreUnreachableAtStart: a gateway whose etcd cannot be reached
// refuses to start once dial_timeout has passed, naming the endpoints.
func TestStoreUnreachableAtStart(t *testing.T) {
	endpoint := "http://" + cluster.FreePort(t) // nothing listens there
	cfg, err := config.Parse([]byte(baseConfig))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Gateway.StateDir = t.TempDir()
	cfg.Gateway.Store = config.Store{Kind: config.StoreEtcd, Endpoints: []string{endpoint}, Prefix: "/tlgate/", DialTimeout: config.D(300 * time.Millisecond)}
	start := time.Now()
	gw, err := gateway.Start(context.Background(), cfg, gateway.Options{Logger: zerolog.Nop()})
	took := time.Since(start)
	if err == nil {
		_ = gw.Close(context.Background())
		t.Fatal("the gateway started without its store")
	}
	if !strings.Contains(err.Error(), endpoint) || !strings.Contains(err.Error(), "dial_timeout") {
		t.Fatalf("error %q does not name the endpoint %s and dial_timeout", err, endpoint)
	}
	if took < 300*time.Millisecond || took > 5*time.Second {
		t.Fatalf("refused after %v, want after dial_timeout (300ms) and promptly", took)
	}
	t.Logf("refused after %v: %v", took.Round(time.Millisecond), err)
}

// TestStoredInvalidTableRefused: a table written to etcd by hand that
// does not validate is refused by every replica, which keeps serving and
// routing by the table in force; a PUT with that table's ETag replaces it.
func TestStoredInvalidTableRefused(t *testing.T) {
	c := cluster.StartEtcd(t, 1)
	f := newFleet(t, c, 2, nil, engineConfigs(0))
	cli := etcdClient(t, c.Endpoints())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/tlgate/routes", `{"epoch":9,"routes":[{"model":"smol","backends":[{"model":"","weight":1}]}]}`); err != nil {
		t.Fatal(err)
	}
	// Replica A takes the refused write's revision as seen: a PUT with the
	// ETag in force goes through once it has. Until then, and after, both
	// serve and route by the table in force.
	f.replaceStored(t)
}

// TestReplicasPutAfterPutElsewhere: the ETag a PUT on one replica
// answered is good at once on another, even before that one's watch has
// brought the write: a mismatch rereads the store before it is a 412. A
// route just added on one replica can be drained on another likewise.
func TestReplicasPutAfterPutElsewhere(t *testing.T) {
	f := newFleet(t, cluster.StartEtcd(t, 1), 2, nil, nil)
	etag := `"1"`
	for i := range 20 {
		r := f.putRoutes(i%2, etag, routesBody("m-"+strconv.Itoa(i)))
		if r.Status != 200 {
			t.Fatalf("PUT %d on replica %d with the ETag the other answered (%s): %d %s", i, i%2, etag, r.Status, r.Body)
		}
		etag = r.Header.Get("ETag")
	}
	if etag != `"21"` {
		t.Fatalf("last ETag %s, want \"21\"", etag)
	}
	// A stale ETag is still a 412, naming the stored one.
	if r := f.putRoutes(0, `"20"`, routesBody("late")); r.Status != http.StatusPreconditionFailed || r.Header.Get("ETag") != `"21"` {
		t.Fatalf("stale PUT: %d ETag %s %s", r.Status, r.Header.Get("ETag"), r.Body)
	}
	// A route added on one replica can be drained on another at once.
	for i := range 10 {
		route := "fresh-" + strconv.Itoa(i)
		r := f.putRoutes(i%2, etag, `{"routes":[{"model":"`+route+`","backends":[{"model":"big","weight":1}]}]}`)
		if r.Status != 200 {
			t.Fatalf("PUT of %s: %d %s", route, r.Status, r.Body)
		}
		etag = r.Header.Get("ETag")
		d := f.do("POST", f.Replicas[1-i%2].URL+"/admin/v1/models/"+route+":drain", "")
		if d.Status != http.StatusAccepted || !strings.Contains(string(d.Body), `"drained":["big"]`) {
			t.Fatalf("drain of %s on the other replica: %d %s", route, d.Status, d.Body)
		}
	}
}

// TestStoredTableDeletedByHand: a route table deleted from etcd by hand
// leaves every replica on the table in force, and a PUT with that table's
// ETag stores one again (not a 412 naming ETag 0 for ever), which every
// replica then takes.
func TestStoredTableDeletedByHand(t *testing.T) {
	c := cluster.StartEtcd(t, 1)
	f := newFleet(t, c, 2, nil, engineConfigs(0))
	cli := etcdClient(t, c.Endpoints())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Delete(ctx, "/tlgate/routes"); err != nil {
		t.Fatal(err)
	}
	f.replaceStored(t)
}

// replaceStored waits for a PUT on replica 0, with the ETag of the table
// in force ("1"), to replace what etcd holds (which the replicas did not
// install), both replicas serving and routing by the table in force
// until then; then replica 1 takes the new table.
func (f *fleet) replaceStored(t *testing.T) {
	t.Helper()
	var r cluster.Reply
	cluster.Eventually(t, 5*time.Second, func() bool {
		for i := range f.Replicas {
			if etag, _ := f.getRoutes(i); etag != `"1"` {
				t.Fatalf("replica %d serves ETag %s, want the table in force \"1\"", i, etag)
			}
			if got := f.routedTo(i, "smol"); got != "smol-v3-a" {
				t.Fatalf("replica %d routes smol to %q, want smol-v3-a", i, got)
			}
		}
		r = f.putRoutes(0, `"1"`, routesBody("smol-v4"))
		return r.Status == 200
	}, "a PUT on A replacing the stored table (last: %d %s)", r.Status, r.Body)
	f.waitETag(1, `"2"`, 5*time.Second)
	cluster.Eventually(t, 5*time.Second, func() bool { return f.routedTo(1, "smol") == "smol-v4-a" }, "B to route by the table that replaced it")
}
