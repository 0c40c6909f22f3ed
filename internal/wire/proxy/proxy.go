// Package proxy sends one attempt of a client request to one engine and
// relays the answer, keeping the commitment boundary (the first byte written
// to the client): every failure before it is reported as
// retryable (the caller routes again, to another worker); after it nothing
// is retried, and a failed stream ends with one SSE error event and no
// [DONE]. Non-streamed answers are read whole before anything is written,
// so every engine failure on them is uncommitted.
//
// A Proxy is safe for concurrent use; each call handles one attempt and
// blocks until it is over, so callers run it off their mailbox.
package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// Defaults for zero Options fields.
const (
	DefaultConnectTimeout   = 3 * time.Second
	DefaultFirstByteTimeout = 60 * time.Second
	DefaultIdleTimeout      = 60 * time.Second
	DefaultResponseTimeout  = 10 * time.Minute
	DefaultMaxResponseBytes = 16 << 20
	DefaultMaxEventBytes    = 1 << 20
)

// relayBufSize is the initial relay buffer of a stream: most SSE events of a
// completion are a few hundred bytes, so one read usually holds several.
const relayBufSize = 4 << 10

// Options configures a Proxy. Zero fields take the Default values.
type Options struct {
	// Client sends the attempts. When nil, New builds one on a transport
	// pooled for many engines, dialing with ConnectTimeout. A given Client is
	// used as it is: leave its Timeout zero (the timeouts below apply) and
	// make it not follow redirects.
	Client *http.Client
	// ConnectTimeout bounds dialing an engine (built client only).
	ConnectTimeout time.Duration
	// FirstByteTimeout bounds a streamed attempt from sending the request to
	// the first complete SSE event: it covers an engine that accepts the
	// connection, or even sends headers, and then stalls.
	FirstByteTimeout time.Duration
	// IdleTimeout bounds the wait for more bytes of a committed stream.
	IdleTimeout time.Duration
	// ResponseTimeout bounds a non-streamed attempt from sending the request
	// to the last byte of the answer (the engine generates the whole answer
	// before its first byte).
	ResponseTimeout time.Duration
	// MaxResponseBytes bounds a non-streamed answer, which is read whole.
	MaxResponseBytes int64
	// MaxEventBytes bounds one SSE event, which the relay holds until it is
	// complete so that a client never receives half an event.
	MaxEventBytes int
	// ClientWriteTimeout bounds each write of a stream to the client (0:
	// none). A client that reads nothing for this long, up to an eighth
	// more, is treated as gone.
	ClientWriteTimeout time.Duration
	// TLS, when set, is the TLS configuration for https engines (built
	// client only).
	TLS *tls.Config
	// DialControl, when set, runs for every address a dial to an engine
	// tries, after name resolution and before connecting (built client
	// only); an error refuses the address (fleet.AddressPolicy.DialControl).
	DialControl func(network, address string, c syscall.RawConn) error
}

// Proxy sends attempts to engines.
type Proxy struct {
	o         Options
	client    *http.Client
	transport *http.Transport // nil with a caller's Client
	bufs      sync.Pool       // *[]byte of relayBufSize
}

// New returns a Proxy for o.
func New(o Options) *Proxy {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.ConnectTimeout, DefaultConnectTimeout)
	def(&o.FirstByteTimeout, DefaultFirstByteTimeout)
	def(&o.IdleTimeout, DefaultIdleTimeout)
	def(&o.ResponseTimeout, DefaultResponseTimeout)
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if o.MaxEventBytes <= 0 {
		o.MaxEventBytes = DefaultMaxEventBytes
	}
	p := &Proxy{o: o, client: o.Client}
	p.bufs.New = func() any { b := make([]byte, relayBufSize); return &b }
	if p.client == nil {
		p.transport = &http.Transport{
			Proxy: nil, // engines are reached directly, never through an environment proxy
			DialContext: (&net.Dialer{
				Timeout:   o.ConnectTimeout,
				KeepAlive: 30 * time.Second,
				Control:   o.DialControl,
			}).DialContext,
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: 256, // many concurrent streams to one engine
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true, // relay the engine's bytes as they are
			TLSClientConfig:     o.TLS,
			ReadBufferSize:      4 << 10, // per connection: thousands of open streams
			WriteBufferSize:     4 << 10,
		}
		p.client = &http.Client{
			Transport: p.transport,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		}
	}
	return p
}

// do sends req: on the proxy's own transport directly (it follows no
// redirect, so an http.Client would only add its allocations), else with
// the caller's Client. A transport error names the method and URL, as
// the Client's do.
func (p *Proxy) do(req *http.Request) (*http.Response, error) {
	if p.transport == nil {
		return p.client.Do(req)
	}
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		op := req.Method[:1] + strings.ToLower(req.Method[1:])
		return nil, &url.Error{Op: op, URL: req.URL.Redacted(), Err: err}
	}
	return resp, nil
}

// Close closes idle connections to engines. Attempts in progress are not
// affected.
func (p *Proxy) Close() { p.client.CloseIdleConnections() }

// Attempt is one try of a request against one engine.
type Attempt struct {
	// URL is the engine endpoint, e.g. "http://host:port/v1/chat/completions".
	URL string
	// Body is the request body as rewritten for this engine.
	Body []byte
	// RequestID and ClientRequestID are sent as X-Request-Id and, when
	// set, X-Client-Request-Id.
	RequestID, ClientRequestID string
	// Header holds extra upstream headers (X-TL-KV-Handle, the trace
	// context); the request uses its value slices, which it does not
	// modify.
	Header http.Header
	// Expect is the endpoint whose answer the attempt waits for: a 2xx
	// answer must have its shape (openai.Endpoint.AnswerOK). Empty: a
	// completion.
	Expect openai.Endpoint
	// Method is the HTTP method; empty: POST. A GET or DELETE sends no body.
	Method string
	// Dialect describes the API's answers; nil: OpenAI's
	// (dialect.OpenAI), whose successes Expect judges.
	Dialect *dialect.Dialect
}

// dialectOf is a's dialect.
func (a *Attempt) dialectOf() *dialect.Dialect {
	if a.Dialect == nil {
		return dialect.OpenAI
	}
	return a.Dialect
}

// Failure is why an attempt failed.
type Failure string

// The failures. Before commit, every failure but FailCanceled, FailTooLarge
// and FailInvalid is retryable on another worker.
const (
	FailRefused   Failure = "refused"    // connection refused
	FailReset     Failure = "reset"      // connection reset or broken
	FailTimeout   Failure = "timeout"    // connect, first-byte, idle or response timeout
	FailStatus503 Failure = "status_503" // the engine answered 503 (draining, full)
	FailEOF       Failure = "eof"        // the engine closed early: no answer, or a stream without [DONE] (a truncated whole answer is FailTruncated)
	FailTransport Failure = "transport"  // any other transport error
	FailTooLarge  Failure = "too_large"  // answer over MaxResponseBytes, or an event over MaxEventBytes
	FailCanceled  Failure = "canceled"   // the client went away (ctx done or a write to it failed)
	FailInvalid   Failure = "invalid"    // the attempt could not be sent (bad URL)
)

// AttemptError reports a failed attempt.
type AttemptError struct {
	Reason Failure
	// Committed is true when bytes had reached the client before the failure.
	Committed bool
	Err       error
	// Answer is, for FailEngineError, the engine's error re-encoded for
	// the client (see EngineAnswer).
	Answer *Response
	// Generating is set on a FailTimeout of a non-streamed attempt whose
	// engine sent nothing within FirstByteTimeout: it may be generating a
	// long answer rather than failing (see IsGenerating).
	Generating bool
}

// IsGenerating reports whether err is a non-streamed attempt that timed
// out before the engine's first byte (AttemptError.Generating).
func IsGenerating(err error) bool {
	var ae *AttemptError
	return errors.As(err, &ae) && ae.Generating
}

// Error implements error.
func (e *AttemptError) Error() string {
	phase := "before first byte"
	if e.Committed {
		phase = "after first byte"
	}
	return fmt.Sprintf("proxy: attempt failed %s (%s): %v", phase, e.Reason, e.Err)
}

// Unwrap returns the underlying error.
func (e *AttemptError) Unwrap() error { return e.Err }

// Retryable reports whether the request may be sent to another worker:
// nothing reached the client, the client is still there, and the failure is
// the engine's.
func (e *AttemptError) Retryable() bool {
	if e.Committed {
		return false
	}
	switch e.Reason {
	case FailRefused, FailReset, FailTimeout, FailStatus503, FailEOF, FailTransport, FailStatus5xx, FailBadAnswer, FailTruncated, FailEngineError:
		return true
	}
	return false
}

// IsRetryable reports whether err is an *AttemptError that is Retryable.
func IsRetryable(err error) bool {
	var ae *AttemptError
	return errors.As(err, &ae) && ae.Retryable()
}

// ReasonOf returns the Failure of an *AttemptError in err's chain, or "".
func ReasonOf(err error) Failure {
	var ae *AttemptError
	if errors.As(err, &ae) {
		return ae.Reason
	}
	return ""
}

// Response is a non-streamed engine answer, read whole.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// Answer is a 2xx answer as read once (Body's members): what cascades,
	// usage and stored responses take from it. Zero for an error answer.
	Answer dialect.Answer
}

var (
	errTimeout     = errors.New("proxy: engine timed out")
	errGenerating  = fmt.Errorf("%w: no first byte of a whole answer within the first-byte timeout", errTimeout)
	errClientWrite = errors.New("proxy: write to client failed")
	errNoDone      = errors.New("proxy: stream ended without [DONE]")
	errEmpty       = errors.New("proxy: engine closed the stream before its first event")
	err503         = errors.New("proxy: engine answered 503")
)

// newRequest builds the upstream request of an attempt.
func newRequest(ctx context.Context, a Attempt, accept string) (*http.Request, error) {
	method := a.Method
	if method == "" {
		method = http.MethodPost
	}
	var body io.Reader
	if method == http.MethodPost {
		body = bytes.NewReader(a.Body)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.URL, body)
	if err != nil {
		return nil, &AttemptError{Reason: FailInvalid, Err: fmt.Errorf("proxy: build request: %w", err)}
	}
	h := make(http.Header, len(a.Header)+6)
	for k, vs := range a.Header {
		h[k] = vs
	}
	if body != nil {
		h["Content-Type"] = jsonType
	} else {
		delete(h, "Content-Type")
	}
	h["Accept"] = acceptOf(accept)
	h["User-Agent"] = userAgent
	if a.RequestID != "" {
		h["X-Request-Id"] = []string{a.RequestID}
	}
	if a.ClientRequestID != "" {
		h["X-Client-Request-Id"] = []string{a.ClientRequestID}
	}
	req.Header = h
	// A pooled connection that turns out dead (the engine died since it was
	// last used) is retried once by the transport on a fresh connection,
	// so an engine's death reads as a refused dial, not a reset: an empty
	// Idempotency-Key marks the request replayable and is not sent.
	req.Header["Idempotency-Key"] = nil
	return req, nil
}

// The values of the headers every attempt sends, shared: a request never
// modifies its header's values.
var (
	jsonType  = []string{"application/json"}
	userAgent = []string{"tlgate"}
	acceptSSE = []string{"text/event-stream"}
)

// acceptOf is the Accept header's value of accept.
func acceptOf(accept string) []string {
	switch accept {
	case "application/json":
		return jsonType
	case "text/event-stream":
		return acceptSSE
	}
	return []string{accept}
}

// classify turns a transport error into an AttemptError. ctx is the
// caller's context (the client's), actx the attempt's, canceled with
// errTimeout by the proxy's own timers.
func classify(ctx, actx context.Context, err error, committed bool) *AttemptError {
	reason := FailTransport
	switch {
	case ctx.Err() != nil:
		return &AttemptError{Reason: FailCanceled, Committed: committed, Err: context.Cause(ctx)}
	case errors.Is(context.Cause(actx), errTimeout):
		reason, err = FailTimeout, fmt.Errorf("%w: %w", errTimeout, err)
	case errors.Is(err, syscall.ECONNREFUSED):
		reason = FailRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED):
		reason = FailReset
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		reason = FailEOF
	default:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			reason = FailTimeout
		}
	}
	return &AttemptError{Reason: reason, Committed: committed, Err: err}
}

// discard reads and drops up to 64 KiB of a body that is not relayed (a 503
// answer), so its connection can be reused.
func discard(body io.Reader) {
	_, _ = io.CopyN(io.Discard, body, 64<<10)
}
