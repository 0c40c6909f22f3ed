// Package ratelimit enforces per-key limits at the HTTP edge: requests per
// minute, tokens per minute and concurrent requests, and reports them in the
// x-ratelimit-* headers OpenAI clients read.
//
// Both per-minute limits are buckets that refill continuously, as OpenAI's
// do: a bucket of L holds at most L and refills at L per minute, so a key
// that used nothing for a minute may burst to L again. "remaining" is what
// the bucket holds now (rounded down) and "reset" the time until it is full
// again (the "time until the rate limit resets to its initial state" of
// OpenAI's headers). The state is kept exactly, in microseconds × limit
// units, so the figures do not drift from rounding.
//
// A request takes one from the requests bucket when it is admitted. Its
// tokens are reserved at admission: the estimate of its prompt plus its
// completion budget (Want). A reservation the bucket cannot hold is refused,
// or, with Want.Clamp, its completion budget is cut to what the bucket holds
// (Decision.MaxTokens), as long as one completion token fits. A reservation
// larger than the limit itself never fits and is refused at once
// (Decision.TooLarge). When the request is over, its Reservation is settled:
// the reserved tokens are replaced by what the answer really used. Usage
// above the reservation (a prompt estimate below the truth, an engine that
// ignored max_tokens) puts the bucket below empty, at most MaxDebt windows;
// the key then waits until the debt is repaid. A stream reports its usage as
// it goes (Reservation.Use), and is refused more once it would take the
// bucket past that cap, so no answer is forgiven more than what lies beyond
// the cap, and a stream is cut there.
//
// A Limiter is safe for concurrent use; the time comes from an injected
// clock.
package ratelimit

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Window is the period of the per-minute limits.
const Window = time.Minute

// MaxLimit is the largest per-minute limit accepted; larger ones are
// clamped (it keeps the bucket arithmetic within int64).
const MaxLimit = 1_000_000_000

// MaxDebt bounds how far below empty a tokens bucket may go: at most this
// many windows of refill. A stream that would go beyond it is refused more
// (Reservation.Use); a non-streamed usage figure beyond it (a lying engine)
// costs no more.
const MaxDebt = 10

// windowMicros is Window in microseconds, the unit of the bucket state.
const windowMicros = int64(Window / time.Microsecond)

// Limit names, in Decision.Limited and in the error message.
const (
	LimitRequests   = "requests"
	LimitTokens     = "tokens"
	LimitConcurrent = "concurrent"
)

// concurrentRetry is the Retry-After of a request refused by
// max_concurrent: no timer says when a slot frees, so a short one.
const concurrentRetry = time.Second

// Limits are one key's limits; zero means unlimited.
type Limits struct {
	RequestsPerMinute int
	TokensPerMinute   int
	MaxConcurrent     int
}

// Zero reports whether no limit is set.
func (l Limits) Zero() bool {
	return l.RequestsPerMinute <= 0 && l.TokensPerMinute <= 0 && l.MaxConcurrent <= 0
}

// bucket is a continuously refilling bucket of limit per Window. debt is how
// far it is below full, in microseconds × limit: taking n costs n ×
// windowMicros and each microsecond refills limit. at is when debt was last
// brought up to date.
type bucket struct {
	limit int64
	debt  int64
	at    time.Time
}

func newBucket(limit int) bucket {
	return bucket{limit: min(int64(limit), MaxLimit)}
}

// advance returns b refilled up to now. A clock that went back refills
// nothing.
func (b bucket) advance(now time.Time) bucket {
	if b.at.IsZero() || now.Before(b.at) {
		if b.at.IsZero() {
			b.at = now
		}
		return b
	}
	el := now.Sub(b.at).Microseconds()
	b.at = now
	if el >= b.debt/b.limit+1 {
		b.debt = 0
	} else {
		b.debt -= el * b.limit
		b.debt = max(b.debt, 0)
	}
	return b
}

// full is the debt of an empty bucket.
func (b bucket) full() int64 { return windowMicros * b.limit }

// remaining is what the bucket holds, rounded down, never below 0.
func (b bucket) remaining() int {
	if b.debt >= b.full() {
		return 0
	}
	return int((b.full() - b.debt) / windowMicros)
}

// reset is the time until the bucket is full again.
func (b bucket) reset() time.Duration {
	return micros(ceilDiv(b.debt, b.limit))
}

// wait is the time until the bucket holds n: 0 if it does.
func (b bucket) wait(n int64) time.Duration {
	over := b.debt + n*windowMicros - b.full()
	if over <= 0 {
		return 0
	}
	return micros(ceilDiv(over, b.limit))
}

// charge returns b with n taken, at most MaxDebt windows below empty.
func (b bucket) charge(n int64) bucket {
	limit := (MaxDebt + 1) * b.full()
	n = min(max(n, 0), (MaxDebt+1)*b.limit)
	b.debt = min(b.debt+n*windowMicros, limit)
	return b
}

// resize returns b refilled up to now with limit in place of its own, what
// it holds kept (cut to the new limit): a larger limit refills faster, it
// gives nothing at once. A bucket with no limit starts empty; limit 0
// turns it off.
func (b bucket) resize(limit int64, now time.Time) bucket {
	limit = min(limit, MaxLimit)
	switch {
	case limit <= 0:
		return bucket{}
	case b.limit == 0:
		return bucket{limit: limit, debt: windowMicros * limit, at: now}
	case limit == b.limit:
		return b
	}
	b = b.advance(now)
	b.debt = max(0, b.debt+windowMicros*(limit-b.limit))
	b.limit = limit
	return b
}

// settle returns b with a reservation of held replaced by used: the
// difference given back, or taken (up to the MaxDebt bound).
func (b bucket) settle(held, used int64) bucket {
	if used >= held {
		return b.charge(used - held)
	}
	back := min(held-used, (MaxDebt+1)*b.limit)
	b.debt = max(b.debt-back*windowMicros, 0)
	return b
}

func (b bucket) status() Status {
	return Status{Limit: int(b.limit), Remaining: b.remaining(), Reset: b.reset()}
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

func micros(n int64) time.Duration {
	if n > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(n) * time.Microsecond
}

// Status is one limit as the headers report it. Limit 0: not limited.
type Status struct {
	Limit     int
	Remaining int
	Reset     time.Duration
}

// Decision is the verdict on one request.
type Decision struct {
	// OK: the request is admitted; call Limiter.Done when it is over.
	OK bool
	// Limited names the limit that refused it (a Limit constant), when !OK.
	Limited string
	// RetryAfter is how long to wait before the limit would admit it.
	RetryAfter time.Duration
	// Requests and Tokens report the per-minute limits (Limit 0 when the
	// key has none).
	Requests, Tokens Status
	// MaxConcurrent is the key's concurrency limit (0: none).
	MaxConcurrent int
	// MaxTokens is the completion budget granted: Want.MaxTokens, or less
	// when Want.Clamp cut it to what the tokens bucket holds. Meaningful
	// only when OK.
	MaxTokens int
	// Want is the request's reservation as asked (prompt + completion), in
	// a refusal's message.
	Want int
	// TooLarge: refused because the reservation is larger than the
	// tokens limit itself; waiting does not help.
	TooLarge bool
	// Reservation is the admitted request's hold on its key's limits, to
	// settle when it is over; nil when the key is not limited (its methods
	// then do nothing).
	Reservation *Reservation
}

// Want is what a request asks of its key's tokens bucket at admission.
type Want struct {
	// Prompt is the estimate of the prompt's tokens.
	Prompt int
	// MaxTokens is the completion budget: the request's max_tokens, or the
	// budget the gateway sets when it has none.
	MaxTokens int
	// Clamp: when the bucket holds less than Prompt + MaxTokens but more
	// than Prompt, admit with MaxTokens cut to what it holds instead of
	// refusing.
	Clamp bool
}

func (w Want) total() int64 {
	return min(int64(max(w.Prompt, 0))+int64(max(w.MaxTokens, 0)), (MaxDebt+1)*MaxLimit)
}

// Message is the error message of a refused request.
func (d Decision) Message(key string) string {
	switch d.Limited {
	case LimitConcurrent:
		return fmt.Sprintf("Rate limit reached for key %q: at most %d concurrent requests. Retry when one finishes.", key, d.MaxConcurrent)
	case LimitTokens:
		if d.TooLarge {
			return fmt.Sprintf("Request too large for key %q on tokens per minute: limit %d, requested %d (the prompt's estimate plus max_tokens). Lower max_tokens or shorten the prompt.", key, d.Tokens.Limit, d.Want)
		}
		if d.Want > 1 {
			return fmt.Sprintf("Rate limit reached for key %q on tokens per minute: limit %d, requested %d (the prompt's estimate plus max_tokens), %d left. Retry after %s.", key, d.Tokens.Limit, d.Want, d.Tokens.Remaining, FormatReset(d.RetryAfter))
		}
		return fmt.Sprintf("Rate limit reached for key %q on tokens per minute: limit %d, used up. Retry after %s.", key, d.Tokens.Limit, FormatReset(d.RetryAfter))
	default:
		return fmt.Sprintf("Rate limit reached for key %q on requests per minute: limit %d. Retry after %s.", key, d.Requests.Limit, FormatReset(d.RetryAfter))
	}
}

// Header names (OpenAI's, lower case as it sends them).
const (
	HeaderLimitRequests     = "x-ratelimit-limit-requests"
	HeaderRemainingRequests = "x-ratelimit-remaining-requests"
	HeaderResetRequests     = "x-ratelimit-reset-requests"
	HeaderLimitTokens       = "x-ratelimit-limit-tokens"
	HeaderRemainingTokens   = "x-ratelimit-remaining-tokens"
	HeaderResetTokens       = "x-ratelimit-reset-tokens"
	HeaderRetryAfter        = "Retry-After"
	HeaderRetryAfterMs      = "retry-after-ms"
)

// SetHeaders writes the x-ratelimit-* headers of the key's per-minute
// limits on h and, for a refused request, Retry-After (whole seconds,
// rounded up) and retry-after-ms (which OpenAI's SDKs prefer).
func (d Decision) SetHeaders(h http.Header) {
	if d.Requests.Limit > 0 {
		h.Set(HeaderLimitRequests, strconv.Itoa(d.Requests.Limit))
		h.Set(HeaderRemainingRequests, strconv.Itoa(d.Requests.Remaining))
		h.Set(HeaderResetRequests, FormatReset(d.Requests.Reset))
	}
	if d.Tokens.Limit > 0 {
		h.Set(HeaderLimitTokens, strconv.Itoa(d.Tokens.Limit))
		h.Set(HeaderRemainingTokens, strconv.Itoa(d.Tokens.Remaining))
		h.Set(HeaderResetTokens, FormatReset(d.Tokens.Reset))
	}
	if !d.OK {
		ms := max(ceilDiv(int64(d.RetryAfter), int64(time.Millisecond)), 1)
		h.Set(HeaderRetryAfter, strconv.FormatInt(ceilDiv(ms, 1000), 10))
		h.Set(HeaderRetryAfterMs, strconv.FormatInt(ms, 10))
	}
}

// FormatReset formats a reset time as OpenAI does ("1s", "6m0s", "12ms"):
// a Go duration rounded up to the millisecond.
func FormatReset(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return time.Duration(ceilDiv(int64(d), int64(time.Millisecond)) * int64(time.Millisecond)).String()
}

// keyState is one limited key's buckets and slots. limits are the key's
// configured limits; local is this replica's part of them, which the
// buckets and max_concurrent hold to: the whole of them, unless the key's
// limits are shared across a fleet (fleet.go). asked counts the requests
// asked since the fleet's last tick.
type keyState struct {
	mu       sync.Mutex
	limits   Limits
	local    Limits
	raises   [3]raise // pending raises of local, by limit (fleet.go)
	requests bucket
	tokens   bucket
	inflight *slots
	asked    int64
}

// slots counts a key's requests in flight. A reload that changes the
// key's limits hands its new state the same slots, so that a request
// admitted on the old state and released on the new (or the other way)
// is counted and freed once.
type slots struct{ n atomic.Int64 }

// take takes a slot, unless max (> 0) are taken.
func (s *slots) take(max int) bool {
	for {
		n := s.n.Load()
		if max > 0 && n >= int64(max) {
			return false
		}
		if s.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// give frees a slot.
func (s *slots) give() {
	for {
		n := s.n.Load()
		if n <= 0 || s.n.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// Limiter holds the state of every limited key.
type Limiter struct {
	now  func() time.Time
	keys atomic.Pointer[map[string]*keyState] // replaced whole by SetLimits; read without a lock
	mu   sync.Mutex                           // serializes SetLimits and EnableFleet
	// fleet, when set, shares every key's limits with the other replicas
	// (fleet.go).
	fleet *fleet
}

// New returns a Limiter for limits (by key name; keys without limits are
// not limited). now is the clock; nil means time.Now.
func New(limits map[string]Limits, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	l := &Limiter{now: now}
	l.SetLimits(limits)
	return l
}

// newKeyState is a key's state under lim: its buckets full, or with
// shared limits empty (fleet.go: the fleet's burst is with the replicas
// that ran before).
func newKeyState(lim Limits, shared bool, now time.Time) *keyState {
	ks := &keyState{limits: lim, local: lim, inflight: &slots{}}
	if lim.RequestsPerMinute > 0 {
		ks.requests = newBucket(lim.RequestsPerMinute)
	}
	if lim.TokensPerMinute > 0 {
		ks.tokens = newBucket(lim.TokensPerMinute)
	}
	if shared {
		ks.requests = bucket{}.resize(ks.requests.limit, now)
		ks.tokens = bucket{}.resize(ks.tokens.limit, now)
	}
	return ks
}

// SetLimits puts limits (by key name) in place of the current ones (a
// reload). A key whose limits did not change keeps its state: what it
// used of its windows, its requests in flight. A key whose limits changed
// starts its windows full again under the new limits and keeps its count
// of requests in flight (their Done still frees their slots). A key no
// longer limited, or gone, is not limited from then on.
func (l *Limiter) SetLimits(limits map[string]Limits) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var old map[string]*keyState
	if p := l.keys.Load(); p != nil {
		old = *p
	}
	next := make(map[string]*keyState, len(limits))
	for name, lim := range limits {
		if lim.Zero() {
			continue
		}
		prev := old[name]
		if prev != nil {
			prev.mu.Lock()
			same := prev.limits == lim
			prev.mu.Unlock()
			if same {
				next[name] = prev
				continue
			}
			ks := newKeyState(lim, l.fleet != nil, l.now())
			ks.inflight = prev.inflight
			next[name] = ks
			continue
		}
		next[name] = newKeyState(lim, l.fleet != nil, l.now())
	}
	l.keys.Store(&next)
}

// state returns key's state, or nil when it is not limited.
func (l *Limiter) state(key string) *keyState {
	if p := l.keys.Load(); p != nil {
		return (*p)[key]
	}
	return nil
}

// Limited reports whether key has any limit.
func (l *Limiter) Limited(key string) bool {
	if l == nil {
		return false
	}
	return l.state(key) != nil
}

// Admit decides on one request of key that asks w of its tokens. When it
// is admitted it takes one request, one concurrency slot and its
// reservation (Decision.MaxTokens may be below w.MaxTokens with w.Clamp):
// settle Decision.Reservation once it is over. A refused request takes
// nothing. Every limit is checked so the headers are right; RetryAfter is
// the longest of the waits.
func (l *Limiter) Admit(key string, w Want) Decision {
	d := Decision{OK: true, MaxTokens: w.MaxTokens, Want: int(w.total())}
	if l == nil {
		return d
	}
	ks := l.state(key)
	if ks == nil {
		return d
	}
	now := l.now()
	ks.mu.Lock()
	defer ks.mu.Unlock()
	d.MaxConcurrent = ks.limits.MaxConcurrent
	ks.asked++
	refuse := func(limit string, wait time.Duration) {
		if d.OK || wait > d.RetryAfter {
			d.Limited = limit
			d.RetryAfter = max(wait, d.RetryAfter)
		}
		d.OK = false
	}
	maxConcurrent := 0
	if ks.limits.MaxConcurrent > 0 {
		maxConcurrent = ks.local.MaxConcurrent
		if ks.inflight.n.Load() >= int64(maxConcurrent) {
			refuse(LimitConcurrent, concurrentRetry)
		}
	}
	// With shared limits a replica may hold no part of one: it waits for
	// its share to grow with its demand.
	if ks.limits.TokensPerMinute > 0 && ks.tokens.limit == 0 {
		refuse(LimitTokens, l.noShareRetry())
	}
	if ks.limits.RequestsPerMinute > 0 && ks.requests.limit == 0 {
		refuse(LimitRequests, l.noShareRetry())
	}
	reserve := int64(0)
	if ks.tokens.limit > 0 {
		ks.tokens = ks.tokens.advance(now)
		reserve = w.total()
		prompt := int64(max(w.Prompt, 0))
		switch held := int64(ks.tokens.remaining()); {
		case max(reserve, 1) <= held:
		case w.Clamp && prompt < held:
			d.MaxTokens = int(held - prompt)
			reserve = held
		case reserve > int64(ks.limits.TokensPerMinute) && (!w.Clamp || prompt >= int64(ks.limits.TokensPerMinute)):
			// No wait makes it fit; a whole window keeps a retrying
			// client from hammering.
			d.TooLarge = true
			refuse(LimitTokens, max(Window, ks.tokens.reset()))
		case reserve > ks.tokens.limit && (!w.Clamp || prompt >= ks.tokens.limit):
			// It fits the key's limit but not this replica's share of it.
			refuse(LimitTokens, max(l.noShareRetry(), ks.tokens.reset()))
		case w.Clamp:
			refuse(LimitTokens, ks.tokens.wait(prompt+1))
		default:
			refuse(LimitTokens, ks.tokens.wait(max(reserve, 1)))
		}
	}
	if ks.requests.limit > 0 {
		ks.requests = ks.requests.advance(now)
		if w := ks.requests.wait(1); w > 0 {
			refuse(LimitRequests, w)
		}
	}
	// The slot is taken last, once nothing else refused: the old state of
	// a key being reloaded may take one of the same slots meanwhile.
	if d.OK && !ks.inflight.take(maxConcurrent) {
		refuse(LimitConcurrent, concurrentRetry)
	}
	if d.OK {
		if ks.requests.limit > 0 {
			ks.requests = ks.requests.charge(1)
		}
		if ks.tokens.limit > 0 {
			ks.tokens = ks.tokens.charge(reserve)
		}
		d.Reservation = &Reservation{l: l, ks: ks, held: reserve}
	}
	if ks.limits.RequestsPerMinute > 0 {
		d.Requests = ks.requests.status()
		d.Requests.Limit = ks.limits.RequestsPerMinute
	}
	if ks.limits.TokensPerMinute > 0 {
		d.Tokens = ks.tokens.status()
		d.Tokens.Limit = ks.limits.TokensPerMinute
	}
	return d
}

// Reservation is an admitted request's hold on its key's limits: its
// concurrency slot and the tokens taken for it. A nil Reservation (a key
// without limits) does nothing. It is safe for concurrent use.
type Reservation struct {
	l  *Limiter
	ks *keyState // the state it was taken from; a reload may replace it

	// held is the tokens on the bucket for this request (the reservation,
	// raised by Use); settled: Settle ran. Both under ks.mu.
	held    int64
	settled bool
}

// Use reports that the request has used tokens so far (prompt + completion,
// a running total) and whether it may go on. Tokens beyond the reservation
// are taken as they are reported; Use reports false, taking nothing more,
// once they would put the key's bucket more than MaxDebt windows below
// empty: the request should stop there.
func (r *Reservation) Use(tokens int) bool {
	if r == nil {
		return true
	}
	n := int64(max(tokens, 0))
	ks := r.ks
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.tokens.limit == 0 || n <= r.held || r.settled {
		return true
	}
	ks.tokens = ks.tokens.advance(r.l.now())
	extra := n - r.held
	if ks.tokens.debt+extra*windowMicros > (MaxDebt+1)*ks.tokens.full() {
		return false
	}
	ks.tokens = ks.tokens.charge(extra)
	r.held = n
	return true
}

// Settle ends the request: it frees its concurrency slot and replaces the
// tokens held for it by tokens, what it really used (prompt + completion;
// estimated when the engine reported none). Only the first call counts.
func (r *Reservation) Settle(tokens int) {
	if r == nil {
		return
	}
	now := r.l.now()
	ks := r.ks
	ks.mu.Lock()
	if r.settled {
		ks.mu.Unlock()
		return
	}
	r.settled = true
	if ks.tokens.limit > 0 {
		ks.tokens = ks.tokens.advance(now).settle(r.held, int64(max(tokens, 0)))
	}
	ks.mu.Unlock()
	// The key's states share their slots across reloads.
	ks.inflight.give()
}
