package test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// TestRegistryFloodKeepsRouting: thousands of distinct worker ids
// heartbeated as fast as one client can, over real gRPC, must neither evict
// the real workers (heartbeating every 200 ms, evicted 3 s after their
// last) nor stop routing: every request sent during the flood is answered
// 200 within its 5 s deadline, and /readyz stays 200. It runs with the
// per-peer rate limit (the default) and without it, when max_workers and
// the bound on heartbeats waiting for the registry must carry it alone.
func TestRegistryFloodKeepsRouting(t *testing.T) {
	for _, tc := range []struct {
		name string
		rate float64
	}{{"peer rate limit", 200}, {"no peer rate limit", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, "", []clusterOpt{drillGateway(func(g *config.Gateway) {
				g.RegistryPeerRate = tc.rate
				// Heartbeats every 200 ms, evicted after 3 s without one:
				// a machine busy with other work delays a heartbeat by a
				// fraction of that, a registry minutes behind by far more.
				g.HeartbeatMissLimit = 15
			})}, enginesim.Config{ID: "w1", Model: "m"}, enginesim.Config{ID: "w2", Model: "m"})
			floodRegistry(t, c, 5000)
		})
	}
}

func floodRegistry(t *testing.T, c *cluster, ids int) {
	// Evictions of the real workers, seen by a subscriber of the registry
	// (not through the router, whose mailbox is under test).
	var evicted atomic.Int32
	sys := c.gw.System()
	sub := sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if g, ok := ctx.Message().(*registry.WorkerGone); ok && (g.ID == "w1" || g.ID == "w2") {
			evicted.Add(1)
		}
	}))
	t.Cleanup(func() { _ = sys.Root.StopFuture(sub).Wait() })
	sys.Root.Send(c.gw.Registry, &registry.Subscribe{PID: sub})

	// The flood comes from its own address, as an outsider's would: the
	// real engines heartbeat from 127.0.0.1.
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	conn, err := grpc.NewClient(c.gw.RegistryAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := controlv1.NewWorkerRegistryClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var next atomic.Int64
	codesSeen := map[codes.Code]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(ids) || ctx.Err() != nil {
					return
				}
				_, err := client.Heartbeat(ctx, &controlv1.WorkerStatus{
					WorkerId: fmt.Sprintf("flood-%d", i), Model: "flood", HttpAddress: fmt.Sprintf("10.9.%d.%d:8000", i/250, i%250+1),
					Role: controlv1.Role_ROLE_UNIFIED,
				})
				mu.Lock()
				codesSeen[status.Code(err)]++
				mu.Unlock()
			}
		}()
	}
	floodDone := make(chan struct{})
	go func() { wg.Wait(); close(floodDone) }()

	// Meanwhile (and for one TTL after), requests and readiness.
	hc := &http.Client{Timeout: 5 * time.Second}
	var sent, failed int
	var worst time.Duration
	var firstFail string
	ttlAfter := time.Time{}
	for {
		if ttlAfter.IsZero() {
			select {
			case <-floodDone:
				ttlAfter = time.Now().Add(time.Second)
			default:
			}
		} else if time.Now().After(ttlAfter) {
			break
		}
		t0 := time.Now()
		resp, err := hc.Post(c.url+"/v1/completions", "application/json", bytes.NewReader([]byte(`{"model":"m","prompt":"hi","max_tokens":2}`)))
		d := time.Since(t0)
		worst = max(worst, d)
		sent++
		if err != nil || resp.StatusCode != http.StatusOK {
			failed++
			if firstFail == "" {
				var body []byte
				if resp != nil {
					body, _ = io.ReadAll(resp.Body)
				}
				firstFail = fmt.Sprintf("request %d after %v: %v %s", sent, time.Since(start).Round(time.Millisecond), err, body)
			}
		}
		if resp != nil {
			resp.Body.Close()
		}
		if r, err := hc.Get(c.url + "/readyz"); err != nil || r.StatusCode != http.StatusOK {
			failed++
			if firstFail == "" {
				firstFail = fmt.Sprintf("/readyz after %v: %v %v", time.Since(start).Round(time.Millisecond), err, r)
			}
			if r != nil {
				r.Body.Close()
			}
		} else {
			r.Body.Close()
		}
	}
	mu.Lock()
	t.Logf("%d heartbeats in %v: %v; %d requests during it, worst %v, %d failed; real workers evicted %d times",
		ids, time.Since(start).Round(time.Millisecond), codesSeen, sent, worst.Round(time.Millisecond), failed, evicted.Load())
	mu.Unlock()
	if failed > 0 {
		t.Errorf("routing stalled during the flood: %d failures, first %s", failed, firstFail)
	}
	if n := evicted.Load(); n > 0 {
		t.Errorf("the flood evicted the real workers %d times", n)
	}
	c.waitRoutable("w1", "w2")
}
