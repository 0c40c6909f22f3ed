// Package bodyguard bounds request bodies at the HTTP server's edge, on
// every path (inference, admin, ops, unknown ones):
//
//   - a Content-Length over the limit is answered 413 at once, unread, in
//     the error shape of the path's API (Anthropic's on /v1/messages and
//     below, else OpenAI's);
//   - a body must arrive whole within a deadline, however slowly it is
//     dribbled (the handler's read then fails);
//   - a body the handler did not read to its end (a 401, 403, 404 or 405
//     answer, a /healthz with a body) is never read afterwards: the answer
//     goes out at once with "Connection: close" and the connection is
//     closed, where net/http would otherwise wait to drain up to 256 KiB of
//     it, with no deadline (HTTP/1; HTTP/2 resets the stream of a body left
//     unread, and the deadline bounds the rest).
//
// A client that holds a connection by sending a body one byte at a time
// therefore holds it for the deadline at most, and not at all when it is
// refused.
package bodyguard

import (
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/tlgate/tlgate/internal/wire/anthropic"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// Options configures the guard.
type Options struct {
	// MaxBodyBytes is the largest Content-Length accepted (0: no limit).
	// Handlers still bound what they read (a chunked body has no length).
	MaxBodyBytes int64
	// Timeout bounds reading a request body, from the end of its headers
	// to its last byte (0: no bound).
	Timeout time.Duration
	// OnReject, if set, is called for each request the guard refuses
	// itself (413), with the request, the status and the error code.
	OnReject func(r *http.Request, status int, code string)
}

// drainGrace bounds reading what a client still sends of a body left
// unread, after its answer went out: long enough for a client that sent its
// body at once to have it taken in (closing a connection on unread bytes
// resets it, and the client could lose the answer), short enough that a
// client dribbling its body holds nothing.
const drainGrace = time.Second

// Wrap returns next behind the guard.
func Wrap(next http.Handler, o Options) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if o.MaxBodyBytes > 0 && r.ContentLength > o.MaxBodyBytes {
			if o.OnReject != nil {
				o.OnReject(r, http.StatusRequestEntityTooLarge, openai.CodeRequestTooLarge)
			}
			http1 := r.ProtoMajor == 1
			if http1 { // HTTP/2 would take it for the whole connection's end
				w.Header().Set("Connection", "close")
			}
			msg := fmt.Sprintf("The request body of %d bytes is larger than %d bytes.", r.ContentLength, o.MaxBodyBytes)
			if anthropic.OnPath(r.URL.Path) {
				anthropic.WriteError(w, http.StatusRequestEntityTooLarge, msg)
			} else {
				openai.WriteError(w, http.StatusRequestEntityTooLarge, openai.CodeRequestTooLarge, msg, nil)
			}
			if http1 {
				abandon(rc, o.Timeout)
			}
			return
		}
		b := &body{ReadCloser: r.Body, rc: rc}
		if o.Timeout > 0 {
			b.deadline = rc.SetReadDeadline(time.Now().Add(o.Timeout)) == nil
		}
		if r.ProtoMajor == 1 {
			// Until the body is read to its end, the answer closes the
			// connection: the rest of the body is not drained, and the
			// header must be in place before the handler answers.
			b.header = w.Header()
			b.header.Set("Connection", "close")
		}
		r = r.WithContext(r.Context()) // a shallow copy: the server's request keeps its body
		r.Body = b
		next.ServeHTTP(w, r)
		if !b.eof.Load() && b.header != nil {
			abandon(rc, o.Timeout)
		}
	})
}

// abandon bounds the connection's reads to drainGrace (or timeout, when
// shorter) for an answer with Connection: close: the server sends the
// answer without draining the body first, then drains what arrives within
// the grace (none of it past 256 KiB) and closes the connection.
func abandon(rc *http.ResponseController, timeout time.Duration) {
	d := drainGrace
	if timeout > 0 && timeout < d {
		d = timeout
	}
	_ = rc.SetReadDeadline(time.Now().Add(d))
}

// body is a request body that notes its end and then lifts the read
// deadline, which must not outlive the body: the server's background read
// of an idle connection would fail with it and cancel a long streamed
// answer.
// It also lifts the "Connection: close" set for HTTP/1 (the handler reads
// its body before it answers, in its own goroutine).
type body struct {
	io.ReadCloser
	rc       *http.ResponseController
	deadline bool
	header   http.Header // HTTP/1: the answer's, holding Connection: close
	eof      atomic.Bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.eof.Swap(true) {
		if b.deadline {
			_ = b.rc.SetReadDeadline(time.Time{})
		}
		if b.header != nil && b.header.Get("Connection") == "close" {
			b.header.Del("Connection")
		}
	}
	return n, err
}
