package test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// histSum is the sum of the observations of histogram name, over all its
// series.
func histSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	s := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				s += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return s
}

// TestStreamTTFBFromArrivalAcrossFailover: a streamed request whose first
// attempt fails (503) before another worker streams its answer reaches its
// client's first byte at least as long after its arrival as the failed
// attempt was held. tlgate_time_to_first_byte_seconds, the console's TTFT
// and the access log's ttfb say so, not the last attempt's own time to its
// first byte. The failing engine answers only when the test releases it,
// after the test saw the request reach it: the gap is at least what the
// test measured, whatever the machine's speed.
func TestStreamTTFBFromArrivalAcrossFailover(t *testing.T) {
	reg := prometheus.NewRegistry()
	logs := &syncBuffer{}
	c := newClusterGateway(t, "", []clusterOpt{keys()}, nil, func(o *gateway.Options) {
		o.Registry, o.Gatherer, o.RequestHooks, o.Logger = reg, reg, nil, zerolog.New(logs)
	})
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	c.addFake("slow", "m", func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		w.WriteHeader(http.StatusServiceUnavailable)
	})

	done := make(chan reply, 1)
	go func() {
		done <- c.post("/v1/completions", "key-plain", map[string]any{"model": "m", "prompt": "hi", "max_tokens": 2, "stream": true},
			"X-Request-Id", "ttfb-1")
	}()
	select {
	case <-arrived: // the only worker: the first attempt is slow's
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the request never reached the slow engine")
	}
	seen := time.Now() // after the request's arrival at the gateway
	c.addFake("fast", "m", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"good\"}]}\n\ndata: [DONE]\n\n")
	})
	time.Sleep(200 * time.Millisecond) // widens the gap; the check holds for any gap
	gap := time.Since(seen)            // before the first byte: the slow attempt still waits
	close(release)
	r := <-done
	if r.status != http.StatusOK {
		t.Fatalf("status %d %s", r.status, r.body)
	}

	var lines []map[string]any
	eventually(t, 5*eventuallyUnit, func() bool { lines = accessLines(t, logs, "ttfb-1"); return len(lines) == 1 }, "the access log line")
	if lines[0]["worker"] != "fast" || lines[0]["attempts"] != float64(2) {
		t.Fatalf("access log: worker %v after %v attempts, want fast after 2", lines[0]["worker"], lines[0]["attempts"])
	}
	if ms, _ := lines[0]["ttfb"].(float64); time.Duration(ms*float64(time.Millisecond)) < gap {
		t.Errorf("access log ttfb %vms, want at least %v (the failed attempt's wait)", lines[0]["ttfb"], gap)
	}
	if got := histSum(t, reg, "tlgate_time_to_first_byte_seconds"); got < gap.Seconds() {
		t.Errorf("tlgate_time_to_first_byte_seconds observed %.3fs, want at least %.3fs", got, gap.Seconds())
	}
	snap := c.gw.Traffic.Snapshot()
	var ttft *float64
	for _, m := range snap.Models {
		if m.Model == "m" {
			ttft = m.Totals.TTFTP99
		}
	}
	// The console's histogram reports a bin's geometric middle, within
	// about 12 % of the samples it holds.
	if ttft == nil || *ttft < 0.85*float64(gap.Milliseconds()) {
		t.Errorf("console TTFT p99 %v ms, want about %v or more", ttft, gap)
	}
}
