package nginxproxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestConfig(t *testing.T) {
	conf, err := Config(Options{Upstreams: []string{"127.0.0.1:9001", "127.0.0.1:9002"}, Workers: 2, Keepalive: 32}, "/tmp/x", "127.0.0.1:8088")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"worker_processes 2;",
		"pid /tmp/x/nginx.pid;",
		"error_log /tmp/x/error.log warn;",
		"server 127.0.0.1:9001;",
		"server 127.0.0.1:9002;",
		"keepalive 32;",
		"listen 127.0.0.1:8088;",
		"proxy_pass http://engines;",
		"proxy_http_version 1.1;",
		`proxy_set_header Connection "";`,
		"proxy_buffering off;",
		"client_body_temp_path /tmp/x/tmp/body;",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %q:\n%s", want, conf)
		}
	}
	def, err := Config(Options{Upstreams: []string{"127.0.0.1:9001"}}, "/d", "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(def, "worker_processes 1;") || !strings.Contains(def, "keepalive 256;") {
		t.Errorf("defaults not applied:\n%s", def)
	}
	if _, err := Config(Options{}, "/d", "127.0.0.1:1"); !errors.Is(err, ErrNoUpstream) {
		t.Errorf("no upstream: %v", err)
	}
}

func TestStartWithoutNginx(t *testing.T) {
	_, err := Start(context.Background(), Options{Binary: "/nonexistent/nginx", Upstreams: []string{"127.0.0.1:1"}})
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("Start with a missing binary: %v, want ErrNotFound", err)
	}
	if _, err := Version(context.Background(), "/nonexistent/nginx"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Version with a missing binary: %v", err)
	}
}

// TestProxy runs the real nginx in front of an upstream that streams: the
// upstream writes its second event only after the client has read the
// first through nginx, which proves nginx does not buffer the stream.
func TestProxy(t *testing.T) {
	if _, err := Lookup(""); err != nil {
		t.Skip("nginx is not installed (apt-get install -y nginx)")
	}
	firstSeen := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/plain" {
			io.WriteString(w, "plain:"+r.Method)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-firstSeen:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: two\n\n")
	}))
	defer up.Close()
	p, err := Start(context.Background(), Options{Upstreams: []string{strings.TrimPrefix(up.URL, "http://")}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := Version(context.Background(), "")
	if err != nil || !strings.HasPrefix(v, "nginx/") {
		t.Errorf("Version = %q, %v", v, err)
	}
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()

	resp, err := c.Post(p.URL()+"/plain", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "plain:POST" {
		t.Errorf("through nginx: %q", b)
	}

	resp, err = c.Get(p.URL() + "/sse")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first event %q, %v", line, err)
	}
	close(firstSeen)
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	if !strings.Contains(string(rest), "data: two") {
		t.Errorf("rest of the stream %q", rest)
	}

	addr := p.Addr()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if conn, err := net.Dial("tcp", addr); err == nil {
		conn.Close()
		t.Errorf("nginx still listens on %s after Close", addr)
	}
}
