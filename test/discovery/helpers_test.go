package discovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// startEngine starts a reference engine serving model on addr (host:port,
// port 0 for any) that sends no heartbeats: the gateway must find it.
func startEngine(t *testing.T, addr, model string) (*enginesim.Engine, error) {
	t.Helper()
	e, err := enginesim.Start(context.Background(), enginesim.Config{Model: model, HTTPAddr: addr, Logger: zerolog.Nop()})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, nil
}

// enginesOnOnePort starts n engines serving model on 127.0.0.2, 127.0.0.3,
// ... all on one port, as pods of a Service share their port; it returns
// the engines and the port.
func enginesOnOnePort(t *testing.T, n int, model string) ([]*enginesim.Engine, int) {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		var es []*enginesim.Engine
		for i := range n {
			e, err := startEngine(t, fmt.Sprintf("127.0.0.%d:%d", 2+i, port), model)
			if err != nil {
				break
			}
			es = append(es, e)
		}
		if len(es) == n {
			return es, port
		}
		for _, e := range es {
			_ = e.Close()
		}
	}
	t.Fatalf("no port free on 127.0.0.2..%d", 1+n)
	return nil, 0
}

// heartbeat is the gateways' heartbeat_interval (T).
const heartbeat = 500 * time.Millisecond

// startGateway starts a gateway on loopback with the [gateway] keys and
// tables of extra after its own.
func startGateway(t *testing.T, extra string) *gateway.Gateway {
	t.Helper()
	return startGatewayAt(t, "127.0.0.1:0", extra)
}

// startGatewayAt is startGateway with the registry listening on
// registryListen.
func startGatewayAt(t *testing.T, registryListen, extra string) *gateway.Gateway {
	t.Helper()
	doc := fmt.Sprintf("[gateway]\nlisten = \"127.0.0.1:0\"\nregistry_listen = %q\nstate_dir = %q\nheartbeat_interval = %q\nlog_format = \"console\"\n%s",
		registryListen, t.TempDir(), heartbeat.String(), extra)
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, doc)
	}
	gw, err := gateway.Start(context.Background(), cfg, gateway.Options{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close(context.Background()) })
	return gw
}

// freePort returns a port free on every one of hosts at the time of the
// call.
func freePort(t *testing.T, hosts ...string) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", net.JoinHostPort(hosts[0], "0"))
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		ok := true
		ls := []net.Listener{l}
		for _, h := range hosts[1:] {
			l2, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(port)))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l2)
		}
		for _, l := range ls {
			_ = l.Close()
		}
		if ok {
			return port
		}
	}
	t.Fatalf("no port free on all of %v", hosts)
	return 0
}

// worker is what a test reads of GET /admin/v1/workers.
type worker struct {
	ID          string `json:"id"`
	Model       string `json:"model"`
	Role        string `json:"role"`
	HTTPAddress string `json:"http_address"`
	Routable    bool   `json:"routable"`
	Draining    bool   `json:"draining"`
	Source      string `json:"source"`
}

// workers lists the gateway's workers by id.
func workers(t *testing.T, gw *gateway.Gateway) map[string]worker {
	t.Helper()
	resp, err := http.Get("http://" + gw.HTTPAddr() + "/admin/v1/workers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Workers []worker `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	out := map[string]worker{}
	for _, w := range body.Workers {
		out[w.ID] = w
	}
	return out
}

// state is a worker's state as a test compares it: "routable",
// "draining", "listed" (neither), or "" for a worker not listed.
func state(ws map[string]worker, id string) string {
	w, ok := ws[id]
	switch {
	case !ok:
		return ""
	case w.Routable:
		return "routable"
	case w.Draining:
		return "draining"
	}
	return "listed"
}

// waitStates waits until the workers whose ids start with prefix are
// exactly want (id → state as state says), or fails after within.
func waitStates(t *testing.T, gw *gateway.Gateway, prefix string, want map[string]string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var got map[string]string
	for {
		ws := workers(t, gw)
		got = map[string]string{}
		for id := range ws {
			if strings.HasPrefix(id, prefix) {
				got[id] = state(ws, id)
			}
		}
		if maps.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers %s*: after %v got %v, want %v", prefix, within, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// complete sends one completion for model and returns the status and the
// body.
func complete(t *testing.T, gw *gateway.Gateway, model string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gw.HTTPAddr()+"/v1/completions",
		strings.NewReader(`{"model":`+strconv.Quote(model)+`,"prompt":"hello","max_tokens":2}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
