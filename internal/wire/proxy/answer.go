package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/wire/dialect"
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
	// FailEngineError: the engine answered a 5xx other than 502, 503 and
	// 504 with an OpenAI-shaped error body. It is the engine's answer to
	// this request (llama-server answers 500 to some bad requests), which
	// may be the request's fault as well as the engine's: the caller tries
	// it once more elsewhere and relays it (AttemptError.Answer) when the
	// second worker answers an error too.
	FailEngineError Failure = "engine_error"
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
// in full but wrongly (FailStatus5xx, FailBadAnswer, FailEngineError):
// what the model's server said, not a connection that broke, so a
// cascade's next, larger model may well answer where this one did not.
func IsWrongAnswer(err error) bool {
	r := ReasonOf(err)
	return r == FailStatus5xx || r == FailBadAnswer || r == FailEngineError
}

// EngineAnswer returns the OpenAI-shaped error an engine answered, when
// err is a FailEngineError attempt: the client's answer once a second
// worker answered an error too.
func EngineAnswer(err error) *Response {
	var ae *AttemptError
	if errors.As(err, &ae) && ae.Reason == FailEngineError {
		return ae.Answer
	}
	return nil
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
		// One byte over the length: the read that finds the end fits.
		buf.Grow(int(resp.ContentLength) + 1)
	}
	body := io.LimitReader(resp.Body, limit+1)
	wait.Reset(p.o.IdleTimeout)
	for {
		if buf.Available() == 0 {
			buf.Grow(4 << 10)
		}
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
// The dialect d judges successes and encodes errors for its API. A 2xx
// answer is read once (dialect.Read), into Response.Answer.
func checkAnswer(resp *http.Response, body []byte, expect openai.Endpoint, d *dialect.Dialect) (*Response, error) {
	st := resp.StatusCode
	bad := func(reason Failure, what string) error {
		return &AttemptError{Reason: reason, Err: fmt.Errorf("%w: %d %s with %s body %s",
			errBadAnswer, st, what, resp.Header.Get("Content-Type"), excerpt(body))}
	}
	switch {
	case st >= 500:
		if st != http.StatusBadGateway && st != http.StatusServiceUnavailable && st != http.StatusGatewayTimeout {
			if e, ok := engineError(body); ok {
				ae := bad(FailEngineError, "(an error answer)").(*AttemptError)
				ae.Answer = e.response(st, d)
				return nil, ae
			}
		}
		return nil, bad(FailStatus5xx, "(server error)")
	case st >= 200 && st < 300:
		r := &Response{Status: st, Header: resp.Header, Body: body, Answer: dialect.Read(body)}
		if !r.Answer.JSON() {
			return nil, bad(FailBadAnswer, "(not JSON)")
		}
		if !d.Success(&r.Answer, expect) {
			return nil, bad(FailBadAnswer, "(not the answer its path calls for)")
		}
		return r, nil
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
		return e.response(st, d), nil
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
	msg, errCode, typ string
	param             *string
}

// clientTypes are the error types that say the request is at fault, and
// the 4xx status each is relayed with when an engine answered it with a
// 5xx.
var clientTypes = map[string]int{
	"invalid_request_error":     http.StatusBadRequest,
	"exceed_context_size_error": http.StatusBadRequest,
	"not_found_error":           http.StatusNotFound,
	"BadRequestError":           http.StatusBadRequest, // vLLM's
	"NotFoundError":             http.StatusNotFound,
}

// genericTypes are OpenAI's own error types, which say no more than the
// status does: they never become the relayed code.
var genericTypes = map[string]bool{
	"invalid_request_error": true, "server_error": true, "not_found_error": true,
	"authentication_error": true, "permission_error": true, "rate_limit_error": true, "api_error": true,
	"BadRequestError": true, "NotFoundError": true, "InternalServerError": true, // vLLM's
}

// response is the error re-encoded in OpenAI's shape for a client: the
// engine's status (a 5xx whose type says the request is at fault becomes
// that type's 4xx), code and param, and its message.
func (e engineErr) response(status int, d *dialect.Dialect) *Response {
	if st, ok := clientTypes[e.typ]; ok && status >= 500 {
		status = st
	}
	h := http.Header{"Content-Type": {"application/json"}}
	return &Response{Status: status, Header: h, Body: d.EncodeError(status, e.code(status), e.msg, e.param)}
}

// code is the engine's code when it is a string, else its type when that
// says more than OpenAI's generic types (exceed_context_size_error), else
// the gateway's code for the status.
func (e engineErr) code(status int) string {
	switch {
	case e.errCode != "":
		return e.errCode
	case e.typ != "" && !genericTypes[e.typ]:
		return e.typ
	case status == http.StatusNotFound:
		return openai.CodeModelNotFound
	case status == http.StatusTooManyRequests:
		return "rate_limit_exceeded"
	case status >= 500:
		return "engine_error"
	}
	return openai.CodeInvalidRequest
}

// engineError reads an error body: {"error":{"message":...}} or
// {"object":"error","message":...}; code is kept when it is a string, and
// the error's other numeric fields (llama-server's n_prompt_tokens and
// n_ctx) are appended to the message.
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
	if t := e.Get("type"); t.Type == gjson.String && isToken(t.Str) {
		out.typ = t.Str
	}
	var nums []string
	e.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "message", "type", "code", "param", "object":
		default:
			if v.Type == gjson.Number && isToken(k.Str) && len(nums) < 8 {
				nums = append(nums, k.Str+": "+v.Raw)
			}
		}
		return true
	})
	if len(nums) > 0 {
		out.msg += " (" + strings.Join(nums, ", ") + ")"
	}
	if p := e.Get("param"); p.Type == gjson.String {
		out.param = &p.Str
	}
	return out, true
}

// isToken reports whether s is a short identifier ([A-Za-z0-9_.-]{1,64}),
// fit to become an error's code or a field named in its message.
func isToken(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// notSSE handles an answer to a streamed request that is not an SSE stream
// (see Stream): nothing of it reaches the client.
func (p *Proxy) notSSE(ctx, actx context.Context, resp *http.Response, wait *time.Timer, expect openai.Endpoint, d *dialect.Dialect) Result {
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
