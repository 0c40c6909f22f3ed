package connlimit

import (
	"bufio"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

const testWait = 5 * time.Second

// serve accepts from l until it is closed; each connection is greeted with
// "ok\n" and closed when the client closes it.
func serve(t *testing.T, l net.Listener) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.WriteString(c, "ok\n")
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
}

// dialFrom connects from the local IP from and reports whether the server
// greeted the connection (true) or closed it at once (false).
func dialFrom(t *testing.T, addr, from string) (net.Conn, bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: testWait}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(testWait))
	line, err := bufio.NewReader(c).ReadString('\n')
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("from %s: neither greeted nor closed", from)
	}
	return c, err == nil && line == "ok\n"
}

func TestCaps(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan string, 10)
	l := Wrap(inner, Options{Max: 3, PerClient: 2, OnRefuse: func(a net.Addr, reason string) {
		refused <- clientOf(a) + " " + reason
	}})
	serve(t, l)
	addr := inner.Addr().String()
	wantRefused := func(want string) {
		t.Helper()
		select {
		case got := <-refused:
			if got != want {
				t.Fatalf("refused %q, want %q", got, want)
			}
		case <-time.After(testWait):
			t.Fatalf("no refusal, want %q", want)
		}
	}

	a1, ok1 := dialFrom(t, addr, "127.0.0.1")
	_, ok2 := dialFrom(t, addr, "127.0.0.1")
	if !ok1 || !ok2 {
		t.Fatalf("the first two connections of a client: %v %v", ok1, ok2)
	}
	if _, ok := dialFrom(t, addr, "127.0.0.1"); ok {
		t.Fatal("a third connection of one client was served (per-client cap 2)")
	}
	wantRefused("127.0.0.1 per_client")
	if _, ok := dialFrom(t, addr, "127.0.0.2"); !ok {
		t.Fatal("another client's connection was refused under the total cap")
	}
	if _, ok := dialFrom(t, addr, "127.0.0.3"); ok {
		t.Fatal("a fourth connection was served (total cap 3)")
	}
	wantRefused("127.0.0.3 total")

	// A closed connection frees its place.
	a1.Close()
	deadline := time.Now().Add(testWait)
	for total, _ := l.Open("127.0.0.1"); total != 2; total, _ = l.Open("127.0.0.1") {
		if time.Now().After(deadline) {
			t.Fatalf("open connections %d after a close, want 2", total)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, ok := dialFrom(t, addr, "127.0.0.1"); !ok {
		t.Fatal("a client was refused after one of its connections closed")
	}
	if total, client := l.Open("127.0.0.1:1234"); total != 3 || client != 2 {
		t.Fatalf("Open = %d, %d; want 3, 2", total, client)
	}
}

func TestNoCaps(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Wrap(inner, Options{})
	serve(t, l)
	for i := 0; i < 20; i++ {
		if _, ok := dialFrom(t, inner.Addr().String(), "127.0.0.1"); !ok {
			t.Fatalf("connection %d refused without caps", i)
		}
	}
}

func TestClientOf(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:80": "127.0.0.1", "[::1]:80": "::1", "[::ffff:10.0.0.1]:5": "10.0.0.1", "10.0.0.2": "10.0.0.2", "pipe": "pipe",
	} {
		if got := clientOfString(in); got != want {
			t.Errorf("clientOfString(%q) = %q, want %q", in, got, want)
		}
	}
}
