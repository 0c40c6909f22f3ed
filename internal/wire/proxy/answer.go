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

	"github.com/tlgate/tlgate/internal/wire/openai"
)

// Failures of an engine's answer itself. Both are retryable before commit:
// another worker may answer properly.
const (
	// FailStatus5xx: the engine answered a 5xx other than 503.
	FailStatus5xx Failure = "status_5xx"
	// FailBadAnswer: the answer is neither an OpenAI-shaped success nor an
	// OpenAI-shaped client error (a 1xx or 3xx, the engine's own 401, 403 or
	// 407, a body that is not the JSON it should be, a non-SSE answer to a
	// streamed request, a malformed SSE line).
	FailBadAnswer Failure = "bad_answer"
	// FailTruncated: a non-streamed answer whose body ended before its
	// end (shorter than its Content-Length, or its chunked encoding cut),
	// after the engine had sent its status and headers.
	FailTruncated Failure = "truncated"
)

var (
	errBadAnswer = errors.New("proxy: the engine's answer is not OpenAI-shaped")
	errBadSSE    = errors.New("proxy: the engine's stream has a line that is not SSE")
)

// IsAnswerFailure reports whether err is an attempt that failed on what the
// engine answered (FailStatus5xx, FailBadAnswer, FailTruncated) rather than
// on reaching it: a client whose attempts all fail so is answered 502
// upstream_failed, not 503 no_capacity.
func IsAnswerFailure(err error) bool {
	return IsWrongAnswer(err) || ReasonOf(err) == FailTruncated
}

// IsWrongAnswer reports whether err is an attempt whose engine answered
// in full but wrongly (FailStatus5xx, FailBadAnswer): what the model's
// server said, not a connection that broke, so a cascade's next, larger
// model may well answer where this one did not.
func IsWrongAnswer(err error) bool {
	r := ReasonOf(err)
	return r == FailStatus5xx || r == FailBadAnswer
}

// excerpt is the start of an engine's body for an error (the log's, never
// the client's).
func excerpt(b []byte) string {
	const n = 200
	if len(b) > n {
		return fmt.Sprintf("%q...", b[:n])
	}
	return fmt.Sprintf("%q", b)
}

// readAnswer reads a whole non-streamed answer: at most MaxResponseBytes,
// each read within IdleTimeout of the previous one (wait is the attempt's
// timer, already running; it is reset after every read).
func (p *Proxy) readAnswer(ctx, actx context.Context, resp *http.Response, wait *time.Timer) ([]byte, error) {
	limit := p.o.MaxResponseBytes
	if resp.ContentLength > limit {
		return nil, &AttemptError{Reason: FailTooLarge,
			Err: fmt.Errorf("proxy: answer of %d bytes is over the %d-byte limit", resp.ContentLength, limit)}
	}
	var buf bytes.Buffer
	if resp.ContentLength > 0 {
		buf.Grow(int(resp.ContentLength))
	}
	body := io.LimitReader(resp.Body, limit+1)
	wait.Reset(p.o.IdleTimeout)
	for {
		buf.Grow(4 << 10)
		b := buf.AvailableBuffer()
		n, err := body.Read(b[:cap(b)])
		buf.Write(b[:n])
		if n > 0 {
			wait.Reset(p.o.IdleTimeout)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			ae := classify(ctx, actx, err, false)
			if ae.Reason == FailEOF { // the status and headers had come
				ae.Reason = FailTruncated
			}
			return nil, ae
		}
	}
	wait.Stop()
	if int64(buf.Len()) > limit {
		return nil, &AttemptError{Reason: FailTooLarge,
			Err: fmt.Errorf("proxy: answer is over the %d-byte limit", limit)}
	}
	return buf.Bytes(), nil
}

// checkAnswer decides what a whole non-streamed answer is. A 2xx with a
// JSON object of the shape expect calls for ("choices" for a completion;
// openai.Endpoint.AnswerOK) is relayed as it is. A 4xx carrying an
// error (OpenAI's {"error":{"message":...}}, or {"object":"error",
// "message":...} as some engines send) is relayed re-encoded in OpenAI's
// shape, with the engine's status, message, param and code. Anything else
// is an *AttemptError whose message holds the detail for the log: a 5xx
// (FailStatus5xx), or FailBadAnswer for a 1xx or 3xx, the engine's own 401,
// 403 or 407 (the engine refusing the gateway says nothing about the
// client's key), or a body that is not what its status calls for. A 404
// or 405 whose body is not an OpenAI error (FastAPI's {"detail":"Not
// Found"}, a plain-text page) is the engine refusing the path: relayed as
// the engine's answer with code unsupported_endpoint, neither a failure
// nor a reason to try another worker.
// A Dialect (d, not nil) judges successes and encodes errors for its API.
func checkAnswer(resp *http.Response, body []byte, expect openai.Endpoint, d *Dialect) (*Response, error) {
	st := resp.StatusCode
	bad := func(reason Failure, what string) error {
		return &AttemptError{Reason: reason, Err: fmt.Errorf("%w: %d %s with %s body %s",
			errBadAnswer, st, what, resp.Header.Get("Content-Type"), excerpt(body))}
	}
	switch {
	case st >= 500:
		return nil, bad(FailStatus5xx, "(server error)")
	case st >= 200 && st < 300:
		if !gjson.ValidBytes(body) {
			return nil, bad(FailBadAnswer, "(not JSON)")
		}
		if root := gjson.ParseBytes(body); !d.success(root, expect) {
			return nil, bad(FailBadAnswer, "(not the answer its path calls for)")
		}
		return &Response{Status: st, Header: resp.Header, Body: body}, nil
	case st == http.StatusUnauthorized || st == http.StatusForbidden || st == http.StatusProxyAuthRequired:
		return nil, bad(FailBadAnswer, "(the engine refused the gateway)")
	case st >= 400 && st < 500:
		e, ok := engineError(body)
		if !ok && (st == http.StatusNotFound || st == http.StatusMethodNotAllowed) {
			e, ok = refusedPath(resp, body), true
		}
		if !ok {
			return nil, bad(FailBadAnswer, "(not an OpenAI error)")
		}
		h := http.Header{"Content-Type": {"application/json"}}
		return &Response{Status: st, Header: h, Body: d.encodeError(st, e.code(st), e.msg, e.param)}, nil
	default:
		return nil, bad(FailBadAnswer, "(not a final answer)")
	}
}

// refusedPath is the error relayed for an engine's 404 or 405 that is not
// an OpenAI error: the engine does not serve the path (or the method).
func refusedPath(resp *http.Response, body []byte) engineErr {
	path := "this path"
	if resp.Request != nil && resp.Request.URL != nil {
		path = resp.Request.Method + " " + resp.Request.URL.Path
		if resp.Request.URL.Path == "" {
			path += "/"
		}
	}
	msg := fmt.Sprintf("The engine serving this model does not serve %s (it answered %d %s", path,
		resp.StatusCode, http.StatusText(resp.StatusCode))
	if d := gjson.GetBytes(body, "detail"); d.Type == gjson.String && d.Str != "" && len(d.Str) <= 200 {
		msg += ": " + d.Str
	}
	return engineErr{msg: msg + ").", errCode: openai.CodeUnsupportedEndpoint}
}

// engineErr is the error an engine answered.
type engineErr struct {
	msg, errCode string
	param        *string
}

func (e engineErr) code(status int) string {
	switch {
	case e.errCode != "":
		return e.errCode
	case status == http.StatusNotFound:
		return openai.CodeModelNotFound
	case status == http.StatusTooManyRequests:
		return "rate_limit_exceeded"
	}
	return openai.CodeInvalidRequest
}

// engineError reads an error body: {"error":{"message":...}} or
// {"object":"error","message":...}; code is kept when it is a string.
func engineError(body []byte) (engineErr, bool) {
	if !gjson.ValidBytes(body) {
		return engineErr{}, false
	}
	root := gjson.ParseBytes(body)
	e := root.Get("error")
	if !e.IsObject() {
		if root.Get("object").Str != "error" {
			return engineErr{}, false
		}
		e = root
	}
	m := e.Get("message")
	if m.Type != gjson.String || m.Str == "" {
		return engineErr{}, false
	}
	out := engineErr{msg: m.Str}
	if c := e.Get("code"); c.Type == gjson.String {
		out.errCode = c.Str
	}
	if p := e.Get("param"); p.Type == gjson.String {
		out.param = &p.Str
	}
	return out, true
}

// notSSE handles an answer to a streamed request that is not an SSE stream
// (see Stream): nothing of it reaches the client.
func (p *Proxy) notSSE(ctx, actx context.Context, resp *http.Response, wait *time.Timer, expect openai.Endpoint, d *Dialect) Result {
	res := Result{Status: resp.StatusCode}
	var err error
	if resp.StatusCode/100 == 2 {
		discard(resp.Body)
		err = &AttemptError{Reason: FailBadAnswer, Err: fmt.Errorf("%w: %d with Content-Type %q to a streamed request",
			errBadAnswer, resp.StatusCode, resp.Header.Get("Content-Type"))}
	} else {
		var body []byte
		if body, err = p.readAnswer(ctx, actx, resp, wait); err == nil {
			res.Answer, err = checkAnswer(resp, body, expect, d)
		}
	}
	if err != nil {
		res.Err = err
		res.ClientGone = ReasonOf(err) == FailCanceled
	}
	return res
}
