package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// upstream starts an engine stand-in on 127.0.0.1 and stops it at cleanup.
// It reads the request body before calling h, as an engine does: the
// server notices a client that goes away only once the body is consumed.
func upstream(t testing.TB, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// newProxy returns a Proxy with short timeouts whose idle connections are
// closed at cleanup (before the servers: cleanups run last-in first-out).
func newProxy(t testing.TB, o Options) *Proxy {
	t.Helper()
	if o.FirstByteTimeout == 0 {
		o.FirstByteTimeout = 10 * time.Second
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 10 * time.Second
	}
	p := New(o)
	t.Cleanup(p.Close)
	return p
}

// streamThrough relays one streamed request to the engine at url through
// p, as the gateway's handler does, and returns what the client read and
// the relay's Result; the client gives up after 10 s.
func streamThrough(t *testing.T, p *Proxy, url string) (string, Result) {
	t.Helper()
	results := make(chan Result, 1)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		results <- p.Stream(r.Context(), Attempt{URL: url, Body: []byte(`{}`)}, w, nil)
	}))
	defer gw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.URL, strings.NewReader(`{}`))
	resp, err := gw.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	return string(body), <-results
}

// closedAddr returns an address on which nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// resetConn answers a request with a TCP reset.
func resetConn(t testing.TB, w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Error(err)
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// sse writes events as an engine does, one flush each.
func writeSSE(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, e := range events {
		_, _ = io.WriteString(w, e)
		_ = http.NewResponseController(w).Flush()
	}
}

// clientWriter is the client's side of a Stream: it records what reaches
// the client and can cancel the client's context or fail after some writes.
type clientWriter struct {
	mu          sync.Mutex
	header      http.Header
	status      int
	body        bytes.Buffer
	writes      int
	afterWrites int    // with onWrite: called once after this many writes
	onWrite     func() // e.g. cancel the client's context
	failWrites  bool   // every write fails, as to a closed connection
	flushed     int    // flushes
}

func newClientWriter() *clientWriter { return &clientWriter{header: http.Header{}} }

func (c *clientWriter) Header() http.Header { return c.header }

func (c *clientWriter) WriteHeader(status int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status == 0 {
		c.status = status
	}
}

func (c *clientWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.failWrites {
		c.mu.Unlock()
		return 0, errors.New("write: broken pipe")
	}
	c.body.Write(p)
	c.writes++
	hook := c.onWrite != nil && c.writes == c.afterWrites
	c.mu.Unlock()
	if hook {
		c.onWrite()
	}
	return len(p), nil
}

func (c *clientWriter) Flush() {
	c.mu.Lock()
	c.flushed++
	c.mu.Unlock()
}

func (c *clientWriter) got() (int, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status, c.body.String()
}

// roundTripFunc is an in-memory transport for fuzzing and benchmarks.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// memClient answers every request with status, content type and body.
func memClient(status int, ct string, body func(ctx context.Context) io.ReadCloser) *http.Client {
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		h := http.Header{}
		if ct != "" {
			h.Set("Content-Type", ct)
		}
		return &http.Response{StatusCode: status, Header: h, Body: body(r.Context()), ContentLength: -1, Request: r}, nil
	})}
}

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	n *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}
