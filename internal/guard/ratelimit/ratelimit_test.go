package ratelimit

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable fake clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// step is one event in a limiter scenario: advance the clock, then admit a
// request (and maybe end it with tokens) or end an earlier one.
type step struct {
	after   time.Duration
	admit   bool
	done    int // tokens charged by a Done (-1: no Done)
	wantOK  bool
	limited string
	retry   time.Duration
	req     Status
	tok     Status
}

func TestLimiterScenarios(t *testing.T) {
	cases := []struct {
		name   string
		limits Limits
		steps  []step
	}{
		{"requests burst then refill", Limits{RequestsPerMinute: 3}, []step{
			{admit: true, done: 0, wantOK: true, req: Status{3, 2, 20 * time.Second}},
			{admit: true, done: 0, wantOK: true, req: Status{3, 1, 40 * time.Second}},
			{admit: true, done: 0, wantOK: true, req: Status{3, 0, 60 * time.Second}},
			{admit: true, done: -1, wantOK: false, limited: LimitRequests, retry: 20 * time.Second, req: Status{3, 0, 60 * time.Second}},
			{after: 19 * time.Second, admit: true, done: -1, wantOK: false, limited: LimitRequests, retry: time.Second, req: Status{3, 0, 41 * time.Second}},
			{after: time.Second, admit: true, done: 0, wantOK: true, req: Status{3, 0, 60 * time.Second}},
			{after: 10 * time.Minute, admit: true, done: 0, wantOK: true, req: Status{3, 2, 20 * time.Second}},
		}},
		{"limit that does not divide the minute", Limits{RequestsPerMinute: 7}, []step{
			{admit: true, done: 0, wantOK: true, req: Status{7, 6, 8571429 * time.Microsecond}},
			// One microsecond short of a whole request: the bucket holds 6.99…
			{after: 8571428 * time.Microsecond, admit: true, done: 0, wantOK: true, req: Status{7, 5, 8571430 * time.Microsecond}},
			{after: 2 * 8571429 * time.Microsecond, admit: true, done: 0, wantOK: true, req: Status{7, 6, 8571429 * time.Microsecond}},
		}},
		{"tokens charged when done, debt waits", Limits{TokensPerMinute: 600}, []step{
			{admit: true, done: 300, wantOK: true, tok: Status{600, 600, 0}},
			{admit: true, done: 400, wantOK: true, tok: Status{600, 300, 30 * time.Second}},
			// 100 in debt: wait until one token is back (101 tokens at 10/s).
			{admit: true, done: -1, wantOK: false, limited: LimitTokens, retry: 10100 * time.Millisecond, tok: Status{600, 0, 70 * time.Second}},
			{after: 10100 * time.Millisecond, admit: true, done: 0, wantOK: true, tok: Status{600, 1, 59900 * time.Millisecond}},
		}},
		{"a lying usage figure is bounded", Limits{TokensPerMinute: 10}, []step{
			{admit: true, done: 1 << 40, wantOK: true, tok: Status{10, 10, 0}},
			{admit: true, done: -1, wantOK: false, limited: LimitTokens, retry: 10*time.Minute + 6*time.Second, tok: Status{10, 0, 11 * time.Minute}},
		}},
		{"both limits: the longer wait is reported", Limits{RequestsPerMinute: 60, TokensPerMinute: 60}, []step{
			{admit: true, done: 120, wantOK: true, req: Status{60, 59, time.Second}, tok: Status{60, 60, 0}},
			{admit: true, done: -1, wantOK: false, limited: LimitTokens, retry: 61 * time.Second, req: Status{60, 59, time.Second}, tok: Status{60, 0, 2 * time.Minute}},
		}},
		{"max concurrent", Limits{MaxConcurrent: 2}, []step{
			{admit: true, done: -1, wantOK: true},
			{admit: true, done: -1, wantOK: true},
			{admit: true, done: -1, wantOK: false, limited: LimitConcurrent, retry: time.Second},
			{done: 0},
			{admit: true, done: -1, wantOK: true},
		}},
		{"refused requests take nothing", Limits{RequestsPerMinute: 1, MaxConcurrent: 1}, []step{
			{admit: true, done: -1, wantOK: true, req: Status{1, 0, time.Minute}},
			{after: time.Minute, admit: true, done: -1, wantOK: false, limited: LimitConcurrent, retry: time.Second, req: Status{1, 1, 0}},
			{done: 0},
			{admit: true, done: 0, wantOK: true, req: Status{1, 0, time.Minute}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			l := New(map[string]Limits{"k": tc.limits, "free": {}}, c.now)
			var open []*Reservation // admitted and not settled, oldest first
			for i, s := range tc.steps {
				c.add(s.after)
				if !s.admit {
					open[0].Settle(s.done)
					open = open[1:]
					continue
				}
				d := l.Admit("k", Want{})
				if d.OK != s.wantOK || d.Limited != s.limited || d.RetryAfter != s.retry || d.Requests != s.req || d.Tokens != s.tok {
					t.Fatalf("step %d: got %+v, want ok=%v limited=%q retry=%s requests=%+v tokens=%+v",
						i, d, s.wantOK, s.limited, s.retry, s.req, s.tok)
				}
				if d.OK && s.done >= 0 {
					d.Reservation.Settle(s.done)
				} else if d.OK {
					open = append(open, d.Reservation)
				}
			}
			if d := l.Admit("free", Want{}); !d.OK || d.Requests.Limit != 0 || d.Reservation != nil || l.Limited("free") {
				t.Fatalf("a key without limits: %+v", d)
			}
		})
	}
}

func TestClockGoingBackRefillsNothing(t *testing.T) {
	c := newClock()
	l := New(map[string]Limits{"k": {RequestsPerMinute: 1}}, c.now)
	if !l.Admit("k", Want{}).OK {
		t.Fatal("first request refused")
	}
	c.add(-time.Hour)
	if d := l.Admit("k", Want{}); d.OK {
		t.Fatalf("admitted after the clock went back: %+v", d)
	}
}

func TestSetHeaders(t *testing.T) {
	cases := []struct {
		name string
		d    Decision
		want map[string]string
	}{
		{"admitted, both limits", Decision{OK: true, Requests: Status{60, 59, time.Second}, Tokens: Status{150000, 149984, 6 * time.Minute}},
			map[string]string{
				"X-Ratelimit-Limit-Requests": "60", "X-Ratelimit-Remaining-Requests": "59", "X-Ratelimit-Reset-Requests": "1s",
				"X-Ratelimit-Limit-Tokens": "150000", "X-Ratelimit-Remaining-Tokens": "149984", "X-Ratelimit-Reset-Tokens": "6m0s",
			}},
		{"refused, sub-second", Decision{Limited: LimitRequests, RetryAfter: 11500 * time.Microsecond, Requests: Status{5, 0, 12 * time.Millisecond}},
			map[string]string{
				"X-Ratelimit-Limit-Requests": "5", "X-Ratelimit-Remaining-Requests": "0", "X-Ratelimit-Reset-Requests": "12ms",
				"Retry-After": "1", "Retry-After-Ms": "12",
			}},
		{"refused, seconds rounded up", Decision{Limited: LimitTokens, RetryAfter: 2001 * time.Millisecond, Tokens: Status{10, 0, 1500 * time.Millisecond}},
			map[string]string{
				"X-Ratelimit-Limit-Tokens": "10", "X-Ratelimit-Remaining-Tokens": "0", "X-Ratelimit-Reset-Tokens": "1.5s",
				"Retry-After": "3", "Retry-After-Ms": "2001",
			}},
		{"no limits", Decision{OK: true}, map[string]string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			tc.d.SetHeaders(h)
			if len(h) != len(tc.want) {
				t.Fatalf("headers %v, want %v", h, tc.want)
			}
			for k, v := range tc.want {
				if got := h.Get(k); got != v {
					t.Fatalf("%s = %q, want %q (all: %v)", k, got, v, h)
				}
			}
		})
	}
}

func TestFormatReset(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", -time.Second: "0s", time.Microsecond: "1ms", 20 * time.Second: "20s",
		6 * time.Minute: "6m0s", 1234567 * time.Microsecond: "1.235s",
	} {
		if got := FormatReset(d); got != want {
			t.Errorf("FormatReset(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	c := newClock()
	l := New(map[string]Limits{"k": {RequestsPerMinute: 100, MaxConcurrent: 1000}}, c.now)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if d := l.Admit("k", Want{}); d.OK {
					mu.Lock()
					admitted++
					mu.Unlock()
					d.Reservation.Settle(0)
				}
			}
		})
	}
	wg.Wait()
	if admitted != 100 {
		t.Fatalf("admitted %d of 400 at one instant, want exactly the limit 100", admitted)
	}
}

func TestMessageNamesTheLimit(t *testing.T) {
	for limit, want := range map[string]string{LimitRequests: "requests per minute", LimitTokens: "tokens per minute", LimitConcurrent: "concurrent"} {
		d := Decision{Limited: limit, RetryAfter: time.Second, Requests: Status{Limit: 1}, Tokens: Status{Limit: 2}, MaxConcurrent: 3}
		if m := d.Message("alice"); !strings.Contains(m, want) || !strings.Contains(m, `"alice"`) {
			t.Errorf("%s: %q lacks %q", limit, m, want)
		}
	}
}

// TestSetLimits: a reload keeps the state of a key whose limits did not
// change, starts the windows of one whose limits changed (keeping its
// requests in flight), limits a new key and stops limiting a removed one.
func TestSetLimits(t *testing.T) {
	c := newClock()
	l := New(map[string]Limits{"a": {RequestsPerMinute: 2}, "c": {MaxConcurrent: 1}, "gone": {RequestsPerMinute: 1}}, c.now)
	for range 2 {
		if !l.Admit("a", Want{}).OK {
			t.Fatal("a refused within its limit")
		}
	}
	cd := l.Admit("c", Want{})
	cRes := cd.Reservation
	if !cd.OK || !l.Admit("gone", Want{}).OK || l.Admit("gone", Want{}).OK {
		t.Fatal("setup")
	}
	l.SetLimits(map[string]Limits{"a": {RequestsPerMinute: 2}, "c": {MaxConcurrent: 2}, "b": {RequestsPerMinute: 1}})
	if l.Admit("a", Want{}).OK {
		t.Error("a's unchanged limit forgot its used window")
	}
	if !l.Admit("c", Want{}).OK {
		t.Error("c refused its second slot after its limit went to 2")
	}
	if l.Admit("c", Want{}).OK {
		t.Error("c got a third slot: its request in flight was forgotten")
	}
	if !l.Admit("b", Want{}).OK || l.Admit("b", Want{}).OK {
		t.Error("new key b not limited to 1 request")
	}
	if !l.Limited("b") || l.Limited("gone") {
		t.Errorf("limited: b %v, gone %v", l.Limited("b"), l.Limited("gone"))
	}
	for range 3 {
		if !l.Admit("gone", Want{}).OK {
			t.Fatal("a key no longer limited was refused")
		}
	}
	// A changed limit starts a's window again.
	l.SetLimits(map[string]Limits{"a": {RequestsPerMinute: 3}})
	if !l.Admit("a", Want{}).OK {
		t.Error("a refused after its limit was raised")
	}
	cRes.Settle(0) // c is no longer limited: harmless
}

// TestReservations: the tokens of a request are reserved at admission,
// refused or clamped when the bucket cannot hold them, and settled to
// what was used.
func TestReservations(t *testing.T) {
	type admit struct {
		want      Want
		ok        bool
		tooLarge  bool
		maxTokens int
		remaining int
		settle    int // tokens settled right away (-1: kept open)
	}
	cases := []struct {
		name  string
		steps []admit
		after int // remaining once every open reservation is settled with 0
	}{
		{"fits, then the rest is refused", []admit{
			{want: Want{Prompt: 10, MaxTokens: 40}, ok: true, maxTokens: 40, remaining: 50, settle: -1},
			{want: Want{Prompt: 10, MaxTokens: 40}, ok: true, maxTokens: 40, remaining: 0, settle: -1},
			{want: Want{Prompt: 1, MaxTokens: 1}, ok: false, remaining: 0, settle: -1},
		}, 100},
		{"larger than the limit", []admit{
			{want: Want{Prompt: 2, MaxTokens: 4000}, ok: false, tooLarge: true, remaining: 100, settle: -1},
			{want: Want{Prompt: 200, MaxTokens: 1, Clamp: true}, ok: false, tooLarge: true, remaining: 100, settle: -1},
		}, 100},
		{"clamp cuts max_tokens to what is left", []admit{
			{want: Want{Prompt: 2, MaxTokens: 4000, Clamp: true}, ok: true, maxTokens: 98, remaining: 0, settle: 30},
			{want: Want{Prompt: 2, MaxTokens: 4000, Clamp: true}, ok: true, maxTokens: 68, remaining: 0, settle: -1},
			{want: Want{Prompt: 2, MaxTokens: 10, Clamp: true}, ok: false, remaining: 0, settle: -1},
		}, 70},
		{"settled above the reservation is debt", []admit{
			{want: Want{Prompt: 2, MaxTokens: 8}, ok: true, maxTokens: 8, remaining: 90, settle: 150},
			{want: Want{}, ok: false, remaining: 0, settle: -1},
		}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			l := New(map[string]Limits{"k": {TokensPerMinute: 100}}, c.now)
			var open []*Reservation
			for i, s := range tc.steps {
				d := l.Admit("k", s.want)
				if d.OK != s.ok || d.TooLarge != s.tooLarge || d.Tokens.Remaining != s.remaining || (d.OK && d.MaxTokens != s.maxTokens) {
					t.Fatalf("step %d: %+v, want ok %v tooLarge %v max_tokens %d remaining %d", i, d, s.ok, s.tooLarge, s.maxTokens, s.remaining)
				}
				if !d.OK {
					if d.Reservation != nil || d.Limited != LimitTokens || d.RetryAfter <= 0 || !strings.Contains(d.Message("k"), "tokens per minute") {
						t.Fatalf("step %d refused: %+v %q", i, d, d.Message("k"))
					}
					continue
				}
				if s.settle >= 0 {
					d.Reservation.Settle(s.settle)
					d.Reservation.Settle(1000) // only the first counts
				} else {
					open = append(open, d.Reservation)
				}
			}
			for _, r := range open {
				r.Settle(0)
			}
			if d := l.Admit("k", Want{}); d.Tokens.Remaining != tc.after {
				t.Fatalf("remaining after settling: %d, want %d", d.Tokens.Remaining, tc.after)
			}
		})
	}
}

// TestReservationUse: a stream's usage beyond its reservation is taken as
// it is reported, until the bucket would be MaxDebt windows below empty.
func TestReservationUse(t *testing.T) {
	c := newClock()
	l := New(map[string]Limits{"k": {TokensPerMinute: 100}}, c.now)
	d := l.Admit("k", Want{Prompt: 2, MaxTokens: 8})
	r := d.Reservation
	if !r.Use(10) || !r.Use(5) {
		t.Fatal("usage within the reservation refused")
	}
	cap := 100 + MaxDebt*100 // the bucket's 100 and 10 windows of debt
	if !r.Use(cap) {
		t.Fatal("usage up to the debt cap refused")
	}
	if r.Use(cap + 1) {
		t.Fatal("usage past the debt cap accepted")
	}
	// Refill makes room again.
	c.add(6 * time.Second) // 10 tokens
	if !r.Use(cap+10) || r.Use(cap+11) {
		t.Fatal("refill not counted")
	}
	r.Settle(cap + 10)
	if w := l.Admit("k", Want{}); w.OK || w.Tokens.Remaining != 0 {
		t.Fatalf("after the debt: %+v", w)
	}
	var none *Reservation
	if !none.Use(1 << 30) {
		t.Fatal("a nil reservation refused")
	}
	none.Settle(5)
	// A key without a tokens limit: Use never refuses.
	l2 := New(map[string]Limits{"k": {MaxConcurrent: 1}}, c.now)
	d2 := l2.Admit("k", Want{Prompt: 1 << 20})
	if !d2.OK || !d2.Reservation.Use(1<<30) {
		t.Fatalf("no tokens limit: %+v", d2)
	}
	d2.Reservation.Settle(0)
	if !l2.Admit("k", Want{}).OK {
		t.Fatal("Settle did not free the slot")
	}
}

// TestReloadKeepsSlotsExact: requests admitted and released while reloads
// change their key's limits free their slots once, whichever state they
// meet: with every request settled, the key admits its max_concurrent
// again, no more and no fewer.
func TestReloadKeepsSlotsExact(t *testing.T) {
	for round := range 20 {
		l := New(map[string]Limits{"k": {MaxConcurrent: 1_000_000}}, nil)
		const n = 5000
		rs := make(chan *Reservation, n)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // admits
			defer wg.Done()
			defer close(rs)
			for range n {
				d := l.Admit("k", Want{})
				if !d.OK {
					t.Errorf("round %d: refused %+v", round, d)
					return
				}
				rs <- d.Reservation
			}
		}()
		go func() { // settles
			defer wg.Done()
			for r := range rs {
				r.Settle(0)
			}
		}()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		for i := 0; ; i++ {
			select {
			case <-done:
			default:
				l.SetLimits(map[string]Limits{"k": {MaxConcurrent: 1_000_000 - i%2}})
				continue
			}
			break
		}
		l.SetLimits(map[string]Limits{"k": {MaxConcurrent: 2}})
		for i, want := range []bool{true, true, false} {
			if d := l.Admit("k", Want{}); d.OK != want {
				t.Fatalf("round %d: request %d after every one settled: admitted %v, want %v (%s)", round, i+1, d.OK, want, d.Limited)
			}
		}
	}
}
