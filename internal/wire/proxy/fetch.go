package proxy

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"
)

// Fetch sends a non-streamed attempt and reads the engine's answer whole.
// The engine's first byte (its headers) must come within FirstByteTimeout,
// each further read within IdleTimeout of the previous one, and the whole
// answer within ResponseTimeout; it is bounded by MaxResponseBytes. An
// engine generates a non-streamed answer before its first byte, so
// FirstByteTimeout bounds the generation too.
//
// Fetch never touches the client, so every failure is uncommitted and,
// except FailTooLarge (an answer over MaxResponseBytes) and FailCanceled
// (the client went away), retryable: refused, reset, a timeout, a truncated
// body, a 503 (FailStatus503) or other 5xx (FailStatus5xx), or an answer
// that is neither an OpenAI-shaped success nor an OpenAI-shaped client error
// (FailBadAnswer; see checkAnswer). What it returns is a 2xx completion to
// relay as it is, or a 4xx error re-encoded in OpenAI's shape. A
// FirstByteTimeout before the engine's headers is marked Generating: the
// engine may simply be generating a long answer.
func (p *Proxy) Fetch(ctx context.Context, a Attempt) (*Response, error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	total := time.AfterFunc(p.o.ResponseTimeout, func() { cancel(errTimeout) })
	defer total.Stop()
	var headed atomic.Bool // the engine's status and headers came
	wait := time.AfterFunc(p.o.FirstByteTimeout, func() {
		if headed.Load() {
			cancel(errTimeout)
		} else {
			cancel(errGenerating)
		}
	})
	defer wait.Stop()

	req, err := newRequest(actx, a, "application/json")
	if err != nil {
		return nil, err
	}
	resp, err := p.do(req)
	if err != nil {
		ae := classify(ctx, actx, err, false)
		ae.Generating = ae.Reason == FailTimeout && errors.Is(context.Cause(actx), errGenerating)
		return nil, ae
	}
	headed.Store(true)
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusServiceUnavailable {
		discard(resp.Body)
		return nil, &AttemptError{Reason: FailStatus503, Err: err503}
	}
	body, err := p.readAnswer(ctx, actx, resp, wait)
	if err != nil {
		return nil, err
	}
	return checkAnswer(resp, body, a.Expect, a.dialectOf())
}
