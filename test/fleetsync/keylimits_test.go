package fleetsync

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// limitedKey is the secret of the key TestFleetWideKeyLimit limits.
const limitedKey = "fleetsync-limited-key"

// keyShare is replica i's part of the limited key's requests per minute,
// as its /metrics shows it (-1 when it shows none).
func (f *fleet) keyShare(i int) float64 {
	resp, err := f.Client.Get(f.Replicas[i].URL + "/metrics") // the scrape refreshes the gauges
	if err != nil {
		return -1
	}
	resp.Body.Close()
	return f.Metric(i, "tlgate_key_limit_share", "key", "limited", "limit", "requests")
}

// TestFleetWideKeyLimit: three replicas with fleet sync on (embedded
// NATS) split a key's requests_per_minute: each holds a third while none
// is asked; hammered through all three at far more than the limit they
// grant together at most what one gateway would over the time since they
// started (their buckets start empty), plus the stated overshoot (each
// replica's first two load intervals at the whole limit's rate), where each
// counting alone would grant three times as much; and when only one
// replica is asked, the split follows: it comes to hold most of the limit,
// the others' parts fall, and the parts never add up to more than it.
func TestFleetWideKeyLimit(t *testing.T) {
	const (
		limit        = 600 // requests per minute: 10 a second
		loadInterval = 200 * time.Millisecond
	)
	begin := time.Now()
	f := newTweakedFleet(t, cluster.StartNATS(t), "least_outstanding", 3, engineConfigs(2, time.Millisecond), func(g *config.Gateway) {
		g.APIKeys = append(g.APIKeys, config.APIKey{Name: "limited", Key: limitedKey, Scopes: []string{"inference"}, RequestsPerMinute: limit})
		g.Sync.LoadInterval = config.D(loadInterval)
	})
	cluster.Eventually(t, 15*time.Second, func() bool {
		return f.keyShare(0) == limit/3 && f.keyShare(1) == limit/3 && f.keyShare(2) == limit/3
	}, "each replica to hold a third of the limit (%v %v %v)", f.keyShare(0), f.keyShare(1), f.keyShare(2))

	send := func(ctx context.Context, i int) int {
		body := fmt.Sprintf(`{"model":%q,"prompt":"limited","max_tokens":1}`, model)
		r := f.Do(ctx, "POST", f.Replicas[i].URL+"/v1/completions", body, "Authorization", "Bearer "+limitedKey)
		if r.Err != nil {
			return 0
		}
		return r.Status
	}
	var granted, refused, other atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	var wg sync.WaitGroup
	for c := range 12 {
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				switch send(ctx, (c+n)%3) {
				case http.StatusOK:
					granted.Add(1)
				case http.StatusTooManyRequests:
					refused.Add(1)
				case 0:
				default:
					other.Add(1)
				}
			}
		})
	}
	wg.Wait()
	cancel()
	elapsed := time.Since(begin)
	// What one gateway grants since the replicas started with empty
	// buckets, and the stated overshoot: each replica at the whole
	// limit's rate for two load intervals (its first, and the one its
	// peers take to cut theirs), and a request per replica for the
	// rounding of the refill.
	bound := limit*elapsed.Minutes() + 3*limit*(2*loadInterval).Minutes() + 3
	t.Logf("granted %d, refused %d in %v; bound %.1f (counting alone each replica would grant its own %d a minute)",
		granted.Load(), refused.Load(), elapsed.Round(time.Millisecond), bound, limit)
	if other.Load() > 0 {
		t.Errorf("%d answers neither 200 nor 429", other.Load())
	}
	if float64(granted.Load()) > bound {
		t.Fatalf("the fleet granted %d, more than %.1f", granted.Load(), bound)
	}
	if granted.Load() < 10 || refused.Load() == 0 {
		t.Fatalf("granted %d and refused %d: the limit should bind, and still grant", granted.Load(), refused.Load())
	}

	// Only replica 0 is asked: the split follows its demand.
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				send(ctx, 0)
				time.Sleep(10 * time.Millisecond)
			}
		}
	}()
	cluster.Eventually(t, 15*time.Second, func() bool { return f.keyShare(0) >= 0.8*limit },
		"replica 0, the only one asked, to hold most of the limit (now %v)", f.keyShare(0))
	close(stop)
	<-done
	if s := f.keyShare(0) + f.keyShare(1) + f.keyShare(2); s > limit {
		t.Fatalf("the replicas' parts add up to %v, over the limit %d", s, limit)
	}
}
