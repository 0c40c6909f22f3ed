package replicas

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// BenchmarkPutToRouteChange times 100 route table changes: from sending a
// PUT to replica A until replica B's router routes by the new table
// (put_to_b), and from A's 200 until then (after_200). Run it once:
//
//	go test -run '^$' -bench PutToRouteChange -benchtime 1x ./test/replicas/
func BenchmarkPutToRouteChange(b *testing.B) {
	const changes = 100
	f := newFleet(b, cluster.StartEtcd(b, 1), 2, nil, nil)
	gwB := f.Replicas[1].GW
	epochB := func() uint64 {
		res, err := gwB.System().Root.RequestFuture(gwB.Router, &router.ListWorkers{}, time.Second).Result()
		if err != nil {
			return 0
		}
		return res.(*router.WorkersResult).Epoch
	}
	var total, after []time.Duration
	epoch := 1
	for range b.N {
		for range changes {
			start := time.Now()
			r := f.putRoutes(0, `"`+strconv.Itoa(epoch)+`"`, routesBody("m-"+strconv.Itoa(epoch)))
			answered := time.Now()
			if r.Status != 200 {
				b.Fatalf("PUT: %d %s", r.Status, r.Body)
			}
			epoch++
			deadline := start.Add(5 * time.Second)
			for epochB() != uint64(epoch) {
				if time.Now().After(deadline) {
					b.Fatalf("B did not take epoch %d within 5s", epoch)
				}
				time.Sleep(100 * time.Microsecond)
			}
			done := time.Now()
			total = append(total, done.Sub(start))
			after = append(after, done.Sub(answered))
		}
	}
	report(b, "put_to_b", total)
	report(b, "after_200", after)
}

// report adds p50 and p99 (milliseconds) of ds to the benchmark's output.
func report(b *testing.B, name string, ds []time.Duration) {
	slices.Sort(ds)
	q := func(p float64) float64 {
		return float64(ds[min(len(ds)-1, int(p*float64(len(ds))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.50), name+"_p50_ms")
	b.ReportMetric(q(0.99), name+"_p99_ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkRequestPath is one non-streamed completion through a gateway
// whose store is state_dir (file) or etcd: the request path reads the
// router's table in memory either way, so the two should not differ by
// more than the noise.
//
//	go test -run '^$' -bench RequestPath -benchtime 2000x -count 3 ./test/replicas/
func BenchmarkRequestPath(b *testing.B) {
	c := cluster.StartEtcd(b, 1)
	for _, kind := range []string{config.StoreFile, config.StoreEtcd} {
		b.Run(kind, func(b *testing.B) {
			cfg, err := config.Parse([]byte(baseConfig))
			if err != nil {
				b.Fatal(err)
			}
			if kind == config.StoreEtcd {
				cfg.Gateway.Store = config.Store{Kind: config.StoreEtcd, Endpoints: c.Endpoints(), Prefix: "/bench/", DialTimeout: config.D(5 * time.Second)}
			}
			f := cluster.New(b, opsKey)
			f.StartReplica(cfg)
			f.StartEngines([]enginesim.Config{{ID: "smol-v3-a", Model: "smol-v3", Role: enginesim.RoleUnified}})
			url := f.Replicas[0].URL + "/v1/completions"
			body := `{"model":"smol","prompt":"hi","max_tokens":1}`
			b.ResetTimer()
			for range b.N {
				req, _ := http.NewRequest("POST", url, strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+opsKey)
				req.Header.Set("Content-Type", "application/json")
				resp, err := f.Client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatal(fmt.Sprint("status ", resp.StatusCode))
				}
			}
		})
	}
}
