package test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tlgate/tlgate/internal/runtime/gateway"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// TestEvictedWorkerSeriesLeaveMetrics: a worker evicted while requests
// were in flight on it no longer shows in /metrics: neither its
// tlgate_inflight_requests series (at the last scrape's value before the
// fix, forever) nor its tlgate_attempts_total, and its place under the
// worker label's cap is free again.
func TestEvictedWorkerSeriesLeaveMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := newClusterGateway(t, "", []clusterOpt{keys()}, nil, func(o *gateway.Options) { o.Registry, o.Gatherer, o.RequestHooks = reg, reg, nil })
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	conn, err := grpc.NewClient(c.gw.RegistryAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := controlv1.NewWorkerRegistryClient(conn)
	st := &controlv1.WorkerStatus{WorkerId: "w-hang", Model: "m", Role: controlv1.Role_ROLE_UNIFIED,
		HttpAddress: strings.TrimPrefix(srv.URL, "http://"), KvTotalBlocks: 100, KvFreeBlocks: 100, KvBlockTokens: 16}
	stop := make(chan struct{})
	var beats sync.WaitGroup
	beats.Add(1)
	go func() {
		defer beats.Done()
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = cl.Heartbeat(ctx, st)
			cancel()
			select {
			case <-stop:
				return
			case <-tk.C:
			}
		}
	}()
	c.waitRoutable("w-hang")
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":50,"stream":true}`)
			req, _ := http.NewRequest(http.MethodPost, c.url+"/v1/completions", b)
			req.Header.Set("Authorization", "Bearer key-plain")
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				var buf [4096]byte
				for {
					if _, err := resp.Body.Read(buf[:]); err != nil {
						break
					}
				}
				resp.Body.Close()
			}
		}()
	}
	eventually(t, 5*eventuallyUnit, func() bool {
		return strings.Contains(string(c.get("/metrics", "").body), `tlgate_inflight_requests{worker="w-hang"} 3`)
	}, "3 in flight on w-hang")
	close(stop) // the engine stops heartbeating and dies
	beats.Wait()
	srv.CloseClientConnections()
	close(release)
	wg.Wait()
	eventually(t, 5*eventuallyUnit, func() bool { return len(c.workers()) == 0 }, "w-hang evicted")
	body := string(c.get("/metrics", "").body)
	for _, series := range []string{`tlgate_inflight_requests{worker="w-hang"}`, `worker="w-hang"`} {
		if strings.Contains(body, series) {
			t.Errorf("evicted worker w-hang still exported: %s", series)
		}
	}
}
