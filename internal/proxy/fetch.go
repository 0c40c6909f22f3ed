package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Fetch sends a non-streamed attempt and reads the engine's answer whole,
// bounded by MaxResponseBytes and ResponseTimeout. It never touches the
// client, so every failure is uncommitted: refused, reset, timeout, a 503
// answer or a truncated body give a retryable *AttemptError; an answer over
// MaxResponseBytes gives FailTooLarge and the client's own cancellation
// FailCanceled (neither retryable). Any other status (2xx, 4xx, other 5xx) is
// returned as a Response for the caller to pass through.
func (p *Proxy) Fetch(ctx context.Context, a Attempt) (*Response, error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := time.AfterFunc(p.o.ResponseTimeout, func() { cancel(errTimeout) })
	defer timer.Stop()

	req, err := newRequest(actx, a, "application/json")
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, classify(ctx, actx, err, false)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusServiceUnavailable {
		discard(resp.Body)
		return nil, &AttemptError{Reason: FailStatus503, Err: err503}
	}
	limit := p.o.MaxResponseBytes
	if resp.ContentLength > limit {
		return nil, &AttemptError{Reason: FailTooLarge,
			Err: fmt.Errorf("proxy: answer of %d bytes is over the %d-byte limit", resp.ContentLength, limit)}
	}
	var buf bytes.Buffer
	if resp.ContentLength > 0 {
		buf.Grow(int(resp.ContentLength))
	}
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, classify(ctx, actx, err, false)
	}
	if n > limit {
		return nil, &AttemptError{Reason: FailTooLarge,
			Err: fmt.Errorf("proxy: answer is over the %d-byte limit", limit)}
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: buf.Bytes()}, nil
}
