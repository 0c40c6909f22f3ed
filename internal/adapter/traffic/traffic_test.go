package traffic

import (
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"
)

// clock is a settable fake clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// t0 is aligned on a 5 s bucket.
var t0 = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

func newRec(cfg Config) (*Recorder, *clock) {
	c := &clock{t: t0}
	cfg.Now = c.now
	return New(cfg), c
}

func model(t *testing.T, s Snapshot, name string) Model {
	t.Helper()
	for _, m := range s.Models {
		if m.Model == name {
			return m
		}
	}
	t.Fatalf("model %q not in snapshot (%d models)", name, len(s.Models))
	return Model{}
}

func ms(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

func TestBucketsAndWindow(t *testing.T) {
	type event struct {
		at    time.Duration // since t0
		model string
		code  string
	}
	tests := []struct {
		name     string
		events   []event
		snapAt   time.Duration
		model    string
		requests map[int]uint32 // bucket index -> count; others zero
		absent   bool
	}{
		{
			name:     "one bucket",
			events:   []event{{0, "a", ""}, {time.Second, "a", ""}, {4 * time.Second, "a", ""}},
			snapAt:   4 * time.Second,
			model:    "a",
			requests: map[int]uint32{179: 3},
		},
		{
			name:     "consecutive buckets",
			events:   []event{{0, "a", ""}, {5 * time.Second, "a", ""}, {6 * time.Second, "a", ""}, {12 * time.Second, "a", ""}},
			snapAt:   12 * time.Second,
			model:    "a",
			requests: map[int]uint32{177: 1, 178: 2, 179: 1},
		},
		{
			name:     "ages out after the window",
			events:   []event{{0, "a", ""}, {10 * time.Minute, "a", ""}},
			snapAt:   15 * time.Minute,
			model:    "a",
			requests: map[int]uint32{179 - 60: 1},
		},
		{
			name:   "a model unseen for a window is left out",
			events: []event{{0, "a", ""}},
			snapAt: 15 * time.Minute,
			model:  "a",
			absent: true,
		},
		{
			name:     "a slot reused after a lap is reset",
			events:   []event{{0, "a", ""}, {0, "a", ""}, {15 * time.Minute, "a", ""}},
			snapAt:   15 * time.Minute,
			model:    "a",
			requests: map[int]uint32{179: 1},
		},
		{
			name:     "an empty model is NoRoute",
			events:   []event{{0, "", "model_not_found"}},
			snapAt:   0,
			model:    NoRoute,
			requests: map[int]uint32{179: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, c := newRec(Config{})
			for _, e := range tc.events {
				c.t = t0.Add(e.at)
				r.Request(e.model, e.code, time.Millisecond, 0)
			}
			c.t = t0.Add(tc.snapAt)
			s := r.Snapshot()
			if s.Buckets != 180 || s.BucketSeconds != 5 {
				t.Fatalf("buckets %d × %vs, want 180 × 5s", s.Buckets, s.BucketSeconds)
			}
			if want := c.t.Truncate(5 * time.Second).Add(-179 * 5 * time.Second); !s.Start.Equal(want) {
				t.Fatalf("start %v, want %v", s.Start, want)
			}
			if tc.absent {
				if len(s.Models) != 0 {
					t.Fatalf("models %v, want none", s.Models)
				}
				return
			}
			m := model(t, s, tc.model)
			for i, got := range m.Requests {
				if got != tc.requests[i] {
					t.Errorf("requests[%d] = %d, want %d", i, got, tc.requests[i])
				}
			}
		})
	}
}

func TestRPS(t *testing.T) {
	r, c := newRec(Config{})
	for i := 0; i < 10; i++ {
		r.Request("a", "", time.Millisecond, 0)
	}
	c.add(5 * time.Second)
	for i := 0; i < 4; i++ {
		r.Request("a", "", time.Millisecond, 0)
	}
	c.add(2 * time.Second) // 2 s into the current bucket
	m := model(t, r.Snapshot(), "a")
	if got := m.RPS[178]; got != 2 {
		t.Errorf("full bucket rps %v, want 10/5 = 2", got)
	}
	if got := m.RPS[179]; got != 2 {
		t.Errorf("partial bucket rps %v, want 4 over 2 s elapsed = 2", got)
	}
}

func TestQuantiles(t *testing.T) {
	tests := []struct {
		name     string
		samples  []time.Duration
		p50, p99 float64 // ms; NaN: null
	}{
		{name: "none", p50: math.NaN(), p99: math.NaN()},
		{name: "one", samples: []time.Duration{10 * time.Millisecond}, p50: 10, p99: 10},
		{name: "tail", samples: append(repeat(5*time.Millisecond, 98), 500*time.Millisecond, 500*time.Millisecond), p50: 5, p99: 500},
		{name: "tiny", samples: []time.Duration{time.Microsecond}, p50: 0.1, p99: 0.1},
		{name: "huge", samples: []time.Duration{time.Hour}, p50: float64(binValue(histBins-1)) / 1e6, p99: float64(binValue(histBins-1)) / 1e6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newRec(Config{})
			r.Failover("a") // the model exists even without samples
			for _, d := range tc.samples {
				r.Request("a", "", d, d)
			}
			m := model(t, r.Snapshot(), "a")
			check := func(what string, got *float64, want float64) {
				t.Helper()
				g := ms(got)
				switch {
				case math.IsNaN(want) && !math.IsNaN(g):
					t.Errorf("%s = %v, want null", what, g)
				case !math.IsNaN(want) && (math.IsNaN(g) || math.Abs(g-want)/want > 0.13):
					t.Errorf("%s = %v, want %v ±13%%", what, g, want)
				}
			}
			check("latency p50", m.LatencyP50[179], tc.p50)
			check("latency p99", m.LatencyP99[179], tc.p99)
			check("ttft p50", m.TTFTP50[179], tc.p50)
			check("total latency p99", m.Totals.LatencyP99, tc.p99)
			check("total ttft p50", m.Totals.TTFTP50, tc.p50)
		})
	}
}

func repeat(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

func TestTTFTOnlyWhenPositive(t *testing.T) {
	r, _ := newRec(Config{})
	r.Request("a", "", 3*time.Millisecond, 0)
	m := model(t, r.Snapshot(), "a")
	if m.TTFTP50[179] != nil || m.Totals.TTFTP50 != nil {
		t.Fatalf("ttft recorded for a request without a first byte")
	}
	if m.LatencyP50[179] == nil {
		t.Fatalf("latency not recorded")
	}
}

func TestErrorCodes(t *testing.T) {
	r, c := newRec(Config{})
	r.Request("a", "no_capacity", time.Millisecond, 0)
	r.Request("a", "no_capacity", time.Millisecond, 0)
	r.Request("a", "", time.Millisecond, 0)
	c.add(5 * time.Second)
	for i := 0; i < 12; i++ { // 12 distinct codes: 7 kept, 5 as other
		r.Request("a", fmt.Sprintf("c%02d", i), time.Millisecond, 0)
	}
	r.Request("a", "c00", time.Millisecond, 0) // a kept code still counts as itself
	m := model(t, r.Snapshot(), "a")
	if got := m.Errors["no_capacity"]; got[178] != 2 || got[179] != 0 {
		t.Errorf("no_capacity series ends %v, want [2 0]", got[178:])
	}
	if got := m.Errors["c00"][179]; got != 2 {
		t.Errorf("c00 = %d, want 2", got)
	}
	if got := m.Errors[OtherCode][179]; got != 5 {
		t.Errorf("other = %d, want 5", got)
	}
	if len(m.Errors) != 1+7+1 {
		t.Errorf("%d codes, want 9: %v", len(m.Errors), keys(m.Errors))
	}
	if m.Totals.Errors != 2+13 || m.Totals.Requests != 3+13 || m.Totals.ErrorsByCode["no_capacity"] != 2 {
		t.Errorf("totals %+v", m.Totals)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestFailoversAndCascades(t *testing.T) {
	r, c := newRec(Config{})
	r.Failover("a")
	r.Cascade("auto", true)
	r.Cascade("auto", false)
	c.add(5 * time.Second)
	r.Cascade("auto", false)
	s := r.Snapshot()
	a, auto := model(t, s, "a"), model(t, s, "auto")
	if a.Failovers[178] != 1 || a.Totals.Failovers != 1 {
		t.Errorf("failovers %v", a.Failovers[178:])
	}
	if auto.CascadeAccepted[178] != 1 || auto.CascadeEscalated[178] != 1 || auto.CascadeEscalated[179] != 1 {
		t.Errorf("cascade accepted %v escalated %v", auto.CascadeAccepted[178:], auto.CascadeEscalated[178:])
	}
	if auto.Totals.CascadeAccepted != 1 || auto.Totals.CascadeEscalated != 2 {
		t.Errorf("cascade totals %+v", auto.Totals)
	}
}

func TestModelCap(t *testing.T) {
	r, c := newRec(Config{MaxModels: 2})
	r.Request("a", "", time.Millisecond, 0)
	r.Request("b", "", time.Millisecond, 0)
	r.Request("c", "", time.Millisecond, 0) // over the cap
	r.Request("d", "", time.Millisecond, 0)
	s := r.Snapshot()
	if len(s.Models) != 3 {
		t.Fatalf("models %v, want a, b and %s", names(s), OtherModel)
	}
	if got := model(t, s, OtherModel).Totals.Requests; got != 2 {
		t.Errorf("%s has %d requests, want 2", OtherModel, got)
	}
	// b stays busy; a goes quiet for a whole window and gives its place up.
	for i := 0; i < 180; i++ {
		c.add(5 * time.Second)
		r.Request("b", "", time.Millisecond, 0)
	}
	r.Request("e", "", time.Millisecond, 0)
	s = r.Snapshot()
	if got := names(s); fmt.Sprint(got) != "[b e]" {
		t.Fatalf("models %v, want [b e]", got)
	}
}

func names(s Snapshot) []string {
	var out []string
	for _, m := range s.Models {
		out = append(out, m.Model)
	}
	return out
}

func TestSmallConfig(t *testing.T) {
	r, c := newRec(Config{Width: time.Second, Buckets: 3})
	if r.Window() != 3*time.Second {
		t.Fatalf("window %v", r.Window())
	}
	for i := 0; i < 5; i++ {
		r.Request("a", "", time.Millisecond, 0)
		c.add(time.Second)
	}
	c.add(-time.Second)
	m := model(t, r.Snapshot(), "a")
	if fmt.Sprint(m.Requests) != "[1 1 1]" {
		t.Fatalf("requests %v, want [1 1 1]", m.Requests)
	}
}

func TestJSONShape(t *testing.T) {
	r, _ := newRec(Config{Buckets: 2})
	r.Request("a", "no_capacity", 2*time.Millisecond, time.Millisecond)
	b, err := json.Marshal(r.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	m := got["models"].([]any)[0].(map[string]any)
	for _, k := range []string{"model", "requests", "rps", "ttft_p50_ms", "ttft_p99_ms", "latency_p50_ms", "latency_p99_ms", "errors", "failovers", "cascade_accepted", "cascade_escalated", "totals"} {
		if _, ok := m[k]; !ok {
			t.Errorf("model JSON lacks %q: %s", k, b)
		}
	}
	if v := m["latency_p50_ms"].([]any)[0]; v != nil {
		t.Errorf("an empty bucket's quantile is %v, want null", v)
	}
}

func TestConcurrent(t *testing.T) {
	r := New(Config{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				r.Request("a", "", time.Millisecond, time.Millisecond)
				r.Failover("a")
				r.Cascade("a", i%2 == 0)
				if i%100 == 0 {
					_ = r.Snapshot()
				}
			}
		}()
	}
	wg.Wait()
	if got := model(t, r.Snapshot(), "a").Totals.Requests; got != 2000 {
		t.Fatalf("requests %d, want 2000", got)
	}
}

func TestNoAllocOnceSeen(t *testing.T) {
	r := New(Config{})
	r.Request("a", "x", time.Millisecond, time.Millisecond)
	if n := testing.AllocsPerRun(100, func() {
		r.Request("a", "x", time.Millisecond, time.Millisecond)
		r.Failover("a")
		r.Cascade("a", true)
	}); n != 0 {
		t.Fatalf("%v allocations per recording, want 0", n)
	}
}

func BenchmarkRequest(b *testing.B) {
	r := New(Config{})
	for i := 0; i < b.N; i++ {
		r.Request("a", "", time.Millisecond, time.Millisecond)
	}
}

func BenchmarkSnapshot(b *testing.B) {
	r := New(Config{})
	for m := 0; m < 8; m++ {
		r.Request(fmt.Sprint("m", m), "", time.Millisecond, time.Millisecond)
	}
	for i := 0; i < b.N; i++ {
		_ = r.Snapshot()
	}
}
