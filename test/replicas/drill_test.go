package replicas

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// drillResult is one request of the drill.
type drillResult struct {
	client, replica int
	start, end      time.Time
	status          int
	err             error
}

// TestDrillKillReplicaUnderLoad: three replicas under load from clients
// that each start on one replica; one replica is killed (its requests in
// flight cut off). A client whose request could not reach the dead
// replica sends it to the next one; a request cut off in flight is lost.
// The drill passes when the only requests lost were in flight on the dead
// replica when it died, every other request was answered 200, and the
// survivors keep the shared table and take writes.
func TestDrillKillReplicaUnderLoad(t *testing.T) {
	f := newFleet(t, cluster.StartEtcd(t, 1), 3, nil, engineConfigs(5*time.Millisecond))
	if r := f.putRoutes(0, `"1"`, routesBody("smol-v4")); r.Status != 200 {
		t.Fatalf("PUT on A: %d %s", r.Status, r.Body)
	}
	for i := range f.Replicas {
		f.waitETag(i, `"2"`, 5*time.Second)
	}
	urls := make([]string, len(f.Replicas))
	for i, r := range f.Replicas {
		urls[i] = r.URL
	}
	const clients = 6
	const dead = 0
	var (
		mu       sync.Mutex
		results  []drillResult
		inflight [3]atomic.Int32
		after    atomic.Int32 // requests answered after the kill
		killed   atomic.Bool
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for k := range clients {
		wg.Go(func() {
			// No keep-alive: a connection opened before the kill is not
			// reused after it (that request would look cut off in flight).
			hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
			defer hc.CloseIdleConnections()
			at := k % len(urls)
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf(`{"model":"smol","prompt":"client %d request %d","max_tokens":20}`, k, seq)
				for {
					res := drillSend(ctx, hc, urls[at], body, &inflight[at])
					res.client, res.replica = k, at
					mu.Lock()
					results = append(results, res)
					mu.Unlock()
					if res.err == nil && res.status == 200 {
						if killed.Load() {
							after.Add(1)
						}
						break
					}
					at = (at + 1) % len(urls) // switch replicas
					if !neverArrived(res.err) {
						break // lost: it was in flight
					}
				}
			}
		})
	}
	cluster.Eventually(t, 10*time.Second, func() bool { return inflight[dead].Load() >= 2 }, "two requests in flight on the replica to kill")
	f.Replicas[dead].Kill()
	killedAt := time.Now()
	killed.Store(true)
	cluster.Eventually(t, 20*time.Second, func() bool { return after.Load() >= 5*clients }, "%d requests answered after the kill", 5*clients)
	close(stop)
	wg.Wait()

	lost := 0
	for _, r := range results {
		ok := r.err == nil && r.status == 200
		switch {
		case ok:
		case r.replica != dead:
			t.Errorf("client %d: request on surviving replica %d failed: %d %v", r.client, r.replica, r.status, r.err)
		case neverArrived(r.err):
			// It never reached the dead replica and was sent again.
		case r.start.After(killedAt):
			t.Errorf("client %d: request sent to the dead replica after its death was cut off in flight: %v", r.client, r.err)
		default:
			lost++
		}
	}
	t.Logf("%d requests, %d lost in flight on the killed replica, %d answered after the kill", len(results), lost, after.Load())
	if lost == 0 {
		t.Log("no request was cut off in flight this run (the kill landed between requests)")
	}
	// The survivors keep the shared table and take writes.
	for i := range f.Replicas {
		if i == dead {
			continue
		}
		if etag, _ := f.getRoutes(i); etag != `"2"` {
			t.Errorf("replica %d serves ETag %s after the kill, want \"2\"", i, etag)
		}
	}
	if r := f.putRoutes(1, `"2"`, routesBody("smol-v3")); r.Status != 200 {
		t.Fatalf("PUT on B after the kill: %d %s", r.Status, r.Body)
	}
	f.waitETag(2, `"3"`, 5*time.Second)
}

// drillSend posts one completion to url, counting it in flight there.
func drillSend(ctx context.Context, hc *http.Client, url, body string, inflight *atomic.Int32) drillResult {
	res := drillResult{start: time.Now()}
	inflight.Add(1)
	defer inflight.Add(-1)
	req, err := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		res.err = err
		return res
	}
	req.Header.Set("Authorization", "Bearer "+opsKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		res.status = resp.StatusCode
	}
	res.err, res.end = err, time.Now()
	return res
}

// neverArrived reports whether a request failed before reaching the
// server: the dial was refused.
func neverArrived(err error) bool {
	var op *net.OpError
	return err != nil && errors.As(err, &op) && op.Op == "dial"
}
