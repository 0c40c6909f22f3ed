package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeEngine answers chat and completions requests like an OpenAI server:
// a JSON body, or SSE (a chat stream opens with a role-only chunk) ending
// with [DONE]. mode changes how it answers.
type fakeEngine struct {
	mode      string // "" ok, "503", "truncate", "error-event"
	requests  atomic.Int64
	onRequest func(n int64) // if set, called with the count of requests so far
}

func (f *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := f.requests.Add(1)
	if f.onRequest != nil {
		f.onRequest(n)
	}
	var body struct {
		Stream bool `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if f.mode == "503" {
		http.Error(w, `{"error":{"message":"busy"}}`, http.StatusServiceUnavailable)
		return
	}
	if !body.Stream {
		io.WriteString(w, `{"choices":[{"text":"hi"}]}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	if r.URL.Path == ChatPath {
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
	}
	io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
	switch f.mode {
	case "truncate":
		return
	case "error-event":
		io.WriteString(w, "data: {\"error\":{\"message\":\"upstream failed\",\"code\":\"upstream_failed\"}}\n\n")
		return
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

func chatRequests(t *testing.T, n int, stream float64) []Request {
	t.Helper()
	w, err := Build(WorkloadConfig{Kind: Mixed, Requests: n, Model: "m", SystemPrompts: 2, SystemBytes: 100, UserBytes: 20,
		MaxTokens: 2, StreamFraction: stream, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return w.Requests
}

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.URL
}

func newTestClient(t *testing.T) *http.Client {
	t.Helper()
	c := NewClient(8)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func TestRunClosed(t *testing.T) {
	f := &fakeEngine{}
	url := serve(t, f)
	reqs := chatRequests(t, 40, 0.5)
	streamed := 0
	for _, r := range reqs {
		if r.Stream {
			streamed++
		}
	}
	res := RunClosed(context.Background(), newTestClient(t), Fixed(url), Closed{Concurrency: 4, Requests: reqs})
	if res.OK != 40 || res.Failed != 0 || len(res.Latency) != 40 || len(res.TTFT) != streamed {
		t.Fatalf("OK %d, failed %d (%v), %d latencies, %d TTFTs (%d streamed)", res.OK, res.Failed, res.Errors, len(res.Latency), len(res.TTFT), streamed)
	}
	if f.requests.Load() != 40 {
		t.Errorf("the engine saw %d requests, want each of the 40 once", f.requests.Load())
	}
	for i := range res.TTFT {
		if res.TTFT[i] <= 0 {
			t.Fatalf("TTFT %v", res.TTFT[i])
		}
	}
	if res.Elapsed <= 0 || res.Throughput() <= 0 {
		t.Errorf("elapsed %v, throughput %v", res.Elapsed, res.Throughput())
	}
}

func TestRunClosedCountsFailures(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		stream float64
		want   error
	}{
		{"503", 0, ErrStatus},
		{"truncate", 1, ErrTruncated},
		{"error-event", 1, ErrTruncated},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			url := serve(t, &fakeEngine{mode: tc.mode})
			res := RunClosed(context.Background(), newTestClient(t), Fixed(url), Closed{Concurrency: 2, Requests: chatRequests(t, 6, tc.stream)})
			if res.OK != 0 || res.Failed != 6 || len(res.Latency) != 0 {
				t.Fatalf("OK %d, failed %d, want 6 failures", res.OK, res.Failed)
			}
			if msg := res.FirstError(); !strings.HasPrefix(msg, tc.want.Error()) || res.Errors[msg] != 6 {
				t.Errorf("errors %v, want 6 of %q", res.Errors, tc.want)
			}
		})
	}
}

func TestRunClosedCycles(t *testing.T) {
	// The engine ends the run once it has seen 10 requests: cycling sent
	// the three requests again and again until then.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := &fakeEngine{onRequest: func(n int64) {
		if n == 10 {
			cancel()
		}
	}}
	url := serve(t, f)
	res := RunClosed(ctx, newTestClient(t), Fixed(url), Closed{
		Concurrency: 2, Requests: chatRequests(t, 3, 0), Cycle: true, Duration: time.Minute,
	})
	if f.requests.Load() < 10 || res.Failed != 0 {
		t.Errorf("engine saw %d requests; OK %d, failed %d (%v)", f.requests.Load(), res.OK, res.Failed, res.Errors)
	}
	// Cycling without a duration would never end: it sends nothing.
	if res := RunClosed(context.Background(), newTestClient(t), Fixed(url), Closed{Concurrency: 2, Requests: chatRequests(t, 3, 0), Cycle: true}); res.OK+res.Failed != 0 {
		t.Errorf("cycle without duration sent %d", res.OK+res.Failed)
	}
}

func TestRunOpen(t *testing.T) {
	f := &fakeEngine{}
	url := serve(t, f)
	res := RunOpen(context.Background(), newTestClient(t), Fixed(url), Open{
		Rate: 400, Duration: 50 * time.Millisecond, Requests: []Request{Completion("m", 2, true), Completion("m", 2, false)}, MaxInFlight: 64,
	})
	// Arrivals at 0, 2.5, ..., 47.5 ms: 20 of them, each sent or dropped.
	if res.OK+res.Failed+res.Dropped != 20 || res.Failed != 0 {
		t.Fatalf("OK %d, failed %d, dropped %d: want 20 arrivals, none failed", res.OK, res.Failed, res.Dropped)
	}
	if int(f.requests.Load()) != res.OK || len(res.TTFT) == 0 || len(res.TTFT) == len(res.Latency) {
		t.Errorf("engine saw %d, OK %d, %d TTFTs of %d", f.requests.Load(), res.OK, len(res.TTFT), len(res.Latency))
	}
}

func TestPickers(t *testing.T) {
	urls := []string{"a", "b", "c"}
	rr := RoundRobin(urls)
	var got []string
	for range 7 {
		got = append(got, rr.Next())
	}
	if strings.Join(got, "") != "abcabca" {
		t.Errorf("round robin picked %v", got)
	}
	seq := func(seed uint64) string {
		r := Random(urls, seed)
		var b strings.Builder
		for range 300 {
			b.WriteString(r.Next())
		}
		return b.String()
	}
	a := seq(1)
	if a != seq(1) {
		t.Error("random picks are not reproducible from the seed")
	}
	if a == seq(2) {
		t.Error("two seeds pick the same sequence")
	}
	for _, u := range urls {
		if n := strings.Count(a, u); n < 60 {
			t.Errorf("random picked %q %d times of 300", u, n)
		}
	}
	if Fixed("x").Next() != "x" {
		t.Error("Fixed")
	}
}

// TestTTFTSkipsTheRoleChunk checks that a chat stream's first token is the
// first content chunk, not the role-only chunk before it: the token is
// written into a pipe only after the role chunk was consumed.
func TestTTFTSkipsTheRoleChunk(t *testing.T) {
	pr, pw := io.Pipe()
	var tokenWritten atomic.Bool
	go func() {
		io.WriteString(pw, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		tokenWritten.Store(true)
		io.WriteString(pw, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
		pw.Close()
	}()
	calls := 0
	ttft, err := readStream(pr, time.Now(), func() {
		calls++
		if !tokenWritten.Load() {
			t.Error("first token seen before the token chunk was written")
		}
	}, nil)
	if err != nil || calls != 1 || ttft <= 0 {
		t.Errorf("readStream: ttft %v, %d calls, %v", ttft, calls, err)
	}
	// A stream with no token before [DONE] is a failure.
	if _, err := readStream(strings.NewReader("data: [DONE]\n\n"), time.Now(), nil, nil); !errors.Is(err, ErrTruncated) {
		t.Errorf("no token: %v", err)
	}
	// An over-long event is refused, not skipped.
	long := "data: " + strings.Repeat("x", maxEventBytes) + "\n\n"
	if _, err := readStream(strings.NewReader(long), time.Now(), nil, nil); !errors.Is(err, ErrTruncated) {
		t.Errorf("long event: %v", err)
	}
}

// stallingEngine sends one SSE event and then holds the stream open until
// the client goes away; open counts the streams it holds.
type stallingEngine struct {
	open, peak atomic.Int64
	wg         sync.WaitGroup
	fail       bool
}

func (s *stallingEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.fail {
		http.Error(w, "no", http.StatusInternalServerError)
		return
	}
	s.wg.Add(1)
	defer s.wg.Done()
	n := s.open.Add(1)
	defer s.open.Add(-1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

func TestHold(t *testing.T) {
	eng := &stallingEngine{}
	url := serve(t, eng)
	c := newTestClient(t)
	s, err := Hold(context.Background(), c, Fixed(url), Completion("m", 2, true), 12, 3)
	if err != nil {
		t.Fatal(err)
	}
	// Every stream delivered its first event and none has ended.
	if got := eng.open.Load(); got != 12 {
		t.Errorf("%d streams open at the engine, want 12", got)
	}
	s.Close()
	eng.wg.Wait() // every handler saw its client go away
	if got := eng.open.Load(); got != 0 {
		t.Errorf("%d streams still open after Close", got)
	}

	if _, err := Hold(context.Background(), c, Fixed(url), Completion("m", 2, false), 1, 1); err == nil {
		t.Error("Hold of a non-streamed request succeeded")
	}
	bad := serve(t, &stallingEngine{fail: true})
	if _, err := Hold(context.Background(), c, Fixed(bad), Completion("m", 2, true), 4, 2); !errors.Is(err, ErrStatus) {
		t.Errorf("Hold against a failing engine: %v, want ErrStatus", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Hold(ctx, c, Fixed(url), Completion("m", 2, true), 4, 2); !errors.Is(err, context.Canceled) {
		t.Errorf("Hold with a cancelled context: %v", err)
	}
}

func ExampleSummarize() {
	s := Summarize([]time.Duration{3 * time.Millisecond, 1 * time.Millisecond, 2 * time.Millisecond})
	fmt.Println(s.P50, s.P99, s.Mean)
	// Output: 2ms 3ms 2ms
}

// namedEngine answers every request with a completion after calling seen
// with the request's "model", which these tests use as its name.
func namedEngine(t *testing.T, seen func(name string, r *http.Request)) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model string `json:"model"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		seen(body.Model, r)
		io.WriteString(w, `{"choices":[{"text":"hi"}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// named is a request named name (see namedEngine) sent after request
// after-1 (0: none).
func named(name string, after int) Request {
	return Request{Path: ChatPath, Body: []byte(`{"model":"` + name + `"}`), After: after}
}

// TestRunClosedHoldsNoClientForAWaitingTurn: a turn whose previous turn is
// still unanswered holds no client; the next ready request goes first and
// the turn follows once its previous one is answered. The engine answers
// the first turn only after the later request arrived, so a driver that
// held the free client on the waiting turn never sends it and fails at the
// deadline.
func TestRunClosedHoldsNoClientForAWaitingTurn(t *testing.T) {
	var mu sync.Mutex
	var order []string
	laterArrived := make(chan struct{})
	srv := namedEngine(t, func(name string, r *http.Request) {
		mu.Lock()
		order = append(order, name)
		mu.Unlock()
		switch name {
		case "later":
			close(laterArrived)
		case "turn-1":
			select {
			case <-laterArrived:
			case <-r.Context().Done():
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res := RunClosed(ctx, srv.Client(), Fixed(srv.URL), Closed{Concurrency: 2,
		Requests: []Request{named("turn-1", 0), named("turn-2", 1), named("later", 0)}})
	mu.Lock()
	defer mu.Unlock()
	if ctx.Err() != nil {
		t.Fatalf("run did not finish: a waiting turn held a client (sent %v)", order)
	}
	if res.OK != 3 || res.Failed != 0 {
		t.Fatalf("ok %d failed %d (%v), want 3 and 0", res.OK, res.Failed, res.Errors)
	}
	if len(order) != 3 || order[2] != "turn-2" {
		t.Fatalf("sent %v, want turn-2 last (after turn-1 was answered)", order)
	}
}

// TestRunClosedWaitsTheThinkTime: a turn is sent no sooner than half the
// think time after its previous turn was answered (a lower bound only,
// which a busy machine cannot break).
func TestRunClosedWaitsTheThinkTime(t *testing.T) {
	var mu sync.Mutex
	sent := map[string]time.Time{}
	srv := namedEngine(t, func(name string, _ *http.Request) {
		mu.Lock()
		sent[name] = time.Now()
		mu.Unlock()
	})
	const think = 200 * time.Millisecond
	res := RunClosed(context.Background(), srv.Client(), Fixed(srv.URL), Closed{Concurrency: 2,
		Requests: []Request{named("turn-1", 0), named("turn-2", 1)}, Think: think})
	if res.OK != 2 {
		t.Fatalf("ok %d, want 2 (%v)", res.OK, res.Errors)
	}
	mu.Lock()
	defer mu.Unlock()
	if gap := sent["turn-2"].Sub(sent["turn-1"]); gap < think/2 {
		t.Fatalf("turn 2 sent %v after turn 1, want at least %v", gap, think/2)
	}
}

// TestInterTokenGaps checks the inter-token timing: a gap per token event
// after the first (the role chunk and a usage chunk are no tokens), and a
// recorded answer's TPOT the mean of its gaps, in the order of its TTFT.
func TestInterTokenGaps(t *testing.T) {
	stream := "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"c\"},\"finish_reason\":\"length\"}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\n" +
		"data: [DONE]\n\n"
	var gaps []time.Duration
	if _, err := readStream(strings.NewReader(stream), time.Now(), nil, &gaps); err != nil || len(gaps) != 2 {
		t.Fatalf("gaps %v, err %v: want 2 (three tokens)", gaps, err)
	}
	var rec recorder
	rec.addTimed(time.Second, 100*time.Millisecond, true, []time.Duration{10 * time.Millisecond, 30 * time.Millisecond}, nil)
	rec.addTimed(time.Second, 200*time.Millisecond, true, []time.Duration{}, nil) // one token
	rec.addTimed(time.Second, 0, false, nil, nil)                                 // not streamed
	rec.addTimed(0, 0, true, nil, errors.New("boom"))
	r := rec.res
	if r.OK != 3 || r.Failed != 1 || len(r.TTFT) != 2 || !slices.Equal(r.TPOT, []time.Duration{20 * time.Millisecond, 0}) ||
		!slices.Equal(r.ITL, []time.Duration{10 * time.Millisecond, 30 * time.Millisecond}) {
		t.Errorf("recorded %+v", r)
	}
	// Untimed streams record no TPOT.
	var plain recorder
	plain.add(time.Second, time.Millisecond, true, nil)
	if len(plain.res.TTFT) != 1 || plain.res.TPOT != nil || plain.res.ITL != nil {
		t.Errorf("untimed: %+v", plain.res)
	}
}
