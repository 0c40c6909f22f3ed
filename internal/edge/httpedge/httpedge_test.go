package httpedge

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// readBodyServer serves ReadBody(w, r, 8): 413 when it fails, else "ok".
// It counts the connections it accepts.
func readBodyServer(conns *atomic.Int32) *httptest.Server {
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := ReadBody(w, r, 8); err != nil {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	return s
}

// chunked returns a POST of body with no Content-Length.
func chunked(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, struct{ io.Reader }{strings.NewReader(body)})
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestReadBodyKeepsHTTP2Connection: over HTTP/2, a body ReadBody fails on
// (larger than its bound) costs only its own stream: the answer carries no
// Connection: close, which Go's HTTP/2 server would take for a GOAWAY of
// the whole connection, and the next request shares the connection.
func TestReadBodyKeepsHTTP2Connection(t *testing.T) {
	var conns atomic.Int32
	s := readBodyServer(&conns)
	s.EnableHTTP2 = true
	s.StartTLS()
	defer s.Close()
	client := s.Client()
	defer client.CloseIdleConnections()
	for i, tc := range []struct {
		body   string
		status int
	}{{strings.Repeat("x", 100), http.StatusRequestEntityTooLarge}, {"hi", http.StatusOK}} {
		resp, err := client.Do(chunked(t, s.URL, tc.body))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 || resp.StatusCode != tc.status {
			t.Fatalf("request %d: HTTP/%d %d, want HTTP/2 %d", i, resp.ProtoMajor, resp.StatusCode, tc.status)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 2 requests: the refused body cost the client its connection", n)
	}
}

// TestReadBodyClosesHTTP1Connection: over HTTP/1, a body ReadBody fails on
// is not read to its end, so its answer closes the connection rather than
// let the server wait for the rest.
func TestReadBodyClosesHTTP1Connection(t *testing.T) {
	var conns atomic.Int32
	s := readBodyServer(&conns)
	s.Start()
	defer s.Close()
	client := s.Client()
	defer client.CloseIdleConnections()
	resp, err := client.Do(chunked(t, s.URL, strings.Repeat("x", 100)))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
		t.Fatalf("HTTP/%d %d, close %v: want 413 closing the connection", resp.ProtoMajor, resp.StatusCode, resp.Close)
	}
}
