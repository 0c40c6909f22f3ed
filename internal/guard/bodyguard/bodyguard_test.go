package bodyguard

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// testWait bounds every wait of these tests: far longer than any step
// takes, far shorter than the package timeout.
const testWait = 5 * time.Second

// server runs h behind the guard on a real listener (deadlines need a
// real connection).
func server(t *testing.T, o Options, h http.HandlerFunc) string {
	t.Helper()
	s := httptest.NewServer(Wrap(h, o))
	t.Cleanup(s.Close)
	return s.Listener.Addr().String()
}

// dial sends head (request line and headers, CRLF-terminated, without the
// blank line) and then prefix of the body, and returns the connection.
func dial(t *testing.T, addr, head, prefix string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, head+"\r\n"+prefix); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(testWait))
	return c
}

// answer reads one response from c.
func answer(t *testing.T, c net.Conn, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("answer body: %v", err)
	}
	return resp, string(b)
}

// closed reports whether the server closed c (EOF or reset) before the
// test's deadline.
func closed(t *testing.T, br *bufio.Reader) {
	t.Helper()
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the server sent more bytes after its answer")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the connection is still open: the server waits for the rest of the body")
	}
}

func refuse(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "no", http.StatusUnauthorized)
}

// TestUnreadBodyIsNotAwaited: a handler that answers without reading the
// body (401, 404, 405, /healthz) gets its answer out at once and the
// connection closed, while the client has sent 1 byte of 200,000 and
// stalls. No timeout is configured: nothing waits for the body at all.
func TestUnreadBodyIsNotAwaited(t *testing.T) {
	addr := server(t, Options{}, refuse)
	c := dial(t, addr, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n", "{")
	br := bufio.NewReader(c)
	resp, _ := answer(t, c, br)
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("status %d close %v, want 401 and Connection: close", resp.StatusCode, resp.Close)
	}
	closed(t, br)
}

// TestChunkedUnreadBodyIsNotAwaited: the same with a chunked body of
// unknown length.
func TestChunkedUnreadBodyIsNotAwaited(t *testing.T) {
	addr := server(t, Options{}, refuse)
	c := dial(t, addr, "PUT /admin/v1/routes HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n", "10\r\n{")
	br := bufio.NewReader(c)
	if resp, _ := answer(t, c, br); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", resp.StatusCode)
	}
	closed(t, br)
}

// TestContentLengthOverLimit: a Content-Length above the limit is answered
// 413 before a byte of the body is read, and reported.
func TestContentLengthOverLimit(t *testing.T) {
	var rejected []string
	called := false
	addr := server(t, Options{MaxBodyBytes: 1 << 20, OnReject: func(_ *http.Request, status int, code string) {
		rejected = append(rejected, fmt.Sprint(status, " ", code))
	}}, func(http.ResponseWriter, *http.Request) { called = true })
	c := dial(t, addr, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n", "")
	br := bufio.NewReader(c)
	resp, body := answer(t, c, br)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, `"request_too_large"`) {
		t.Fatalf("status %d body %s, want 413 request_too_large", resp.StatusCode, body)
	}
	closed(t, br)
	if called || len(rejected) != 1 || rejected[0] != "413 request_too_large" {
		t.Fatalf("handler called %v, rejected %v", called, rejected)
	}
}

// TestContentLengthOverLimitOnMessages: on /v1/messages and below, the
// 413 is in Anthropic's error shape, as the Messages handler's own errors
// are.
func TestContentLengthOverLimitOnMessages(t *testing.T) {
	addr := server(t, Options{MaxBodyBytes: 10}, func(http.ResponseWriter, *http.Request) {})
	for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
		c := dial(t, addr, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n", strings.Repeat("x", 20))
		resp, body := answer(t, c, bufio.NewReader(c))
		if want := `{"type":"error","error":{"type":"request_too_large","message":"The request body of 20 bytes is larger than 10 bytes."}}`; resp.StatusCode != http.StatusRequestEntityTooLarge || body != want {
			t.Fatalf("%s: status %d body %s, want 413 %s", path, resp.StatusCode, body, want)
		}
	}
}

// TestDribbledBodyTimesOut: a body dribbled slower than the deadline makes
// the handler's read fail within it, whatever the handler (admin too).
func TestDribbledBodyTimesOut(t *testing.T) {
	readErr := make(chan error, 1)
	addr := server(t, Options{Timeout: 200 * time.Millisecond}, func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
		http.Error(w, "bad body", http.StatusBadRequest)
	})
	c := dial(t, addr, "PUT /admin/v1/routes HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n", "{")
	br := bufio.NewReader(c)
	select {
	case err := <-readErr:
		if err == nil {
			t.Fatal("the handler read a dribbled body without error")
		}
	case <-time.After(testWait):
		t.Fatal("the handler still waits for a dribbled body")
	}
	if resp, _ := answer(t, c, br); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", resp.StatusCode)
	}
	closed(t, br)
}

// TestReadBodyKeepsConnection: a body read whole lifts the deadline: the
// handler's context is not canceled by it during a long answer, and the
// connection carries the next request.
func TestReadBodyKeepsConnection(t *testing.T) {
	const timeout = 50 * time.Millisecond
	addr := server(t, Options{Timeout: timeout, MaxBodyBytes: 100}, func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if r.URL.Path == "/long" {
			// Far past the body deadline: a deadline left on the
			// connection would fail the server's background read and
			// cancel the context.
			select {
			case <-r.Context().Done():
				http.Error(w, "canceled", http.StatusInternalServerError)
				return
			case <-time.After(10 * timeout):
			}
		}
		_, _ = w.Write(b)
	})
	c := dial(t, addr, "POST /long HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n", "hello")
	br := bufio.NewReader(c)
	if resp, body := answer(t, c, br); resp.StatusCode != 200 || body != "hello" || resp.Close {
		t.Fatalf("first: %d %q close %v", resp.StatusCode, body, resp.Close)
	}
	if _, err := io.WriteString(c, "POST /short HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"); err != nil {
		t.Fatal(err)
	}
	if resp, body := answer(t, c, br); resp.StatusCode != 200 || body != "abc" {
		t.Fatalf("second on the same connection: %d %q", resp.StatusCode, body)
	}
	if _, err := io.WriteString(c, "GET /short HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if resp, _ := answer(t, c, br); resp.StatusCode != 200 {
		t.Fatalf("bodiless GET: %d", resp.StatusCode)
	}
}

// TestRefusedSmallBodyKeepsClientWorking: a refused request whose small
// body arrived whole is answered with Connection: close, so a client that
// goes on sending requests opens a new connection instead of reusing one
// the server is closing (a past read deadline left on a kept connection
// used to break its next request).
func TestRefusedSmallBodyKeepsClientWorking(t *testing.T) {
	s := httptest.NewServer(Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/refuse" {
			refuse(w, r)
			return
		}
		if _, err := io.ReadAll(r.Body); err != nil || r.Context().Err() != nil {
			http.Error(w, "broken", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}), Options{Timeout: time.Second}))
	defer s.Close()
	client := s.Client()
	defer client.CloseIdleConnections()
	for i := 0; i < 20; i++ {
		path := "/refuse"
		if i%2 == 1 {
			path = "/ok"
		}
		resp, err := client.Post(s.URL+path, "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatalf("request %d (%s): %v", i, path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		want := map[string]int{"/refuse": 401, "/ok": 200}[path]
		if resp.StatusCode != want || resp.Close != (path == "/refuse") {
			t.Fatalf("request %d (%s): %d close %v", i, path, resp.StatusCode, resp.Close)
		}
	}
}

// TestRefusedLargeBodyIsAnswered: a client that sends a whole body of
// 100 KiB (under 256 KiB, which net/http drains) to a refusing handler, or
// over the limit, gets its answer rather than a reset connection: what it
// sent is taken in within the grace before the connection is closed.
func TestRefusedLargeBodyIsAnswered(t *testing.T) {
	s := httptest.NewServer(Wrap(http.HandlerFunc(refuse), Options{Timeout: 5 * time.Second, MaxBodyBytes: 50 << 10}))
	defer s.Close()
	client := s.Client()
	defer client.CloseIdleConnections()
	for _, tc := range []struct {
		size   int
		status int
	}{{40 << 10, 401}, {100 << 10, 413}, {40 << 10, 401}, {100 << 10, 413}} {
		resp, err := client.Post(s.URL, "application/json", strings.NewReader(strings.Repeat("x", tc.size)))
		if err != nil {
			t.Fatalf("%d bytes: %v", tc.size, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Fatalf("%d bytes: status %d, want %d", tc.size, resp.StatusCode, tc.status)
		}
	}
}

// TestHTTP2KeepsConnection: over HTTP/2 a refused body resets only its
// stream: the guard sends no Connection: close (HTTP/2 would end the whole
// connection for it), and the requests that follow share the connection.
func TestHTTP2KeepsConnection(t *testing.T) {
	var conns atomic.Int32
	s := httptest.NewUnstartedServer(Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/refuse" {
			refuse(w, r)
			return
		}
		_, _ = io.ReadAll(r.Body)
		_, _ = io.WriteString(w, "ok")
	}), Options{Timeout: time.Second, MaxBodyBytes: 1000}))
	s.EnableHTTP2 = true
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	s.StartTLS()
	defer s.Close()
	client := s.Client()
	defer client.CloseIdleConnections()
	for i, tc := range []struct {
		path, body string
		status     int
	}{{"/refuse", "{}", 401}, {"/ok", "{}", 200}, {"/ok", strings.Repeat("x", 2000), 413}, {"/ok", "{}", 200}} {
		resp, err := client.Post(s.URL+tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 || resp.StatusCode != tc.status || resp.Header.Get("Connection") != "" {
			t.Fatalf("request %d: HTTP/%d %d Connection %q", i, resp.ProtoMajor, resp.StatusCode, resp.Header.Get("Connection"))
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 4 HTTP/2 requests, want 1", n)
	}
}

// TestLimitIsInclusive: a body of exactly MaxBodyBytes is passed to the
// handler whole, with its Content-Length or chunked; a Content-Length one
// byte more is 413 before the handler runs. A chunked body has no length
// to judge: the guard passes it whatever its size, and the handler bounds
// what it reads.
func TestLimitIsInclusive(t *testing.T) {
	const limit = 1000
	s := httptest.NewServer(Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, r.ContentLength, " ", len(b)) // -1: chunked
	}), Options{MaxBodyBytes: limit, Timeout: testWait}))
	defer s.Close()
	client := s.Client()
	defer client.CloseIdleConnections()
	for _, tc := range []struct {
		name    string
		size    int
		chunked bool
		status  int
	}{
		{"Content-Length one under the limit", limit - 1, false, http.StatusOK},
		{"Content-Length at the limit", limit, false, http.StatusOK},
		{"Content-Length one over the limit", limit + 1, false, http.StatusRequestEntityTooLarge},
		{"chunked at the limit", limit, true, http.StatusOK},
		{"chunked over the limit, left to the handler", limit + 1, true, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = strings.NewReader(strings.Repeat("x", tc.size))
			if tc.chunked {
				body = io.MultiReader(body) // no length known: sent chunked
			}
			req, err := http.NewRequest("POST", s.URL, body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("%d bytes: status %d %s, want %d", tc.size, resp.StatusCode, b, tc.status)
			}
			length := tc.size
			if tc.chunked {
				length = -1
			}
			if want := fmt.Sprint(length, " ", tc.size); tc.status == http.StatusOK && string(b) != want {
				t.Fatalf("the handler saw Content-Length and bytes read %q, want %q", b, want)
			}
		})
	}
}
