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
// A request takes one from the requests bucket when it is admitted. Tokens
// are not known until the answer ends, so a request is admitted while the
// tokens bucket holds at least one token, and its usage (prompt +
// completion) is charged when it is done; the bucket may go below empty
// (a debt, bounded to MaxDebt), and the key then waits until it is repaid.
// max_concurrent bounds how far a key can overshoot that way.
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
// many windows of refill. A usage figure beyond it (a lying engine) costs no
// more.
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
}

// Message is the error message of a refused request.
func (d Decision) Message(key string) string {
	switch d.Limited {
	case LimitConcurrent:
		return fmt.Sprintf("Rate limit reached for key %q: at most %d concurrent requests. Retry when one finishes.", key, d.MaxConcurrent)
	case LimitTokens:
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

// keyState is one limited key's buckets and slots.
type keyState struct {
	mu       sync.Mutex
	limits   Limits
	requests bucket
	tokens   bucket
	inflight int
}

// Limiter holds the state of every limited key.
type Limiter struct {
	now  func() time.Time
	keys atomic.Pointer[map[string]*keyState] // replaced whole by SetLimits; read without a lock
	mu   sync.Mutex                           // serializes SetLimits
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

func newKeyState(lim Limits) *keyState {
	ks := &keyState{limits: lim}
	if lim.RequestsPerMinute > 0 {
		ks.requests = newBucket(lim.RequestsPerMinute)
	}
	if lim.TokensPerMinute > 0 {
		ks.tokens = newBucket(lim.TokensPerMinute)
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
			inflight := prev.inflight
			prev.mu.Unlock()
			if same {
				next[name] = prev
				continue
			}
			ks := newKeyState(lim)
			ks.inflight = inflight
			next[name] = ks
			continue
		}
		next[name] = newKeyState(lim)
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

// Admit decides on one request of key. When it is admitted it takes one
// request and one concurrency slot: call Done once it is over. A refused
// request takes nothing. Every limit is checked so the headers are right;
// RetryAfter is the longest of the waits.
func (l *Limiter) Admit(key string) Decision {
	if l == nil {
		return Decision{OK: true}
	}
	ks := l.state(key)
	if ks == nil {
		return Decision{OK: true}
	}
	now := l.now()
	ks.mu.Lock()
	defer ks.mu.Unlock()
	d := Decision{OK: true, MaxConcurrent: ks.limits.MaxConcurrent}
	refuse := func(limit string, wait time.Duration) {
		if d.OK || wait > d.RetryAfter {
			d.Limited = limit
			d.RetryAfter = max(wait, d.RetryAfter)
		}
		d.OK = false
	}
	if ks.limits.MaxConcurrent > 0 && ks.inflight >= ks.limits.MaxConcurrent {
		refuse(LimitConcurrent, concurrentRetry)
	}
	if ks.tokens.limit > 0 {
		ks.tokens = ks.tokens.advance(now)
		if w := ks.tokens.wait(1); w > 0 {
			refuse(LimitTokens, w)
		}
	}
	if ks.requests.limit > 0 {
		ks.requests = ks.requests.advance(now)
		if w := ks.requests.wait(1); w > 0 {
			refuse(LimitRequests, w)
		}
	}
	if d.OK {
		if ks.requests.limit > 0 {
			ks.requests = ks.requests.charge(1)
		}
		ks.inflight++
	}
	if ks.requests.limit > 0 {
		d.Requests = ks.requests.status()
	}
	if ks.tokens.limit > 0 {
		d.Tokens = ks.tokens.status()
	}
	return d
}

// Done ends an admitted request of key: it frees its concurrency slot and
// charges tokens (prompt + completion) to the key's tokens bucket.
func (l *Limiter) Done(key string, tokens int) {
	if l == nil {
		return
	}
	ks := l.state(key)
	if ks == nil {
		return
	}
	now := l.now()
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.inflight = max(ks.inflight-1, 0)
	if ks.tokens.limit > 0 && tokens > 0 {
		ks.tokens = ks.tokens.advance(now).charge(int64(tokens))
	}
}
