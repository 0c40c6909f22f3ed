package loadgen

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestArrivals(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rate     float64
		d        time.Duration
		min, max int // bounds of the count (about ±4 standard deviations)
	}{
		{"no rate", 0, time.Second, 0, 0},
		{"negative rate", -5, time.Second, 0, 0},
		{"no duration", 100, 0, 0, 0},
		{"1000/s for 10s", 1000, 10 * time.Second, 9600, 10400},
		{"50/s for 4s", 50, 4 * time.Second, 144, 256},
		{"0.5/s for 1ms", 0.5, time.Millisecond, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := Arrivals(tc.rate, tc.d, 7)
			if len(a) < tc.min || len(a) > tc.max {
				t.Fatalf("%d arrivals, want %d to %d", len(a), tc.min, tc.max)
			}
			if !slices.IsSorted(a) || len(a) > 0 && (a[0] < 0 || a[len(a)-1] >= tc.d) {
				t.Fatalf("arrivals not increasing inside [0, %v): first %v, last %v", tc.d, a[0], a[len(a)-1])
			}
			if !slices.Equal(a, Arrivals(tc.rate, tc.d, 7)) {
				t.Error("the same seed gave other arrivals")
			}
		})
	}
	if slices.Equal(Arrivals(100, time.Second, 1), Arrivals(100, time.Second, 2)) {
		t.Error("two seeds gave the same arrivals")
	}
	// The gaps of a Poisson process are exponential: their standard
	// deviation equals their mean, and 1-1/e of them are below the mean.
	a := Arrivals(1000, 20*time.Second, 3)
	gaps := make([]float64, len(a)-1)
	var sum float64
	for i := range gaps {
		gaps[i] = (a[i+1] - a[i]).Seconds()
		sum += gaps[i]
	}
	mean := sum / float64(len(gaps))
	var sq float64
	below := 0
	for _, g := range gaps {
		sq += (g - mean) * (g - mean)
		if g < mean {
			below++
		}
	}
	cv := math.Sqrt(sq/float64(len(gaps))) / mean
	if math.Abs(mean-0.001) > 0.00005 || math.Abs(cv-1) > 0.05 {
		t.Errorf("gaps: mean %v s (want 0.001), coefficient of variation %.3f (want 1)", mean, cv)
	}
	if share := float64(below) / float64(len(gaps)); math.Abs(share-(1-1/math.E)) > 0.02 {
		t.Errorf("%.3f of the gaps below the mean, want %.3f", share, 1-1/math.E)
	}
}

func TestSessionsOf(t *testing.T) {
	req := func(tag string, after int) Request { return Request{Path: tag, After: after} }
	for _, tc := range []struct {
		name string
		reqs []Request
		want [][]string
	}{
		{"empty", nil, nil},
		{"independent (rag)", []Request{req("a", 0), req("b", 0)}, [][]string{{"a"}, {"b"}}},
		{"two conversations interleaved", []Request{req("a1", 0), req("b1", 0), req("b2", 2), req("a2", 1), req("a3", 4)},
			[][]string{{"a1", "a2", "a3"}, {"b1", "b2"}}},
		{"a link forward or out of range opens a session", []Request{req("a", 3), req("b", 9), req("c", 1)}, [][]string{{"a", "c"}, {"b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got [][]string
			for _, s := range SessionsOf(&Workload{Requests: tc.reqs}) {
				var tags []string
				for _, r := range s.Turns {
					tags = append(tags, r.Path)
				}
				got = append(got, tags)
			}
			if !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Errorf("sessions %v, want %v", got, tc.want)
			}
		})
	}
	// A built multi-turn workload: every conversation a session of its turns.
	w, err := Build(WorkloadConfig{Kind: MultiTurn, Requests: 12, Model: "m", SystemBytes: 50, UserBytes: 10, MaxTokens: 2,
		Conversations: 3, AnswerBytes: 10, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	ss := SessionsOf(w)
	if len(ss) != 3 {
		t.Fatalf("%d sessions of 3 conversations", len(ss))
	}
	for _, s := range ss {
		if len(s.Turns) != 4 {
			t.Errorf("a conversation of %d turns, want 4", len(s.Turns))
		}
		for k := 1; k < len(s.Turns); k++ {
			if len(s.Turns[k].Body) <= len(s.Turns[k-1].Body) {
				t.Errorf("turn %d's prompt does not extend the previous one", k)
			}
		}
	}
}

func TestWithinSLO(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		samples []time.Duration
		slo     time.Duration
		want    int
	}{
		{nil, 250 * ms, 0},
		{[]time.Duration{10 * ms, 250 * ms, 251 * ms, time.Second}, 250 * ms, 2},
		{[]time.Duration{300 * ms}, 250 * ms, 0},
		{[]time.Duration{1, 2, 3}, time.Hour, 3},
	} {
		if got := WithinSLO(tc.samples, tc.slo); got != tc.want {
			t.Errorf("WithinSLO(%v, %v) = %d, want %d", tc.samples, tc.slo, got, tc.want)
		}
	}
}

// turnLog is an engine that answers like fakeEngine and records, per
// conversation (the request's seed), when each turn arrived.
type turnLog struct {
	mu    sync.Mutex
	turns map[uint64][]time.Time
}

func (l *turnLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Seed uint64 `json:"seed"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	l.mu.Lock()
	l.turns[body.Seed] = append(l.turns[body.Seed], time.Now())
	l.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"))
}

// sessionsOf makes n sessions of turns requests each; every request of a
// session carries the session's number as its seed.
func sessionsOf(n, turns int) []Session {
	out := make([]Session, n)
	for i := range out {
		for range turns {
			b, _ := json.Marshal(map[string]any{"model": "m", "seed": i, "stream": true})
			out[i].Turns = append(out[i].Turns, Request{Path: ChatPath, Body: b, Stream: true})
		}
	}
	return out
}

func TestRunSessions(t *testing.T) {
	think := 20 * time.Millisecond
	for _, tc := range []struct {
		name string
		cfg  Sessions
	}{
		{"open loop", Sessions{Rate: 200, Duration: 300 * time.Millisecond}},
		{"closed loop", Sessions{Users: 4, Duration: 300 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := &turnLog{turns: map[uint64][]time.Time{}}, &turnLog{turns: map[uint64][]time.Time{}}
			urls := []string{serve(t, a), serve(t, b)}
			cfg := tc.cfg
			cfg.Think, cfg.Sessions, cfg.Seed = think, sessionsOf(1000, 3), 1
			res := RunSessions(context.Background(), newTestClient(t), Random(urls, 1), cfg)
			if res.Failed != 0 || res.Dropped != 0 || res.OK == 0 || len(res.TTFT) != res.OK {
				t.Fatalf("OK %d, failed %d (%v), dropped %d, %d TTFTs", res.OK, res.Failed, res.Errors, res.Dropped, len(res.TTFT))
			}
			if res.Elapsed != cfg.Duration {
				t.Errorf("elapsed %v, want the window %v", res.Elapsed, cfg.Duration)
			}
			// Both replicas took requests, a conversation's turns among them:
			// the pick is per request, not per session.
			merged := map[uint64][]time.Time{}
			for _, l := range []*turnLog{a, b} {
				if len(l.turns) == 0 {
					t.Error("a URL got no request")
				}
				for s, ts := range l.turns {
					merged[s] = append(merged[s], ts...)
				}
			}
			split, sent := 0, 0
			for s, ts := range merged {
				sent += len(ts)
				if len(a.turns[s]) > 0 && len(b.turns[s]) > 0 {
					split++
				}
				if len(ts) > 3 {
					t.Fatalf("session %d sent %d turns of 3", s, len(ts))
				}
				slices.SortFunc(ts, func(x, y time.Time) int { return x.Compare(y) })
				for k := 1; k < len(ts); k++ {
					if gap := ts[k].Sub(ts[k-1]); gap < think/2 {
						t.Errorf("session %d: turn %d %v after the previous, less than the least think time %v", s, k, gap, think/2)
					}
				}
			}
			if split == 0 {
				t.Error("no session's turns went to both URLs")
			}
			if sent != res.OK {
				t.Errorf("the engines saw %d requests, the run recorded %d", sent, res.OK)
			}
			if tc.cfg.Rate > 0 && (len(merged) < 30 || len(merged) > 95) {
				t.Errorf("%d sessions started at 200/s over 300ms, want about 60", len(merged))
			}
		})
	}
}

func TestRunSessionsWarmup(t *testing.T) {
	l := &turnLog{turns: map[uint64][]time.Time{}}
	var mu sync.Mutex
	var observed []time.Duration
	res := RunSessions(context.Background(), newTestClient(t), Fixed(serve(t, l)), Sessions{
		Rate: 400, Duration: 200 * time.Millisecond, Warmup: 100 * time.Millisecond, Sessions: sessionsOf(1000, 1), Seed: 2,
		Observe: func(at, ttft time.Duration, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil || ttft <= 0 {
				t.Errorf("observed ttft %v, err %v", ttft, err)
			}
			observed = append(observed, at)
		},
	})
	if len(observed) != res.OK || slices.ContainsFunc(observed, func(at time.Duration) bool { return at < 100*time.Millisecond }) {
		t.Errorf("observed %d requests (%v), recorded %d, all after the warmup", len(observed), observed, res.OK)
	}
	if res.Elapsed != 100*time.Millisecond {
		t.Errorf("elapsed %v, want the 100ms after the warmup", res.Elapsed)
	}
	if len(l.turns) == 0 || res.OK == 0 || res.OK >= len(l.turns) {
		t.Errorf("recorded %d of %d sent: the warmup's requests are sent but not recorded", res.OK, len(l.turns))
	}
	// Nothing to run: nothing sent.
	for _, cfg := range []Sessions{
		{Rate: 100, Duration: time.Second},
		{Sessions: sessionsOf(1, 1), Duration: time.Second},
		{Rate: 100, Sessions: sessionsOf(1, 1)},
	} {
		if res := RunSessions(context.Background(), newTestClient(t), Fixed("http://127.0.0.1:1"), cfg); res.OK+res.Failed+res.Dropped != 0 {
			t.Errorf("%+v sent %d", cfg, res.OK+res.Failed)
		}
	}
}
