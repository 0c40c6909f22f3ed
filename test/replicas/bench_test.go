package replicas

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// BenchmarkPutToRouteChange times 100 route table changes: from sending a
// PUT to replica A until replica B's router routes by the new table
// (put_to_b), and from A's 200 until then (after_200). Run it once:
//
//	go test -run '^$' -bench PutToRouteChange -benchtime 1x ./test/replicas/
func BenchmarkPutToRouteChange(b *testing.B) {
	const changes = 100
	f := newFleet(b, startEtcd(b, 1), 2, nil, nil)
	gwB := f.replicas[1].gw
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
			if r.status != 200 {
				b.Fatalf("PUT: %d %s", r.status, r.body)
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
	c := startEtcd(b, 1)
	for _, kind := range []string{config.StoreFile, config.StoreEtcd} {
		b.Run(kind, func(b *testing.B) {
			cfg, err := config.Parse([]byte(baseConfig))
			if err != nil {
				b.Fatal(err)
			}
			cfg.Gateway.StateDir = b.TempDir()
			if kind == config.StoreEtcd {
				cfg.Gateway.Store = config.Store{Kind: config.StoreEtcd, Endpoints: c.Endpoints(), Prefix: "/bench/", DialTimeout: config.D(5 * time.Second)}
			}
			reg := prometheus.NewRegistry()
			gw, err := gateway.Start(context.Background(), cfg, gateway.Options{Logger: zerolog.Nop(), Registry: reg, Gatherer: reg})
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = gw.Close(ctx)
			}()
			e, err := enginesim.Start(context.Background(), enginesim.Config{ID: "smol-v3-a", Model: "smol-v3", Role: enginesim.RoleUnified,
				Gateways: []string{gw.RegistryAddr()}, HeartbeatInterval: 100 * time.Millisecond, Logger: zerolog.Nop()})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Kill()
			f := &fleet{t: b, replicas: []*replica{{gw: gw, url: "http://" + gw.HTTPAddr(), reg: reg}}, client: &http.Client{Transport: &http.Transport{}}}
			defer f.client.CloseIdleConnections()
			f.waitWorker(0, "smol-v3-a", func(w router.WorkerView) bool { return w.Routable }, "routable")
			url := f.replicas[0].url + "/v1/completions"
			body := `{"model":"smol","prompt":"hi","max_tokens":1}`
			b.ResetTimer()
			for range b.N {
				req, _ := http.NewRequest("POST", url, strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+opsKey)
				req.Header.Set("Content-Type", "application/json")
				resp, err := f.client.Do(req)
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
