package discovery_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// heartbeatingEngine starts a reference engine that heartbeats to target
// (host:port), resolving names with resolver (nil: the system's).
func heartbeatingEngine(t *testing.T, id, target string, resolver *net.Resolver) *enginesim.Engine {
	t.Helper()
	e, err := enginesim.Start(context.Background(), enginesim.Config{ID: id, Model: "hb", Gateways: []string{target},
		HeartbeatInterval: heartbeat, Resolver: resolver, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// resolverOf is a resolver asking only the DNS server at addr.
func resolverOf(addr string) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
}

// TestEngineHeartbeatsEveryAddress gives the reference engine a gateway
// DNS name that resolves to the registries of several gateway replicas:
// it registers with each, picks up a replica added to the name, and stops
// heartbeating one removed from it (which then evicts it).
func TestEngineHeartbeatsEveryAddress(t *testing.T) {
	d := startDNS(t)
	hosts := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	port := freePort(t, hosts...)
	gws := make([]*gateway.Gateway, len(hosts))
	for i, h := range hosts {
		gws[i] = startGatewayAt(t, net.JoinHostPort(h, strconv.Itoa(port)), "")
	}
	rr := func(h string) string { return "gw.tlgate.test. 1 IN A " + h }
	d.set(t, "gw.tlgate.test", dns.TypeA, rr(hosts[0]), rr(hosts[1]))
	heartbeatingEngine(t, "hb-1", fmt.Sprintf("gw.tlgate.test:%d", port), resolverOf(d.addr))

	const within = 15 * time.Second
	routable := map[string]string{"hb-1": "routable"}
	waitStates(t, gws[0], "hb-", routable, within)
	waitStates(t, gws[1], "hb-", routable, within)
	waitStates(t, gws[2], "hb-", map[string]string{}, time.Second)

	// A third replica joins the name; the first leaves it.
	d.set(t, "gw.tlgate.test", dns.TypeA, rr(hosts[1]), rr(hosts[2]))
	waitStates(t, gws[2], "hb-", routable, within)
	waitStates(t, gws[0], "hb-", map[string]string{}, within) // evicted: no heartbeats
	waitStates(t, gws[1], "hb-", routable, within)
}

// restartHost is the loopback address of the registry that
// TestGatewayRestartFleetBackWithinTwoHeartbeats restarts.
const restartHost = "127.0.0.101"

// TestGatewayRestartFleetBackWithinTwoHeartbeats stops a gateway for long
// enough that gRPC's default reconnect backoff would have grown to several
// seconds, starts it again on the same registry address, and waits for
// every engine to be registered again: the engines cap their backoff at
// the heartbeat interval, so they are back within about two heartbeats
// (the wait allows 2 T plus a margin for a busy machine).
func TestGatewayRestartFleetBackWithinTwoHeartbeats(t *testing.T) {
	// The gateway is down for 10 s, its port free, and it must bind the
	// port again. On 127.0.0.1 another test's outgoing connection could
	// take the port meanwhile (its source address is 127.0.0.1); no test
	// sends from or listens on restartHost.
	port := freePort(t, restartHost)
	registry := net.JoinHostPort(restartHost, strconv.Itoa(port))
	gw := startGatewayAt(t, registry, "")
	fleet := map[string]string{}
	for i := range 3 {
		id := fmt.Sprintf("hb-%d", i)
		heartbeatingEngine(t, id, registry, nil)
		fleet[id] = "routable"
	}
	waitStates(t, gw, "hb-", fleet, 15*time.Second)

	if err := gw.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Down for 10 s: by then gRPC's default backoff (1 s × 1.6ⁿ) would
	// wait about 4 to 6 s between attempts.
	time.Sleep(10 * time.Second)
	restarted := time.Now()
	gw = startGatewayAt(t, registry, "")
	waitStates(t, gw, "hb-", fleet, 2*heartbeat+2*time.Second)
	t.Logf("fleet back %v after the restart (T = %v)", time.Since(restarted).Round(time.Millisecond), heartbeat)
}
