package test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// hardenWait bounds each raw-socket wait of these tests: far longer than
// an answer that comes at once takes, far shorter than the package timeout
// and than read_body_timeout (30 s by default), so an answer that waits for
// the body fails the test.
const hardenWait = 5 * time.Second

// rawAnswer sends head (request line and headers, each ending in CRLF, no
// blank line) and prefix of the body, and returns the status line of the
// answer and whether the gateway then closed the connection, both within
// hardenWait.
func rawAnswer(t *testing.T, addr, head, prefix string) (status string, closed bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, head+"\r\n"+prefix); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(hardenWait))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: no answer within %v: %v", strings.SplitN(head, "\r\n", 2)[0], hardenWait, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_, err = br.ReadByte()
	ne, timeout := err.(net.Error)
	return resp.Status, err != nil && !(timeout && ne.Timeout())
}

// TestSlowBodiesAreNotAwaited: a client that announces a body and dribbles
// it holds nothing when its request is refused: 401 (inference, admin),
// 404 (unknown path) and /healthz are answered at once and the connection
// closed, without waiting for the body; a Content-Length over
// max_body_bytes is 413 at once; an admin PUT with the admin key whose body
// is dribbled is cut off by read_body_timeout like an inference one.
func TestSlowBodiesAreNotAwaited(t *testing.T) {
	c := newCluster(t, hostileRoutes, []clusterOpt{keys(), drillGateway(func(g *config.Gateway) {
		g.ReadBodyTimeout = config.D(300 * time.Millisecond)
	})})
	addr := c.gw.HTTPAddr()
	const dribble = "Content-Length: 200000\r\n"
	cases := []struct {
		name, head string
		status     string
	}{
		{"inference without a key", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + dribble, "401"},
		{"inference with a wrong key", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n" + dribble, "401"},
		{"inference with a key lacking the scope", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-admin\r\n" + dribble, "403"},
		{"admin PUT without a key", "PUT /admin/v1/routes HTTP/1.1\r\nHost: x\r\n" + dribble, "401"},
		{"unknown path", "POST /nope HTTP/1.1\r\nHost: x\r\n" + dribble, "404"},
		{"wrong method", "PUT /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-plain\r\n" + dribble, "405"},
		{"healthz with a body", "GET /healthz HTTP/1.1\r\nHost: x\r\n" + dribble, "200"},
		{"chunked body without a key", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n", "401"},
		{"Content-Length over the limit, nothing sent", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-plain\r\nContent-Length: 2000000\r\n", "413"},
		{"admin PUT with the key, dribbled", "PUT /admin/v1/routes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-admin\r\nIf-Match: \"1\"\r\n" + dribble, "400"},
		{"inference with a key, dribbled", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-plain\r\n" + dribble, "400"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "{"
			if strings.Contains(tc.head, "chunked") {
				prefix = "100\r\n{"
			}
			if strings.Contains(tc.head, "2000000") {
				prefix = ""
			}
			status, closed := rawAnswer(t, addr, tc.head, prefix)
			if !strings.HasPrefix(status, tc.status) || !closed {
				t.Fatalf("answer %q, connection closed %v; want %s and closed", status, closed, tc.status)
			}
		})
	}
	// The gateway goes on serving.
	if r := c.get("/healthz", ""); r.status != 200 {
		t.Fatalf("healthz after the slow bodies: %d", r.status)
	}
}

// TestConnectionCaps: past max_connections_per_client open connections, a
// client's new ones are closed as soon as accepted; one closing frees a
// place. Requests on the open ones are served.
func TestConnectionCaps(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{drillGateway(func(g *config.Gateway) {
		g.MaxConnectionsPerClient = 3
	})})
	addr := c.gw.HTTPAddr()
	healthz := func(conn net.Conn) error {
		_ = conn.SetDeadline(time.Now().Add(hardenWait))
		if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	var open []net.Conn
	for i := 0; i < 3; i++ {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := healthz(conn); err != nil {
			t.Fatalf("connection %d within the cap: %v", i, err)
		}
		open = append(open, conn)
	}
	over, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	if err := healthz(over); err == nil {
		t.Fatal("a fourth connection of one client was served (cap 3)")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a fourth connection was neither served nor closed")
	}
	open[0].Close()
	eventually(t, hardenWait, func() bool {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer conn.Close()
		return healthz(conn) == nil
	}, "a place freed by a closed connection")
	for _, conn := range open[1:] {
		if err := healthz(conn); err != nil {
			t.Fatalf("an open connection within the cap: %v", err)
		}
	}
}

// TestAuthorizationAndKeyCase: two Authorization headers are a 400 (the
// first one used to win); top-level keys that equal a field only up to case
// are a 400 naming the key, as an engine decoding JSON case-insensitively
// would read "STREAM" as stream and "MODEL" as model.
func TestAuthorizationAndKeyCase(t *testing.T) {
	c := hostileCluster(t)
	req, err := http.NewRequest(http.MethodPost, c.url+"/v1/chat/completions", strings.NewReader(chatBody("smol")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Add("Authorization", "Bearer key-plain")
	req.Header.Add("Authorization", "Bearer nope")
	if r := c.do(req); r.status != 400 || errorCode(t, r.body) != "invalid_request" || !strings.Contains(string(r.body), "Authorization") {
		t.Fatalf("two Authorization headers: %d %s", r.status, r.body)
	}
	for _, tc := range []struct{ body, param string }{
		{`{"model":"smol","STREAM":true,"messages":[{"role":"user","content":"hi"}]}`, "STREAM"},
		{`{"model":"smol","MODEL":"nope","messages":[{"role":"user","content":"hi"}]}`, "MODEL"},
	} {
		r := c.post("/v1/chat/completions", "key-plain", tc.body)
		code, _, param := hostileError(t, r.body)
		if r.status != 400 || code != "invalid_request" || param == nil || *param != tc.param {
			t.Fatalf("%s: %d %s, want 400 naming %s", tc.body, r.status, r.body, tc.param)
		}
	}
}

// TestBodyLimitIsInclusive: max_body_bytes is the largest body accepted.
// A body of exactly that many bytes is read whole and parsed, on the
// inference and the admin path, whether it comes with its Content-Length
// or chunked; one byte more is 413 request_too_large either way.
func TestBodyLimitIsInclusive(t *testing.T) {
	const limit = 1000 // startHardeningGateway's max_body_bytes
	gw, _ := startHardeningGateway(t, "")
	base := "http://" + gw.HTTPAddr()
	client := &http.Client{Timeout: hardenWait}
	defer client.CloseIdleConnections()
	// pad pads a JSON object (ending in "}") with spaces to size bytes.
	pad := func(doc string, size int) string {
		return doc[:len(doc)-1] + strings.Repeat(" ", size-len(doc)) + "}"
	}
	paths := []struct {
		name, method, path, key, doc string
		status                       int    // at the limit: the body was parsed
		code                         string // ... and judged on what it says
	}{
		{"inference", "POST", "/v1/completions", "key-plain", `{"model":"nope","prompt":"hi","max_tokens":1}`, http.StatusNotFound, "model_not_found"},
		{"admin", "PUT", "/admin/v1/routes", "key-admin", `{"routes":[]}`, http.StatusPreconditionRequired, "if_match_required"},
	}
	for _, p := range paths {
		for _, chunked := range []bool{false, true} {
			for _, size := range []int{limit, limit + 1} {
				t.Run(fmt.Sprintf("%s chunked=%v %d bytes", p.name, chunked, size), func(t *testing.T) {
					var body io.Reader = strings.NewReader(pad(p.doc, size))
					if chunked {
						body = io.MultiReader(body) // no length known: sent chunked
					}
					req, err := http.NewRequest(p.method, base+p.path, body)
					if err != nil {
						t.Fatal(err)
					}
					req.Header.Set("Authorization", "Bearer "+p.key)
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					status, code := p.status, p.code
					if size > limit {
						status, code = http.StatusRequestEntityTooLarge, "request_too_large"
					}
					if resp.StatusCode != status || errorCode(t, b) != code {
						t.Fatalf("status %d %s, want %d %s", resp.StatusCode, b, status, code)
					}
				})
			}
		}
	}
}

// TestWholeAnswerClientStopsReading: a client that stops reading a
// non-streamed answer holds neither its key's concurrency slot (it is
// free once the engine answered) nor the gateway's handler beyond
// idle_timeout (each part of the answer is written within it, as a
// stream's events are), and the request is logged as finished.
func TestWholeAnswerClientStopsReading(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := newClusterGateway(t, "", []clusterOpt{
		withKeys(config.APIKey{Name: "k", Key: "key-k", Scopes: []string{"inference"}, MaxConcurrent: 1}),
		// The bound on a client's write; also on the engine's gaps, which
		// a busy machine may stretch well past a fraction of a second.
		drillGateway(func(g *config.Gateway) { g.IdleTimeout = config.Duration{Duration: 2 * time.Second} }),
	}, nil, func(o *gateway.Options) { o.Registry, o.Gatherer = reg, reg })
	big := strings.Repeat("x", 12<<20) // more than the sockets' buffers hold
	c.addFake("w1", "m", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		content := "ok"
		if strings.Contains(string(b), "the big one") {
			content = big
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, content)
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(c.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	body := `{"model":"m","messages":[{"role":"user","content":"the big one"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-k\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if line, err := bufio.NewReaderSize(conn, 16).ReadString('\n'); err != nil || !strings.Contains(line, "200") {
		t.Fatalf("status line %q %v", line, err)
	}
	// The client reads no more. The key's next request is served.
	small := map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": "again"}}, "max_tokens": 1}
	if r := c.post("/v1/chat/completions", "key-k", small); r.status != http.StatusOK {
		t.Fatalf("the key's next request while the first client stalls: %d %s", r.status, r.body)
	}
	// The stalled request's handler gives up on its client and logs it.
	eventually(t, 15*eventuallyUnit, func() bool {
		return counter(t, reg, "tlgate_requests_total", map[string]string{"route": "m", "outcome": "ok"}) >= 2
	}, "the stalled request finished")
}
