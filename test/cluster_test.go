// Package test holds tlgate's integration tests: a real gateway (its HTTP
// and gRPC listeners on 127.0.0.1, ports chosen by the OS) in front of real
// reference engines that heartbeat to it.
package test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
	testcluster "github.com/tlgate/tlgate/internal/testkit/cluster"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) {
	leakcheck.VerifyTestMain(m)
}

// cluster is a gateway with engines heartbeating to it.
type cluster struct {
	t       testing.TB
	gw      *gateway.Gateway
	url     string
	engines map[string]*enginesim.Engine
	hooks   *hookLog
}

// hookLog records what the request actors report.
type hookLog struct {
	mu        sync.Mutex
	routed    []string // worker ids, in order
	failovers []string // "worker:reason"
	cascades  []string // "route:step:accepted"
	panicOn   string   // a client request id whose actor panics once routed
}

func (h *hookLog) snapshot() (routed, failovers, cascades []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.routed...), append([]string(nil), h.failovers...), append([]string(nil), h.cascades...)
}

type clusterOpt func(*config.Config)

func withKeys(keys ...config.APIKey) clusterOpt {
	return func(c *config.Config) { c.Gateway.APIKeys = keys }
}

func newCluster(t testing.TB, cfgRoutes string, opts []clusterOpt, engines ...enginesim.Config) *cluster {
	t.Helper()
	return newClusterDeps(t, cfgRoutes, opts, nil, engines...)
}

// newClusterDeps is newCluster with a last say on the request actors'
// dependencies (to wrap the engine calls, say).
func newClusterDeps(t testing.TB, cfgRoutes string, opts []clusterOpt, deps func(*request.Deps), engines ...enginesim.Config) *cluster {
	t.Helper()
	return newClusterGateway(t, cfgRoutes, opts, deps, nil, engines...)
}

// newClusterGateway is newClusterDeps with a last say on the gateway's
// options (a clock, a metrics registry, a logger).
func newClusterGateway(t testing.TB, cfgRoutes string, opts []clusterOpt, deps func(*request.Deps), gwOpts func(*gateway.Options), engines ...enginesim.Config) *cluster {
	t.Helper()
	cfg, err := config.Parse([]byte(`
[gateway]
listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
heartbeat_miss_limit = 3
first_byte_timeout = "5s"
idle_timeout = "5s"
` + cfgRoutes))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	cfg.Gateway.StateDir = t.TempDir()
	for _, o := range opts {
		o(cfg)
	}
	hl := &hookLog{}
	gopts := gateway.Options{
		Logger: zerolog.Nop(),
		RequestHooks: func(d *request.Deps) {
			d.OnRouted = func(ex *request.Exchange, tg router.Target, _ time.Duration) {
				hl.mu.Lock()
				hl.routed = append(hl.routed, tg.Worker.ID)
				boom := hl.panicOn != "" && ex.ClientRequestID == hl.panicOn
				hl.mu.Unlock()
				if boom {
					panic("test: request actor panics after routing")
				}
			}
			d.OnFailover = func(_ *request.Exchange, tg router.Target, reason string) {
				hl.mu.Lock()
				hl.failovers = append(hl.failovers, tg.Worker.ID+":"+reason)
				hl.mu.Unlock()
			}
			d.OnCascade = func(_ *request.Exchange, route string, step int, accepted bool) {
				hl.mu.Lock()
				hl.cascades = append(hl.cascades, route+":"+string(rune('0'+step))+":"+map[bool]string{true: "accepted", false: "escalated"}[accepted])
				hl.mu.Unlock()
			}
			if deps != nil {
				deps(d)
			}
		},
	}
	if gwOpts != nil {
		gwOpts(&gopts)
	}
	gw, err := gateway.Start(context.Background(), cfg, gopts)
	if err != nil {
		t.Fatalf("gateway: %v", err)
	}
	c := &cluster{t: t, gw: gw, url: "http://" + gw.HTTPAddr(), engines: map[string]*enginesim.Engine{}, hooks: hl}
	t.Cleanup(func() {
		for _, e := range c.engines {
			e.Kill()
		}
		// The clients' idle connections first: the Go client may have
		// dialed one it never sent a request on, which the server's
		// Shutdown counts as busy for its first 5 seconds (net/http's rule
		// for new connections). The bound is above those 5 seconds, for
		// such a connection of another test's client.
		http.DefaultClient.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.Close(ctx); err != nil {
			t.Errorf("gateway close: %v", err)
		}
	})
	for _, ec := range engines {
		c.addEngine(ec)
	}
	ids := make([]string, 0, len(engines))
	for _, ec := range engines {
		ids = append(ids, ec.ID)
	}
	c.waitRoutable(ids...)
	return c
}

func (c *cluster) addEngine(ec enginesim.Config) *enginesim.Engine {
	c.t.Helper()
	ec.Gateways = []string{c.gw.RegistryAddr()}
	if ec.HeartbeatInterval == 0 {
		ec.HeartbeatInterval = 100 * time.Millisecond
	}
	ec.Logger = zerolog.Nop()
	e, err := enginesim.Start(context.Background(), ec)
	if err != nil {
		c.t.Fatalf("engine %s: %v", ec.ID, err)
	}
	c.engines[ec.ID] = e
	return e
}

// workers returns the router's view.
func (c *cluster) workers() []router.WorkerView {
	c.t.Helper()
	res, err := c.gw.System().Root.RequestFuture(c.gw.Router, &router.ListWorkers{}, 2*time.Second).Result()
	if err != nil {
		c.t.Fatal(err)
	}
	return res.(*router.WorkersResult).Workers
}

// waitRoutable polls until every id is routable (bounded: 10 s).
func (c *cluster) waitRoutable(ids ...string) {
	c.t.Helper()
	eventually(c.t, 10*time.Second, func() bool {
		ok := map[string]bool{}
		for _, w := range c.workers() {
			ok[w.ID] = w.Routable
		}
		for _, id := range ids {
			if !ok[id] {
				return false
			}
		}
		return true
	}, "workers %v routable", ids)
}

// progressing polls cond until it holds, for as long as work goes on:
// it fails when progress() (a counter of work done) has not moved for
// stall, so a slow machine only makes it wait longer while a stuck
// system fails within stall.
func progressing(t testing.TB, stall time.Duration, progress func() uint64, cond func() bool, format string, args ...any) {
	t.Helper()
	last, moved := progress(), time.Now()
	for !cond() {
		if p := progress(); p != last {
			last, moved = p, time.Now()
		} else if time.Since(moved) > stall {
			t.Fatalf("no progress for %v (at %d) while waiting for "+format, append([]any{stall, last}, args...)...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// eventually polls cond until it holds or within passes (the test kit's).
var eventually = testcluster.Eventually

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (c *cluster) post(path, key string, body any, hdr ...string) reply {
	c.t.Helper()
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			c.t.Fatal(err)
		}
	}
	req, err := http.NewRequest(http.MethodPost, c.url+path, bytes.NewReader(b))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return c.do(req)
}

func (c *cluster) get(path, key string) reply {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.url+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	return c.do(req)
}

func (c *cluster) do(req *http.Request) reply {
	c.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// errorCode returns the OpenAI error body's code.
func errorCode(t *testing.T, b []byte) string {
	t.Helper()
	var e struct {
		Error struct {
			Code    string  `json:"code"`
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("not an OpenAI error body: %q", b)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("error body without message or type: %s", b)
	}
	return e.Error.Code
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(b []byte) []string {
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, p)
		}
	}
	return out
}

// completionText concatenates the text of a completions or chat answer,
// streamed (SSE) or not.
func completionText(t *testing.T, b []byte) string {
	t.Helper()
	type choice struct {
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	}
	var sb strings.Builder
	add := func(p string) {
		var v struct {
			Choices []choice `json:"choices"`
		}
		if err := json.Unmarshal([]byte(p), &v); err != nil {
			t.Fatalf("bad chunk %q: %v", p, err)
		}
		for _, c := range v.Choices {
			sb.WriteString(c.Text + c.Message.Content + c.Delta.Content)
		}
	}
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte("data:")) {
		for _, p := range sseEvents(b) {
			if p != "[DONE]" {
				add(p)
			}
		}
	} else {
		add(string(b))
	}
	return sb.String()
}

func sorted(s []string) []string {
	s = append([]string(nil), s...)
	sort.Strings(s)
	return s
}

// postTo posts JSON to any URL (an engine, bypassing the gateway).
func (c *cluster) postTo(url string, body any) []byte {
	c.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		c.t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		c.t.Fatalf("POST %s: %d %s %v", url, resp.StatusCode, out, err)
	}
	return out
}

// eventuallyUnit scales eventually's bounds.
const eventuallyUnit = time.Second

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
