package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/sse"
)

// Result is the outcome of a streamed attempt.
type Result struct {
	// Committed is true once bytes were written to the client: the request
	// must not be retried, whatever Err says.
	Committed bool
	// ClientGone is true when the client went away (its context ended or a
	// write to it failed); the upstream request was canceled at once.
	ClientGone bool
	// Done is true when the stream finished: an SSE stream relayed through
	// its "data: [DONE]" event, any other body relayed to its clean end.
	Done bool
	// Status is the engine's HTTP status (0 if none arrived).
	Status int
	// Err is nil when Done; otherwise an *AttemptError (see Retryable).
	Err error
	// FirstByte is the time from the call to the commit.
	FirstByte time.Duration
	// Events counts the SSE events relayed, [DONE] included (comment-only
	// blocks such as ": keep-alive" are relayed but not counted).
	Events int
	// Bytes counts the engine's bytes relayed (not the SSE error event).
	Bytes int64
	// Answer, when set, is an engine's OpenAI-shaped error answer to relay
	// instead of a stream (Committed false, Err nil): see Stream.
	Answer *Response
}

// doneGrace bounds reading the end of an engine's response after its
// [DONE] event, which lets the connection return to the pool.
const doneGrace = time.Second

// Stream sends a streamed attempt and relays the engine's answer to w.
//
// The commitment boundary is the first write to the client. Before it, any
// failure (refused, reset, FirstByteTimeout, a 503 or other 5xx answer, an
// engine that closes before its first complete SSE event, a malformed one)
// returns Result{Committed: false} with a retryable Err and w untouched.
// The attempt commits when the first complete SSE event has arrived, unless
// that event is the engine's error (errorFirst: judged as the same error
// answered whole would be, uncommitted): Stream then sets Content-Type, Cache-Control: no-cache on w, calls
// commit(status, engine header) once so the caller can set its own headers
// (X-Request-Id, X-TL-Route) and learn that it committed, writes the
// status, and relays. commit may be nil.
//
// Only SSE answers (2xx, Content-Type text/event-stream or none) are
// streamed: event by event as they arrive, flushed after each read, whole
// events only, without buffering the stream; a comment-only block (":
// keep-alive") is relayed but does not commit. Nothing after the [DONE]
// event is relayed. After commit, a failure (reset, an end without "data:
// [DONE]", IdleTimeout between reads, an event over MaxEventBytes, a line
// that is not SSE) writes exactly one SSE event `data:
// {"error":{...,"code":"upstream_failed"}}` and returns Committed with Err;
// no [DONE] follows. Garbage inside a stream is not relayed: a line other
// than a field (data:, event:, id:, retry:) or a comment is FailBadAnswer,
// before commit (retryable) or after (the error event).
//
// Any other answer is never relayed as it arrives: a 2xx that is not SSE is
// FailBadAnswer (an engine that ignored "stream"), and a 4xx or 5xx is read
// whole and judged as Fetch judges it: an OpenAI-shaped client error comes
// back in Result.Answer for the caller to relay, anything else is a
// retryable Err (FailStatus5xx, FailBadAnswer), with w untouched.
//
// If ctx ends or a write to the client fails, the upstream request is
// canceled at once and the Result has ClientGone.
func (p *Proxy) Stream(ctx context.Context, a Attempt, w http.ResponseWriter, commit func(status int, h http.Header)) Result {
	start := time.Now()
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := time.AfterFunc(p.o.FirstByteTimeout, func() { cancel(errTimeout) })
	defer timer.Stop()

	req, err := newRequest(actx, a, "text/event-stream")
	if err != nil {
		return Result{Err: err}
	}
	resp, err := p.do(req)
	if err != nil {
		ae := classify(ctx, actx, err, false)
		return Result{Err: ae, ClientGone: ae.Reason == FailCanceled}
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusServiceUnavailable {
		discard(resp.Body)
		return Result{Status: resp.StatusCode, Err: &AttemptError{Reason: FailStatus503, Err: err503}}
	}
	if resp.StatusCode/100 != 2 || !isEventStream(resp.Header.Get("Content-Type")) {
		return p.notSSE(ctx, actx, resp, timer, a.Expect, a.dialectOf())
	}
	r := relay{
		p: p, ctx: ctx, actx: actx, cancel: cancel, timer: timer, start: start,
		w: w, commitFn: commit, resp: resp, d: a.dialectOf(),
	}
	r.ew, _ = w.(sse.EventWriter)
	r.res.Status = resp.StatusCode
	bp := p.bufs.Get().(*[]byte)
	r.events(*bp)
	p.bufs.Put(bp)
	r.clearWriteDeadline()
	return r.res
}

func isEventStream(ct string) bool {
	if ct == "" {
		return true
	}
	return sse.IsEventStream(ct)
}

// relay is the state of one Stream after the engine's headers arrived.
type relay struct {
	p         *Proxy
	ctx, actx context.Context
	cancel    context.CancelCauseFunc
	timer     *time.Timer
	start     time.Time
	w         http.ResponseWriter
	rc        *http.ResponseController
	commitFn  func(int, http.Header)
	resp      *http.Response
	d         *dialect.Dialect
	ew        sse.EventWriter // w, when it takes framed events
	res       Result
	seq       int64     // the sequence number after the relayed events' (Dialect.Sequenced)
	deadline  time.Time // the client's write deadline, as last set (zero: none set)
}

// events relays an SSE body, whole events at a time, framing each once
// (sse.Scanner): an EventWriter is handed the events it found. b is the
// initial buffer; it grows (up to about twice MaxEventBytes) for large
// events.
func (r *relay) events(b []byte) {
	sc := sse.Scanner{Ends: r.d.Ends()}
	filled := 0
	for {
		if filled == len(b) {
			nb := make([]byte, 2*len(b))
			copy(nb, b[:filled])
			b = nb
		}
		n, rerr := r.resp.Body.Read(b[filled:])
		if n > 0 && r.res.Committed {
			r.timer.Stop()
		}
		filled += n
		end, endEvent, done := sc.Scan(b[:filled])
		if !r.res.Committed && endEvent == 0 {
			end = 0 // comments alone do not commit
		}
		if end > 0 {
			evs := sc.Take()
			if !r.res.Committed {
				r.timer.Stop()
				if r.errorFirst(b, evs) {
					return
				}
				r.commit()
			}
			if !r.write(b[:end], evs) {
				return
			}
			if r.d.Sequenced() {
				for _, ev := range evs {
					r.seq = openai.NextSequenceNumber(ev.Data(b), r.seq)
				}
			}
			r.res.Events += len(evs)
			if done {
				r.res.Done = true
				r.drain()
				return
			}
			filled = copy(b, b[end:filled])
			sc.Shift(end)
		}
		if sc.Bad {
			r.failWith(FailBadAnswer, errBadSSE)
			return
		}
		switch {
		case rerr == io.EOF && r.res.Committed:
			r.failWith(FailEOF, errNoDone)
			return
		case rerr == io.EOF:
			r.failWith(FailEOF, errEmpty)
			return
		case rerr != nil:
			r.fail(rerr)
			return
		case filled > r.p.o.MaxEventBytes:
			r.failWith(FailTooLarge, fmt.Errorf("proxy: an SSE event is over the %d-byte limit", r.p.o.MaxEventBytes))
			return
		}
		if r.res.Committed && n > 0 {
			r.timer.Reset(r.p.o.IdleTimeout)
		}
	}
}

// errorFirst reports whether a stream's first events (evs, in b) start
// with an error event, and if so ends the relay with it uncommitted, as
// the engine's answer: vLLM and SGLang report a failure of the request
// (their engine core's, a KV load's) as a stream whose first event is
// their error, in the API's shape, then [DONE]. Nothing of it reaches the
// client: it is what a non-streamed answer with that error and its code's
// status would be (checkAnswer), a 5xx one tried on another worker.
func (r *relay) errorFirst(b []byte, evs []sse.Event) bool {
	if len(evs) == 0 {
		return false
	}
	data := evs[0].Data(b)
	if !bytes.Contains(data, errorKey) {
		return false
	}
	e, ok := engineError(data)
	if !ok {
		return false
	}
	st := http.StatusInternalServerError
	if c := gjson.GetBytes(data, "error.code"); c.Type == gjson.Number && c.Num >= 400 && c.Num < 600 {
		st = int(c.Num)
	}
	r.res.Status = st
	what := fmt.Errorf("%w: a stream whose first event is an error (%d): %s", errBadAnswer, st, excerpt(data))
	switch {
	case st < 500:
		r.res.Answer = e.response(st, r.d)
	case st == http.StatusBadGateway || st == http.StatusServiceUnavailable || st == http.StatusGatewayTimeout:
		r.end(&AttemptError{Reason: FailStatus5xx, Err: what})
	default:
		r.end(&AttemptError{Reason: FailEngineError, Err: what, Answer: e.response(st, r.d)})
	}
	return true
}

// errorKey is in the data of every error event engines send.
var errorKey = []byte(`"error"`)

// commit sets the response headers, lets the caller add its own, and
// writes the status.
func (r *relay) commit() {
	h := r.w.Header()
	ct := r.resp.Header.Get("Content-Type")
	if ct == "" {
		ct = "text/event-stream"
	}
	h.Set("Content-Type", ct)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	if r.commitFn != nil {
		r.commitFn(r.res.Status, r.resp.Header)
	}
	r.res.Committed = true
	r.res.FirstByte = time.Since(r.start)
	r.rc = http.NewResponseController(r.w)
	r.w.WriteHeader(r.res.Status)
}

// clearWriteDeadline undoes the client's write deadline once the relay is
// over: the client's connection may carry its next request.
func (r *relay) clearWriteDeadline() {
	if !r.deadline.IsZero() {
		_ = r.rc.SetWriteDeadline(time.Time{})
	}
}

// writeDeadline gives the client's next write at least ClientWriteTimeout,
// and at most an eighth more: a client that stops reading for that long is
// gone, and its slot and the engine's work are freed instead of held for
// ever. The deadline is set with that eighth of slack and renewed only
// when less than the timeout is left, so that a stream's writes, a few
// milliseconds apart, do not each set it.
func (r *relay) writeDeadline() {
	t := r.p.o.ClientWriteTimeout
	if t <= 0 {
		return
	}
	if now := time.Now(); r.deadline.Sub(now) < t {
		r.deadline = now.Add(t + t/8)
		_ = r.rc.SetWriteDeadline(r.deadline)
	}
}

// write sends p, whole blocks whose events are evs, to the client and
// flushes. It reports false, after canceling the upstream request, when
// the client is gone.
func (r *relay) write(p []byte, evs []sse.Event) bool {
	r.writeDeadline()
	if len(p) > 0 {
		var n int
		var err error
		if r.ew != nil {
			n, err = r.ew.WriteEvents(p, evs)
		} else {
			n, err = r.w.Write(p)
		}
		r.res.Bytes += int64(n)
		if err != nil {
			r.clientGone(err)
			return false
		}
	}
	if err := r.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		r.clientGone(err)
		return false
	}
	return true
}

func (r *relay) clientGone(err error) {
	r.cancel(errClientWrite)
	r.res.ClientGone = true
	r.res.Err = &AttemptError{Reason: FailCanceled, Committed: r.res.Committed, Err: fmt.Errorf("%w: %w", errClientWrite, err)}
}

// fail ends the relay on a read error from the engine.
func (r *relay) fail(err error) {
	r.end(classify(r.ctx, r.actx, err, r.res.Committed))
}

func (r *relay) failWith(reason Failure, err error) {
	r.end(&AttemptError{Reason: reason, Committed: r.res.Committed, Err: err})
}

// end records a failure; after commit of an SSE stream it writes the one
// SSE error event, unless the client is gone.
func (r *relay) end(ae *AttemptError) {
	r.cancel(ae.Err)
	r.res.Err = ae
	if ae.Reason == FailCanceled {
		r.res.ClientGone = true
		return
	}
	if !r.res.Committed {
		return
	}
	// The last write's deadline may be spent: an engine that stalls for
	// IdleTimeout outlasts a ClientWriteTimeout as long, and the error
	// event would be lost, the stream ending as if it were complete.
	r.writeDeadline()
	if _, err := r.w.Write(r.d.ErrorEvent(string(ae.Reason), r.seq)); err != nil {
		r.res.ClientGone = true
		return
	}
	if err := r.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		r.res.ClientGone = true
	}
}

// drain reads what follows [DONE] (normally only the end of the chunked
// body) so the connection can be reused; it is never relayed.
func (r *relay) drain() {
	r.timer.Reset(min(r.p.o.IdleTimeout, doneGrace))
	_, _ = io.CopyN(io.Discard, r.resp.Body, 64<<10)
}
