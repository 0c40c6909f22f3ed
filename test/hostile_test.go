package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// hostileRoutes gives the gateway one route so that route-table PUTs have
// something to keep.
const hostileRoutes = `
[[gateway.routes]]
model = "smol"
backends = [{ model = "m", weight = 1 }]
`

// hostileCluster is a gateway with keys, a 1 MiB body limit and a short
// read_header_timeout, in front of one engine.
func hostileCluster(t *testing.T) *cluster {
	return newCluster(t, hostileRoutes, []clusterOpt{keys(), drillGateway(func(g *config.Gateway) {
		g.MaxBodyBytes = 1 << 20
		g.ReadHeaderTimeout = config.D(300 * time.Millisecond)
	})}, enginesim.Config{ID: "w1", Model: "m"})
}

// hostileCase is one hostile request and the answer it must get.
type hostileCase struct {
	name         string
	method, path string
	key          string
	header       []string // name, value pairs
	body         string
	status       int
	code         string // the OpenAI error code; "" for a non-error answer
	param        string // the error's param, when it must name one
	check        func(t *testing.T, r reply)
}

func (c *cluster) hostileDo(tc hostileCase) reply {
	c.t.Helper()
	req, err := http.NewRequest(tc.method, c.url+tc.path, strings.NewReader(tc.body))
	if err != nil {
		c.t.Fatal(err)
	}
	if tc.key != "" {
		req.Header.Set("Authorization", "Bearer "+tc.key)
	}
	for i := 0; i+1 < len(tc.header); i += 2 {
		req.Header.Set(tc.header[i], tc.header[i+1])
	}
	return c.do(req)
}

// hostileError decodes an OpenAI error body strictly: the body must be
// JSON with message, type and code; param is returned when present.
func hostileError(t *testing.T, b []byte) (code, message string, param *string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    string  `json:"code"`
		} `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("error body is not OpenAI-shaped JSON: %v: %.300q", err, b)
	}
	if e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
		t.Fatalf("error body without message, type or code: %.300q", b)
	}
	return e.Error.Code, e.Error.Message, e.Error.Param
}

// echoes checks that an unknown model's name comes back only inside the
// JSON string of the message, decoded intact (quoted as Go would).
func echoes(name string) func(t *testing.T, r reply) {
	return func(t *testing.T, r reply) {
		_, msg, _ := hostileError(t, r.body)
		if !strings.Contains(msg, strings.Trim(jsonQuote(name), `"`)) && !strings.Contains(msg, name) {
			t.Fatalf("message %.200q does not name the model", msg)
		}
		if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Fatalf("Content-Type %q", ct)
		}
	}
}

// bounded checks that an error repeats at most the start of a long value
// a client sent, never the whole.
func bounded(value string) func(t *testing.T, r reply) {
	return func(t *testing.T, r reply) {
		_, msg, _ := hostileError(t, r.body)
		if len(msg) > 512 || strings.Contains(msg, value) {
			t.Fatalf("the message repeats %d bytes of a %d-byte value: %.300q", len(msg), len(value), msg)
		}
	}
}

// ownWords checks that an error says want, in the gateway's words, and
// none of the JSON decoder's own.
func ownWords(want string) func(t *testing.T, r reply) {
	return func(t *testing.T, r reply) {
		_, msg, _ := hostileError(t, r.body)
		if !strings.Contains(msg, want) {
			t.Fatalf("message %.300q does not say %q", msg, want)
		}
		for _, decoder := range []string{"exceeded max depth", "invalid character", "looking for beginning", "unexpected EOF"} {
			if strings.Contains(msg, decoder) {
				t.Fatalf("message %.300q carries the JSON decoder's %q", msg, decoder)
			}
		}
	}
}

func jsonQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func chatBody(model string) string {
	return `{"model":` + jsonQuote(model) + `,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
}

// TestHostileRequests: malformed and abusive requests each get the right
// status and error code, and after each one the gateway still answers a
// normal request; at the end no goroutine is left behind.
func TestHostileRequests(t *testing.T) {
	c := hostileCluster(t)
	normal := func() {
		t.Helper()
		r := c.post("/v1/chat/completions", "key-plain", chatBody("smol"))
		if r.status != http.StatusOK {
			t.Fatalf("a normal request after a hostile one: %d %s", r.status, r.body)
		}
	}
	normal()
	goroutines := settledGoroutines(t, -1)

	etag := c.get("/admin/v1/routes", "key-admin").header.Get("ETag")
	if etag == "" {
		t.Fatal("no ETag on GET /admin/v1/routes")
	}
	huge := `{"model":"smol","prompt":"` + strings.Repeat("a", 2<<20) + `"}`
	long := strings.Repeat("x", 10<<10)
	put := func(name, body string, param string) hostileCase {
		return hostileCase{name: name, method: http.MethodPut, path: "/admin/v1/routes", key: "key-admin",
			header: []string{"If-Match", etag}, body: body, status: 400, code: "invalid_routes", param: param}
	}
	const chat, compl = "/v1/chat/completions", "/v1/completions"
	cases := []hostileCase{
		// Bodies that are not JSON, or not an object.
		{name: "not JSON", method: "POST", path: chat, key: "key-plain", body: `{"model":`, status: 400, code: "invalid_request"},
		{name: "empty body", method: "POST", path: chat, key: "key-plain", body: ``, status: 400, code: "invalid_request"},
		{name: "JSON array", method: "POST", path: chat, key: "key-plain", body: `[1,2]`, status: 400, code: "invalid_request"},
		{name: "JSON string", method: "POST", path: compl, key: "key-plain", body: `"hello"`, status: 400, code: "invalid_request"},
		{name: "trailing garbage", method: "POST", path: compl, key: "key-plain", body: `{"model":"smol","prompt":"x"} trailing`, status: 400, code: "invalid_request"},
		{name: "two objects", method: "POST", path: compl, key: "key-plain", body: `{"model":"smol","prompt":"x"}{}`, status: 400, code: "invalid_request"},
		{name: "deep nesting", method: "POST", path: compl, key: "key-plain", body: strings.Repeat("[", 200000), status: 400, code: "invalid_request"},
		// Wrong types and values.
		{name: "model as number", method: "POST", path: chat, key: "key-plain", body: `{"model":42,"messages":[{"role":"user","content":"hi"}]}`, status: 400, code: "invalid_request", param: "model"},
		{name: "model null", method: "POST", path: chat, key: "key-plain", body: `{"model":null,"messages":[{"role":"user","content":"hi"}]}`, status: 400, code: "invalid_request", param: "model"},
		{name: "model empty", method: "POST", path: chat, key: "key-plain", body: chatBody(""), status: 400, code: "invalid_request", param: "model"},
		{name: "model missing", method: "POST", path: compl, key: "key-plain", body: `{"prompt":"hi"}`, status: 400, code: "invalid_request", param: "model"},
		{name: "stream as string", method: "POST", path: chat, key: "key-plain", body: `{"model":"smol","stream":"yes","messages":[{"role":"user","content":"hi"}]}`, status: 400, code: "invalid_request", param: "stream"},
		{name: "messages not an array", method: "POST", path: chat, key: "key-plain", body: `{"model":"smol","messages":"hi"}`, status: 400, code: "invalid_request", param: "messages"},
		{name: "messages empty", method: "POST", path: chat, key: "key-plain", body: `{"model":"smol","messages":[]}`, status: 400, code: "invalid_request", param: "messages"},
		{name: "message content a number", method: "POST", path: chat, key: "key-plain", body: `{"model":"smol","messages":[{"role":"user","content":7}]}`, status: 400, code: "invalid_request", param: "messages[0].content"},
		{name: "max_tokens negative", method: "POST", path: compl, key: "key-plain", body: `{"model":"smol","prompt":"x","max_tokens":-1}`, status: 400, code: "invalid_request", param: "max_tokens"},
		{name: "max_tokens huge", method: "POST", path: compl, key: "key-plain", body: `{"model":"smol","prompt":"x","max_tokens":1e12}`, status: 400, code: "invalid_request", param: "max_tokens"},
		{name: "max_tokens string", method: "POST", path: compl, key: "key-plain", body: `{"model":"smol","prompt":"x","max_tokens":"10"}`, status: 400, code: "invalid_request", param: "max_tokens"},
		{name: "max_tokens fraction", method: "POST", path: compl, key: "key-plain", body: `{"model":"smol","prompt":"x","max_tokens":2.5}`, status: 400, code: "invalid_request", param: "max_tokens"},
		{name: "temperature string", method: "POST", path: compl, key: "key-plain", body: `{"model":"smol","prompt":"x","temperature":"hot"}`, status: 400, code: "invalid_request", param: "temperature"},
		{name: "seed negative", method: "POST", path: compl, key: "key-plain", body: `{"model":"smol","prompt":"x","seed":-5}`, status: 400, code: "invalid_request", param: "seed"},
		{name: "prompt mixed array", method: "POST", path: compl, key: "key-plain", body: `{"model":"smol","prompt":[1,2,"x"]}`, status: 400, code: "invalid_request", param: "prompt[2]"},
		// Duplicate keys: the gateway and an engine could read them differently.
		{name: "duplicate model", method: "POST", path: chat, key: "key-plain", body: `{"model":"smol","model":"big","messages":[{"role":"user","content":"hi"}]}`, status: 400, code: "invalid_request", param: "model"},
		{name: "duplicate stream", method: "POST", path: compl, key: "key-plain", body: `{"model":"smol","prompt":"x","stream":false,"stream":true}`, status: 400, code: "invalid_request", param: "stream"},
		// The wrong endpoint's body.
		{name: "chat body on completions", method: "POST", path: compl, key: "key-plain", body: chatBody("smol"), status: 400, code: "invalid_request", param: "prompt"},
		{name: "completions body on chat", method: "POST", path: chat, key: "key-plain", body: `{"model":"smol","prompt":"x"}`, status: 400, code: "invalid_request", param: "messages"},
		// Too large.
		{name: "2 MB body", method: "POST", path: compl, key: "key-plain", body: huge, status: 413, code: "request_too_large"},
		{name: "2 MB admin PUT", method: "PUT", path: "/admin/v1/routes", key: "key-admin", header: []string{"If-Match", etag}, body: `{"routes":[],"x":"` + strings.Repeat("a", 2<<20) + `"}`, status: 413, code: "request_too_large"},
		// Unknown models with odd names: 404, the name only inside the JSON message.
		{name: "unicode model", method: "POST", path: chat, key: "key-plain", body: chatBody("模型-🚀"), status: 404, code: "model_not_found", check: echoes("模型-🚀")},
		{name: "model with slashes", method: "POST", path: chat, key: "key-plain", body: chatBody("org/../../etc/passwd"), status: 400, code: "invalid_request", check: echoes("org/../../etc/passwd")},
		{name: "10 KB model", method: "POST", path: chat, key: "key-plain", body: chatBody(long), status: 400, code: "invalid_request", param: "model", check: bounded(long)},
		{name: "model with NUL", method: "POST", path: chat, key: "key-plain", body: chatBody("a\x00b"), status: 404, code: "model_not_found"},
		{name: "model with quotes and CRLF", method: "POST", path: chat, key: "key-plain", body: chatBody("x\"}\r\nX-Evil: 1"), status: 404, code: "model_not_found", check: func(t *testing.T, r reply) {
			if r.header.Get("X-Evil") != "" {
				t.Fatal("the model name injected a header")
			}
		}},
		{name: "model of invalid UTF-8", method: "POST", path: compl, key: "key-plain", body: "{\"model\":\"\xff\xfe\",\"prompt\":\"x\"}", status: 400, code: "invalid_request", check: ownWords("not valid UTF-8")},
		{name: "10 KB model in the path", method: "GET", path: "/v1/models/" + long, key: "key-plain", status: 404, code: "model_not_found", check: bounded(long)},
		{name: "10 KB unknown path", method: "GET", path: "/v1/" + long, key: "key-plain", status: 404, code: "not_found", check: bounded(long)},
		{name: "10 KB previous_response_id", method: "POST", path: "/v1/responses", key: "key-plain", body: `{"model":"smol","input":"hi","previous_response_id":"resp_` + long + `"}`,
			status: 400, code: "invalid_request", param: "previous_response_id", check: bounded(long)},
		{name: "10 KB response id", method: "GET", path: "/v1/responses/resp_" + long, key: "key-plain", status: 400, code: "invalid_request", param: "response_id", check: bounded(long)},
		// Authentication and scopes.
		{name: "no key", method: "POST", path: chat, body: chatBody("smol"), status: 401, code: "invalid_api_key"},
		{name: "wrong key", method: "POST", path: chat, key: "key-nope", body: chatBody("smol"), status: 401, code: "invalid_api_key"},
		{name: "basic auth", method: "POST", path: chat, header: []string{"Authorization", "Basic a2V5LXBsYWluOg=="}, body: chatBody("smol"), status: 401, code: "invalid_api_key"},
		{name: "10 KB key", method: "POST", path: chat, key: long, body: chatBody("smol"), status: 401, code: "invalid_api_key"},
		{name: "admin key on inference", method: "POST", path: chat, key: "key-admin", body: chatBody("smol"), status: 403, code: "insufficient_scope"},
		{name: "inference key on admin", method: "GET", path: "/admin/v1/workers", key: "key-plain", status: 403, code: "insufficient_scope"},
		{name: "no key on admin", method: "PUT", path: "/admin/v1/routes", header: []string{"If-Match", etag}, body: `{"routes":[]}`, status: 401, code: "invalid_api_key"},
		// Wrong methods.
		{name: "GET chat", method: "GET", path: chat, key: "key-plain", status: 405, code: "method_not_allowed", check: allows("POST")},
		{name: "PUT completions", method: "PUT", path: compl, key: "key-plain", body: `{}`, status: 405, code: "method_not_allowed", check: allows("POST")},
		{name: "DELETE models", method: "DELETE", path: "/v1/models", key: "key-plain", status: 405, code: "method_not_allowed"},
		{name: "DELETE routes", method: "DELETE", path: "/admin/v1/routes", key: "key-admin", status: 405, code: "method_not_allowed", check: allows("GET, HEAD, PUT")},
		{name: "POST workers", method: "POST", path: "/admin/v1/workers", key: "key-admin", status: 405, code: "method_not_allowed", check: allows("GET, HEAD")},
		{name: "GET drain", method: "GET", path: "/admin/v1/models/smol:drain", key: "key-admin", status: 405, code: "method_not_allowed", check: allows("POST")},
		// Route-table writes: preconditions, then bad tables naming the field.
		{name: "PUT without If-Match", method: "PUT", path: "/admin/v1/routes", key: "key-admin", body: `{"routes":[]}`, status: 428, code: "if_match_required"},
		{name: "PUT with a stale If-Match", method: "PUT", path: "/admin/v1/routes", key: "key-admin", header: []string{"If-Match", `"999"`}, body: `{"routes":[]}`, status: 412, code: "etag_mismatch"},
		{name: "PUT with a garbage If-Match", method: "PUT", path: "/admin/v1/routes", key: "key-admin", header: []string{"If-Match", `W/"x`}, body: `{"routes":[]}`, status: 412, code: "etag_mismatch"},
		put("routes not JSON", `{"routes":[`, ""),
		{name: "200k-deep route table", method: http.MethodPut, path: "/admin/v1/routes", key: "key-admin", header: []string{"If-Match", etag},
			body: `{"routes":` + strings.Repeat("[", 200000) + strings.Repeat("]", 200000) + `}`, status: 400, code: "invalid_routes", check: ownWords("nested more than 32 levels deep")},
		{name: "route table with a syntax error", method: http.MethodPut, path: "/admin/v1/routes", key: "key-admin", header: []string{"If-Match", etag},
			body: `{"routes": x}`, status: 400, code: "invalid_routes", check: ownWords("not valid JSON (at byte 12)")},
		{name: "route table with a 10 KB field", method: http.MethodPut, path: "/admin/v1/routes", key: "key-admin", header: []string{"If-Match", etag},
			body: `{"routes":[],"` + long + `":1}`, status: 400, code: "invalid_routes", check: bounded(long)},
		put("routes missing", `{}`, ""),
		put("unknown route field", `{"routes":[{"model":"a","weight":3}]}`, ""),
		put("cascade last step with accept_if", `{"routes":[{"model":"auto","cascade":[{"model":"a","accept_if":"mean_logprob > -1"},{"model":"b","accept_if":"mean_logprob > -2"}]}]}`, "routes[0].cascade[1].accept_if"),
		put("bad accept_if", `{"routes":[{"model":"auto","cascade":[{"model":"a","accept_if":"mean_logprob >> one"},{"model":"b"}]}]}`, "routes[0].cascade[0].accept_if"),
		put("negative weight", `{"routes":[{"model":"a","backends":[{"model":"b","weight":-1}]}]}`, "routes[0].backends[0].weight"),
		put("duplicate model", `{"routes":[{"model":"a"},{"model":"a"}]}`, "routes[1].model"),
		put("model with a space", `{"routes":[{"model":"a b"}]}`, "routes[0].model"),
		put("cascade cycle", `{"routes":[{"model":"a","cascade":[{"model":"b","accept_if":"mean_logprob > -1"},{"model":"x"}]},{"model":"b","cascade":[{"model":"a","accept_if":"mean_logprob > -1"},{"model":"y"}]}]}`, ""),
		// Drains of nothing.
		{name: "drain an unknown model", method: "POST", path: "/admin/v1/models/nope:drain", key: "key-admin", status: 404, code: "model_not_found"},
		{name: "drain with a bad action", method: "POST", path: "/admin/v1/models/smol:explode", key: "key-admin", status: 404, code: "not_found"},
		{name: "drain an invalid model id", method: "POST", path: "/admin/v1/models/a%20b:drain", key: "key-admin", status: 404, code: "model_not_found"},
		// A hostile request id is replaced, not echoed.
		{name: "request id too long", method: "POST", path: chat, key: "key-plain", header: []string{"X-Request-Id", long}, body: chatBody("smol"), status: 200, check: func(t *testing.T, r reply) {
			if id := r.header.Get("X-Request-Id"); id == long || !strings.HasPrefix(id, "req-") {
				t.Fatalf("X-Request-Id %.40q", id)
			}
		}},
	}
	if len(cases) < 30 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := c.hostileDo(tc)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %.300s", r.status, tc.status, r.body)
			}
			if tc.code != "" {
				code, msg, param := hostileError(t, r.body)
				if code != tc.code {
					t.Fatalf("code %q, want %q (%s)", code, tc.code, msg)
				}
				if tc.param != "" && (param == nil || *param != tc.param) {
					t.Fatalf("param %v, want %q (%s)", param, tc.param, msg)
				}
				for _, k := range []string{"key-plain", "key-admin", "key-debug"} {
					if strings.Contains(string(r.body), k) {
						t.Fatal("an API key appears in the error")
					}
				}
			}
			if tc.check != nil {
				tc.check(t, r)
			}
			normal()
		})
	}
	// Refused route tables left the table alone.
	if got := c.get("/admin/v1/routes", "key-admin").header.Get("ETag"); got != etag {
		t.Fatalf("ETag %s after refused writes, was %s", got, etag)
	}
	c.drillWaitIdle()
	after := settledGoroutines(t, goroutines)
	t.Logf("%d hostile requests; goroutines %d before, %d after", len(cases), goroutines, after)
}

func allows(methods string) func(t *testing.T, r reply) {
	return func(t *testing.T, r reply) {
		if got := r.header.Get("Allow"); got != methods {
			t.Fatalf("Allow %q, want %q", got, methods)
		}
	}
}

// settledGoroutines closes the client's idle connections and waits until
// the goroutine count is at most want plus a few (the gateway's pooled
// connections to the engine come and go); with want < 0 it returns the
// count once it stops falling.
func settledGoroutines(t *testing.T, want int) int {
	t.Helper()
	http.DefaultClient.CloseIdleConnections()
	if want < 0 {
		prev := -1
		eventually(t, 5*time.Second, func() bool {
			n := runtime.NumGoroutine()
			settled := n == prev
			prev = n
			return settled
		}, "a stable goroutine count")
		return prev
	}
	eventually(t, 5*time.Second, func() bool {
		http.DefaultClient.CloseIdleConnections()
		return runtime.NumGoroutine() <= want+4
	}, "goroutines back to %d (+4), now %d", want, runtime.NumGoroutine())
	return runtime.NumGoroutine()
}

// TestHostileSlowloris: a client that sends its request headers a byte at a
// time, slower than read_header_timeout, is disconnected once the timeout
// passes (never before), and the gateway serves others meanwhile.
func TestHostileSlowloris(t *testing.T) {
	c := hostileCluster(t)
	start := time.Now() // before the server can start its header timer
	conn, err := net.Dial("tcp", c.gw.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	head := "POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer key-plain\r\nContent-Type: application/json\r\nX-Padding: " + strings.Repeat("z", 200) + "\r\n\r\n"
	wrote := make(chan int, 1)
	go func() {
		// A byte every 20 ms: the whole head would take over 5 s.
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		n := 0
		for ; n < len(head); n++ {
			if _, err := conn.Write([]byte{head[n]}); err != nil {
				break
			}
			<-tk.C
		}
		wrote <- n
	}()
	// Others are served while the slow client dribbles.
	if r := c.post("/v1/completions", "key-plain", `{"model":"smol","prompt":"hi","max_tokens":2}`); r.status != http.StatusOK {
		t.Fatalf("a normal request during the slowloris: %d %s", r.status, r.body)
	}
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	closed := time.Since(start)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the connection was still open after 10 s (read %q)", got)
	}
	// net/http may say why it hangs up (400 or 408, Connection: close)
	// or just close; it must not serve the unfinished request.
	if len(got) > 0 && !strings.HasPrefix(string(got), "HTTP/1.1 400 ") && !strings.HasPrefix(string(got), "HTTP/1.1 408 ") {
		t.Fatalf("the gateway answered the unfinished head: %q", got)
	}
	conn.Close()
	n := <-wrote
	if n >= len(head) {
		t.Fatal("the whole head was sent before the gateway closed the connection")
	}
	if closed < 300*time.Millisecond {
		t.Fatalf("closed after %v, before read_header_timeout", closed)
	}
	t.Logf("closed after %v, %d of %d header bytes sent", closed.Round(time.Millisecond), n, len(head))
}

// TestHostileHeartbeats: heartbeats with bad fields over real gRPC are
// refused with InvalidArgument and change nothing: no worker appears and
// the real worker keeps its status.
func TestHostileHeartbeats(t *testing.T) {
	c := hostileCluster(t)
	conn, err := grpc.NewClient(c.gw.RegistryAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := controlv1.NewWorkerRegistryClient(conn)
	good := func() *controlv1.WorkerStatus {
		return &controlv1.WorkerStatus{WorkerId: "evil", Model: "other", HttpAddress: "127.0.0.1:1", Role: controlv1.Role_ROLE_UNIFIED,
			KvTotalBlocks: 10, KvFreeBlocks: 10, KvBlockTokens: 16}
	}
	before, _ := c.drillWorker("w1")
	cases := []struct {
		name string
		edit func(s *controlv1.WorkerStatus)
	}{
		{"nil fields everywhere", func(s *controlv1.WorkerStatus) { *s = controlv1.WorkerStatus{} }},
		{"empty worker id", func(s *controlv1.WorkerStatus) { s.WorkerId = "" }},
		{"worker id with a space", func(s *controlv1.WorkerStatus) { s.WorkerId = "evil one" }},
		{"worker id of 129 bytes", func(s *controlv1.WorkerStatus) { s.WorkerId = strings.Repeat("w", 129) }},
		{"worker id with a slash", func(s *controlv1.WorkerStatus) { s.WorkerId = "../w1" }},
		{"unicode worker id", func(s *controlv1.WorkerStatus) { s.WorkerId = "wörker" }},
		{"empty model", func(s *controlv1.WorkerStatus) { s.Model = "" }},
		{"model with a space", func(s *controlv1.WorkerStatus) { s.Model = "m m" }},
		{"unknown role", func(s *controlv1.WorkerStatus) { s.Role = controlv1.Role(42) }},
		{"no http address", func(s *controlv1.WorkerStatus) { s.HttpAddress = "" }},
		{"http address without port", func(s *controlv1.WorkerStatus) { s.HttpAddress = "127.0.0.1" }},
		{"http address port 0", func(s *controlv1.WorkerStatus) { s.HttpAddress = "127.0.0.1:0" }},
		{"http address port 70000", func(s *controlv1.WorkerStatus) { s.HttpAddress = "127.0.0.1:70000" }},
		{"http address a URL", func(s *controlv1.WorkerStatus) { s.HttpAddress = "http://127.0.0.1:80" }},
		{"http address with a path", func(s *controlv1.WorkerStatus) { s.HttpAddress = "evil.example/x:80" }},
		{"http address with a percent", func(s *controlv1.WorkerStatus) { s.HttpAddress = "%:1" }},
		{"http address with userinfo", func(s *controlv1.WorkerStatus) { s.HttpAddress = "u@evil:80" }},
		{"decode without kv address", func(s *controlv1.WorkerStatus) { s.Role = controlv1.Role_ROLE_DECODE }},
		{"prefill without grpc address", func(s *controlv1.WorkerStatus) { s.Role = controlv1.Role_ROLE_PREFILL }},
		{"bad grpc address", func(s *controlv1.WorkerStatus) {
			s.Role, s.GrpcAddress = controlv1.Role_ROLE_PREFILL, "grpc:x"
		}},
		{"more free blocks than total", func(s *controlv1.WorkerStatus) { s.KvFreeBlocks = 11 }},
		{"the real worker's id with a bad address", func(s *controlv1.WorkerStatus) { s.WorkerId, s.HttpAddress = "w1", "nowhere" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := good()
			tc.edit(st)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := client.Heartbeat(ctx, st)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("heartbeat: %v, want InvalidArgument", err)
			}
		})
	}
	for _, w := range c.workers() {
		if w.ID != "w1" {
			t.Fatalf("a refused heartbeat registered worker %q", w.ID)
		}
		if w.HTTPAddress != before.HTTPAddress || w.Model != before.Model || w.Role != before.Role {
			t.Fatalf("a refused heartbeat changed w1: %+v, was %+v", w.Worker, before.Worker)
		}
	}
	// The good status is accepted, so the refusals above were about the
	// field each one broke.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := client.Heartbeat(ctx, good()); err != nil {
		t.Fatalf("the good heartbeat: %v", err)
	}
	if r := c.post("/v1/chat/completions", "key-plain", chatBody("smol")); r.status != http.StatusOK {
		t.Fatalf("a normal request after the hostile heartbeats: %d %s", r.status, r.body)
	}
}
