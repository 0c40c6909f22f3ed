package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
)

// bands returns the router's queue bands of model m.
func (c *cluster) bands() []router.QueueBand {
	res, err := c.gw.System().Root.RequestFuture(c.gw.Router, &router.ListWorkers{}, 2*time.Second).Result()
	if err != nil {
		return nil
	}
	return res.(*router.WorkersResult).Bands["m"]
}

// TestPriorityHeaderCappedByKey: through a real gateway, x-tlgate-priority
// is honoured up to the key's max_priority, a key without one cannot raise
// its requests with it, and the queue serves the bands highest first: with
// the engine's one slot taken, "capped" (max_priority 0) asking 10 waits in
// band 0, "plain" (no max) asking 7 in band 0 too, "vip" (max_priority 10)
// asking 5 and 20 in bands 5 and 10; the engine then sees vip's 20, vip's
// 5, capped's, plain's. A malformed header, or one sent twice, is a 400
// naming it.
func TestPriorityHeaderCappedByKey(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{
		withKeys(config.APIKey{Name: "capped", Key: "key-capped", Scopes: []string{"inference"}, MaxPriority: intPtr(0)},
			config.APIKey{Name: "plain", Key: "key-plain", Scopes: []string{"inference"}},
			config.APIKey{Name: "vip", Key: "key-vip", Scopes: []string{"inference"}, MaxPriority: intPtr(10)}),
		overloadCfg(func(a *config.Admission, _ *config.Ejection) {
			a.Enabled, a.EngineConcurrency, a.QueueSize = true, map[string]int{"f": 1}, 16
		})})
	f := newGatedEngine()
	c.addFake("f", "m", f.handler)
	t.Cleanup(f.open)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prio := func(p int) http.Header { return http.Header{"X-Tlgate-Priority": {fmt.Sprint(p)}} }
	out := make(chan overloadReply, 8)
	go func() { out <- c.overloadSendWith(ctx, "key-plain", "hold", nil) }()
	eventually(t, 10*time.Second, func() bool { return f.holding() == 1 }, "the engine holds the first request")
	for i, s := range []struct {
		key, id string
		p       int
	}{{"key-capped", "capped-10", 10}, {"key-plain", "plain-7", 7}, {"key-vip", "vip-5", 5}, {"key-vip", "vip-20", 20}} {
		go func() { out <- c.overloadSendWith(ctx, s.key, s.id, prio(s.p)) }()
		eventually(t, 10*time.Second, func() bool { return c.queued() == i+1 }, "%s queued (queued %d)", s.id, c.queued())
	}
	got := fmt.Sprint(c.bands())
	if want := "[{10 vip 1} {5 vip 1} {0 capped 1} {0 plain 1}]"; got != want {
		t.Errorf("bands %s, want %s", got, want)
	}
	f.open()
	for range 5 {
		if r := <-out; r.status != http.StatusOK {
			t.Errorf("%s: %+v", r.id, r)
		}
	}
	if got, want := strings.Join(f.order(), " "), "hold vip-20 vip-5 capped-10 plain-7"; got != want {
		t.Errorf("the engine saw %q, want %q", got, want)
	}

	for _, tc := range []struct {
		name string
		h    http.Header
		want string
	}{
		{"not a number", http.Header{"X-Tlgate-Priority": {"high"}}, `The X-Tlgate-Priority header must be an integer from -1000000 to 1000000, got "high".`},
		{"twice", http.Header{"X-Tlgate-Priority": {"1", "2"}}, "The X-Tlgate-Priority header was sent 2 times; send it once."},
		{"objective zero", http.Header{"X-Slo-Ttft-Ms": {"0"}}, `The X-Slo-Ttft-Ms header must be a whole number of milliseconds from 1 to 3600000, got "0".`},
		{"fairness id with a space", http.Header{"X-Tlgate-Fairness-Id": {"a b"}}, `The X-Tlgate-Fairness-Id header must be 1 to 128 printable ASCII characters without spaces, got "a b".`},
	} {
		b, _ := json.Marshal(map[string]any{"model": "m", "prompt": "hello", "max_tokens": 2})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/completions", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = tc.h
		req.Header.Set("Authorization", "Bearer key-plain")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct{ Message, Code string }
		}
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusBadRequest || e.Error.Code != "invalid_request" || e.Error.Message != tc.want {
			t.Errorf("%s: %d %+v (%v), want 400 invalid_request %q", tc.name, resp.StatusCode, e.Error, err, tc.want)
		}
	}
}

func intPtr(n int) *int { return &n }

// TestObjectiveRefusedOnEnginesTTFT: the engines' recent time to first
// token counts in an objective's estimate. Once an answer's first byte
// took 200 ms or more, a request with a 50 ms objective that would have to
// wait for the engine's one slot is refused at once, 429
// objective_unreachable, instead of waiting for a slot that cannot serve
// it in time.
func TestObjectiveRefusedOnEnginesTTFT(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{overloadCfg(func(a *config.Admission, _ *config.Ejection) {
		a.Enabled, a.EngineConcurrency, a.QueueSize = true, map[string]int{"f": 1}, 16
	})})
	var n atomic.Int32
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	c.addFake("f", "m", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if n.Add(1) == 1 {
			time.Sleep(200 * time.Millisecond) // the first answer's first byte comes no sooner
		} else {
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" hi","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}`)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r := c.overloadSendWith(ctx, "", "slow", nil); r.status != http.StatusOK {
		t.Fatalf("slow: %+v", r)
	}
	out := make(chan overloadReply, 1)
	go func() { out <- c.overloadSendWith(ctx, "", "hold", nil) }()
	eventually(t, 10*time.Second, func() bool { return n.Load() == 2 }, "the engine holds the second request")
	// Refused on arrival, for the engines' TTFT: not once its objective
	// passed in the queue.
	r := c.post("/v1/completions", "", map[string]any{"model": "m", "prompt": "hello", "max_tokens": 2}, "X-Slo-Ttft-Ms", "50")
	msg := string(r.body)
	if r.status != http.StatusTooManyRequests || errorCode(t, r.body) != "objective_unreachable" ||
		strings.Contains(msg, "waited") || strings.Contains(msg, " 0s of the engines' recent time to first token") {
		t.Fatalf("hurried: %d %s, want 429 objective_unreachable on arrival, for the engines' recent TTFT", r.status, msg)
	}
	release()
	if r := <-out; r.status != http.StatusOK {
		t.Fatalf("hold: %+v", r)
	}
}
