package discovery_test

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// dnsServer is an authoritative DNS server on loopback whose records the
// test changes while it runs.
type dnsServer struct {
	srv  *dns.Server
	addr string

	mu  sync.Mutex
	rrs map[string][]dns.RR // by lower-case FQDN and type, "name/A"
}

func startDNS(t *testing.T) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dnsServer{addr: pc.LocalAddr().String(), rrs: map[string][]dns.RR{}}
	started := make(chan struct{})
	d.srv = &dns.Server{PacketConn: pc, Handler: d, NotifyStartedFunc: func() { close(started) }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = d.srv.ActivateAndServe()
	}()
	<-started
	t.Cleanup(func() {
		_ = d.srv.Shutdown()
		<-done
	})
	return d
}

// set replaces the records of name and type with the given ones (zone
// file syntax, e.g. "a.test. 1 IN A 127.0.0.2").
func (d *dnsServer) set(t *testing.T, name string, qtype uint16, lines ...string) {
	t.Helper()
	rrs := make([]dns.RR, 0, len(lines))
	for _, l := range lines {
		rr, err := dns.NewRR(l)
		if err != nil {
			t.Fatal(err)
		}
		rrs = append(rrs, rr)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rrs[strings.ToLower(dns.Fqdn(name))+"/"+dns.TypeToString[qtype]] = rrs
}

func (d *dnsServer) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	d.mu.Lock()
	known := false
	for _, q := range r.Question {
		name := strings.ToLower(q.Name)
		for k, rrs := range d.rrs {
			if strings.HasPrefix(k, name+"/") && len(rrs) > 0 {
				known = true
			}
		}
		m.Answer = append(m.Answer, d.rrs[name+"/"+dns.TypeToString[q.Qtype]]...)
	}
	d.mu.Unlock()
	if !known {
		m.Rcode = dns.RcodeNameError
	}
	_ = w.WriteMsg(m)
}

// TestDiscoveryDNS runs two DNS sources (A records with a port, SRV
// records with theirs) beside a listed engine against a DNS server on
// loopback whose records change: every published address becomes a
// routable worker, an address no longer published drains and is
// forgotten after drain_period, and requests reach the found engines.
func TestDiscoveryDNS(t *testing.T) {
	d := startDNS(t)
	aEngines, port := enginesOnOnePort(t, 3, "dnsa")
	srv1, err := startEngine(t, "127.0.0.1:0", "dnssrv")
	if err != nil {
		t.Fatal(err)
	}
	srv2, err := startEngine(t, "127.0.0.1:0", "dnssrv")
	if err != nil {
		t.Fatal(err)
	}
	static, err := startEngine(t, "127.0.0.1:0", "listed")
	if err != nil {
		t.Fatal(err)
	}
	_, p1, _ := net.SplitHostPort(srv1.HTTPAddr())
	_, p2, _ := net.SplitHostPort(srv2.HTTPAddr())

	d.set(t, "engines.tlgate.test", dns.TypeA, "engines.tlgate.test. 1 IN A 127.0.0.2", "engines.tlgate.test. 1 IN A 127.0.0.3")
	d.set(t, "e1.tlgate.test", dns.TypeA, "e1.tlgate.test. 1 IN A 127.0.0.1")
	d.set(t, "e2.tlgate.test", dns.TypeA, "e2.tlgate.test. 1 IN A 127.0.0.1")
	d.set(t, "_http._tcp.srv.tlgate.test", dns.TypeSRV, "_http._tcp.srv.tlgate.test. 1 IN SRV 0 0 "+p1+" e1.tlgate.test.")

	gw := startGateway(t, fmt.Sprintf(`
[[gateway.engines]]
id = "listed-1"
http_address = %q
kind = "openai"
probe_interval = "50ms"

[[gateway.discovery]]
name = "dnsa"
kind = "dns"
engine_kind = "openai"
host = "engines.tlgate.test."
record = "a"
port = %d
interval = "100ms"
resolver = %q
probe_interval = "50ms"
drain_period = "4s"

[[gateway.discovery]]
name = "dnssrv"
kind = "dns"
engine_kind = "openai"
host = "_http._tcp.srv.tlgate.test."
record = "srv"
interval = "100ms"
resolver = %q
probe_interval = "50ms"
drain_period = "4s"
`, static.HTTPAddr(), port, d.addr, d.addr))

	a := func(i int) string { return fmt.Sprintf("dnsa:127.0.0.%d:%d", 2+i, port) }
	s1, s2 := "dnssrv:127.0.0.1:"+p1, "dnssrv:127.0.0.1:"+p2
	const within = 15 * time.Second
	waitStates(t, gw, "dnsa:", map[string]string{a(0): "routable", a(1): "routable"}, within)
	waitStates(t, gw, "dnssrv:", map[string]string{s1: "routable"}, within)
	waitStates(t, gw, "listed-", map[string]string{"listed-1": "routable"}, within)
	for _, model := range []string{"dnsa", "dnssrv", "listed"} {
		if code, body := complete(t, gw, model); code != http.StatusOK {
			t.Fatalf("model %s: %d %s", model, code, body)
		}
	}
	_ = aEngines

	// The A records change: .3 goes, .4 comes; the SRV record gains e2.
	d.set(t, "engines.tlgate.test", dns.TypeA, "engines.tlgate.test. 1 IN A 127.0.0.2", "engines.tlgate.test. 1 IN A 127.0.0.4")
	d.set(t, "_http._tcp.srv.tlgate.test", dns.TypeSRV,
		"_http._tcp.srv.tlgate.test. 1 IN SRV 0 0 "+p1+" e1.tlgate.test.", "_http._tcp.srv.tlgate.test. 1 IN SRV 0 0 "+p2+" e2.tlgate.test.")
	waitStates(t, gw, "dnsa:", map[string]string{a(0): "routable", a(1): "draining", a(2): "routable"}, within)
	waitStates(t, gw, "dnssrv:", map[string]string{s1: "routable", s2: "routable"}, within)

	// e1 leaves SRV: it drains while e2 serves; .3 is forgotten once its
	// drain_period is over.
	d.set(t, "_http._tcp.srv.tlgate.test", dns.TypeSRV, "_http._tcp.srv.tlgate.test. 1 IN SRV 0 0 "+p2+" e2.tlgate.test.")
	waitStates(t, gw, "dnssrv:", map[string]string{s1: "draining", s2: "routable"}, within)
	for range 4 {
		if code, body := complete(t, gw, "dnssrv"); code != http.StatusOK || !strings.Contains(body, "dnssrv") {
			t.Fatalf("model dnssrv with e1 draining: %d %s", code, body)
		}
	}
	waitStates(t, gw, "dnsa:", map[string]string{a(0): "routable", a(2): "routable"}, within)
	waitStates(t, gw, "dnssrv:", map[string]string{s2: "routable"}, within)

	// The name disappears (NXDOMAIN): every engine drains, then goes.
	d.set(t, "engines.tlgate.test", dns.TypeA)
	waitStates(t, gw, "dnsa:", map[string]string{a(0): "draining", a(2): "draining"}, within)
	waitStates(t, gw, "dnsa:", map[string]string{}, within)
	waitStates(t, gw, "listed-", map[string]string{"listed-1": "routable"}, within)
}
