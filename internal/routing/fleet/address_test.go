package fleet

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

func TestValidateHostForms(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:8000", true},
		{"10.0.0.1:8000", true},
		{"[::1]:8000", true},
		{"[2001:db8::1]:8000", true},
		{"engine-a.svc.cluster.local:8000", true},
		{"engine_a:8000", true},
		{"localhost:8000", true},
		{"169.254.169.254:80", false},
		{"[fe80::1]:80", false},
		{"[::ffff:169.254.169.254]:80", false},
		{"0x7f000001:80", false},
		{"2130706433:80", false},
		{"127.1:80", false},
		{"0177.0.0.1:80", false},
		{"a.0x10:80", false},
		{"0.0.0.0:80", false},
		{"[::]:80", false},
		{"224.0.0.1:80", false},
		{"[127.0.0.1]:80", false},
		{"[fe80::1%25eth0]:80", false},
		{"-bad.host:80", false},
		{"a..b:80", false},
	} {
		st := &controlv1.WorkerStatus{WorkerId: "w", Model: "m", HttpAddress: tc.addr}
		err := Validate(st)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrInvalidAddress) {
			t.Errorf("Validate(http_address %q) = %v, want ok=%v", tc.addr, err, tc.ok)
		}
	}
}

func TestAddressPolicy(t *testing.T) {
	p := NewAddressPolicy(nil)
	p.AddOwn(&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 8080})
	p.AddOwn(&net.TCPAddr{IP: net.IPv4zero, Port: 50051})
	p.AddOwn(&net.TCPAddr{Port: 7070}) // ":7070", from the configuration
	wide := NewAddressPolicy([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")})
	for _, tc := range []struct {
		p    *AddressPolicy
		addr string
		ok   bool
	}{
		{p, "127.0.0.1:8000", true},
		{p, "127.0.0.1:8080", false},
		{p, "localhost:8080", false},
		{p, "[::ffff:127.0.0.1]:8080", false},
		{p, "127.0.0.2:8080", true}, // not a socket the gateway listens on
		{p, "127.0.0.1:50051", false},
		{p, "127.0.0.9:50051", false}, // wildcard listener: all of loopback
		{p, "10.9.9.9:50051", true},
		{p, "engine:8080", true},
		{p, "127.0.0.1:7070", false},
		{wide, "10.1.2.3:8000", true},
		{wide, "[fd00::5]:8000", true},
		{wide, "192.168.1.1:8000", false},
		{wide, "127.0.0.1:22", false},
		{wide, "engine.local:8000", false},
		{nil, "127.0.0.1:8080", true},
	} {
		err := tc.p.Check(&controlv1.WorkerStatus{HttpAddress: tc.addr})
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrRefusedAddress) {
			t.Errorf("Check(%q) = %v, want ok=%v", tc.addr, err, tc.ok)
		}
	}
	// Every address of the status is checked.
	err := p.Check(&controlv1.WorkerStatus{HttpAddress: "127.0.0.1:8000", KvAddress: "127.0.0.1:8080"})
	if !errors.Is(err, ErrRefusedAddress) {
		t.Errorf("kv_address on the gateway's listener: %v", err)
	}
}

// TestAddressPolicyCheckDial: the address a dial resolved to is checked
// again: a host name that resolves to a link-local, multicast or
// unspecified address, to the gateway's own listener, or outside
// engine_networks is refused before the connection is made.
func TestAddressPolicyCheckDial(t *testing.T) {
	own := NewAddressPolicy(nil)
	own.AddOwn(&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 8080})
	nets := NewAddressPolicy([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	var none *AddressPolicy
	cases := []struct {
		name string
		p    *AddressPolicy
		addr string
		ok   bool
	}{
		{"loopback engine", own, "127.0.0.1:8000", true},
		{"metadata service", own, "169.254.169.254:80", false},
		{"metadata service, nil policy", none, "169.254.169.254:80", false},
		{"IPv6 link-local", none, "[fe80::1]:80", false},
		{"IPv4-mapped link-local", none, "[::ffff:169.254.169.254]:80", false},
		{"unspecified", none, "0.0.0.0:80", false},
		{"multicast", none, "224.0.0.1:80", false},
		{"nil policy, ordinary address", none, "192.0.2.7:8000", true},
		{"the gateway's own listener", own, "127.0.0.1:8080", false},
		{"inside engine_networks", nets, "10.1.2.3:8000", true},
		{"outside engine_networks", nets, "192.0.2.7:8000", false},
		{"not ip:port", own, "engine:8000", false},
	}
	for _, tc := range cases {
		err := tc.p.CheckDial("tcp", tc.addr)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrRefusedAddress) {
			t.Errorf("%s: CheckDial(%q) = %v, want ok %v", tc.name, tc.addr, err, tc.ok)
		}
	}
}

// TestAddressPolicyWildcardHostAddress: with a listener on 0.0.0.0:P, one
// of this host's non-loopback addresses (net.InterfaceAddrs) on port P is
// the gateway itself and refused as an engine address; on another port it
// is allowed.
func TestAddressPolicyWildcardHostAddress(t *testing.T) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var host netip.Addr
	for _, ia := range addrs {
		if pfx, err := netip.ParsePrefix(ia.String()); err == nil && !pfx.Addr().IsLoopback() && pfx.Addr().Is4() {
			host = pfx.Addr()
			break
		}
	}
	if !host.IsValid() {
		t.Skip("this host has no non-loopback IPv4 address")
	}
	p := NewAddressPolicy(nil)
	p.AddOwn(&net.TCPAddr{IP: net.IPv4zero, Port: 50051})
	own := netip.AddrPortFrom(host, 50051).String()
	if err := p.Check(&controlv1.WorkerStatus{HttpAddress: own}); !errors.Is(err, ErrRefusedAddress) {
		t.Fatalf("Check(%s) with a listener on 0.0.0.0:50051 = %v, want refused", own, err)
	}
	other := netip.AddrPortFrom(host, 8000).String()
	if err := p.Check(&controlv1.WorkerStatus{HttpAddress: other}); err != nil {
		t.Fatalf("Check(%s) = %v, want allowed", other, err)
	}
}

// TestAddressPolicyInterfacesUnlisted: when this host's addresses cannot
// be listed (a sandbox refusing netlink sockets), AddOwn of a wildcard
// listener says so, once, and still records the listener with loopback as
// its address; a listener on one address never lists them.
func TestAddressPolicyInterfacesUnlisted(t *testing.T) {
	refused := errors.New("socket: address family not supported by protocol")
	calls := 0
	p := NewAddressPolicy(nil)
	p.interfaceAddrs = func() ([]net.Addr, error) { calls++; return nil, refused }
	if err := p.AddOwn(&net.TCPAddr{IP: net.ParseIP("10.0.0.7"), Port: 8080}); err != nil || calls != 0 {
		t.Fatalf("AddOwn(10.0.0.7:8080) = %v after %d listings, want nil and none", err, calls)
	}
	if err := p.AddOwn(&net.TCPAddr{IP: net.IPv4zero, Port: 9090}); !errors.Is(err, refused) || !strings.Contains(err.Error(), "0.0.0.0:9090") {
		t.Fatalf("AddOwn(0.0.0.0:9090) = %v, want the listing's error naming the listener", err)
	}
	if err := p.AddOwn(&net.TCPAddr{Port: 7070}); err != nil || calls != 1 {
		t.Fatalf("a second wildcard listener: %v after %d listings, want nil after one", err, calls)
	}
	for addr, ok := range map[string]bool{"127.0.0.1:9090": false, "[::1]:7070": false, "10.0.0.7:8080": false, "10.0.0.8:9090": true} {
		if err := p.Check(&controlv1.WorkerStatus{HttpAddress: addr}); (err == nil) != ok {
			t.Errorf("Check(%s) = %v, want ok=%v", addr, err, ok)
		}
	}

	p = NewAddressPolicy(nil)
	p.interfaceAddrs = func() ([]net.Addr, error) {
		return []net.Addr{&net.IPNet{IP: net.ParseIP("10.0.0.8"), Mask: net.CIDRMask(24, 32)}}, nil
	}
	if err := p.AddOwn(&net.TCPAddr{IP: net.IPv4zero, Port: 9090}); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(&controlv1.WorkerStatus{HttpAddress: "10.0.0.8:9090"}); !errors.Is(err, ErrRefusedAddress) {
		t.Errorf("Check(10.0.0.8:9090) with this host at 10.0.0.8 = %v, want refused", err)
	}
}

func TestKVEndpoints(t *testing.T) {
	for ep, ok := range map[string]bool{"tcp://10.0.0.1:5557": true, "tcp://engine-0.svc:5557": true, "tcp://[::1]:5557": true, "ipc:///tmp/kv.sock": true,
		"tcp://*:5557": false, "tcp://host": false, "http://h:1": false, "tcp://h:0": false, "tcp://h:70000": false, "ipc://": false, "5557": false,
		"tcp://h:1/x": false, "tcp://u@h:1": false} {
		if _, _, err := ParseKVEndpoint(ep); (err == nil) != ok {
			t.Errorf("%q: %v", ep, err)
		}
	}
	for ep, want := range map[string]string{"tcp://:5557": "tcp://10.1.2.3:5557", "tcp://*:5557": "tcp://10.1.2.3:5557", "tcp://e:1": "tcp://e:1", "": ""} {
		if got, err := KVEndpoint(ep, "10.1.2.3:8000"); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", ep, got, err, want)
		}
	}
	st := &controlv1.WorkerStatus{WorkerId: "w", Model: "m", HttpAddress: "10.1.2.3:8000", KvEvents: &controlv1.KvEvents{Endpoint: "tcp://:5557", Topic: "kv"}}
	if err := Validate(st); err != nil {
		t.Fatal(err)
	}
	if w := FromStatus(st, time.Now(), time.Second, SourceHeartbeat); w.KVEvents != (KVEvents{Endpoint: "tcp://10.1.2.3:5557", Topic: "kv"}) {
		t.Fatalf("kv events %+v", w.KVEvents)
	}
	for _, bad := range []*controlv1.KvEvents{{Endpoint: "udp://h:1"}, {ReplayEndpoint: "tcp://h:1"}, {Endpoint: "tcp://h:1", ReplayEndpoint: "tcp://h"}, {Endpoint: "tcp://h:1", Topic: strings.Repeat("x", 300)}} {
		st.KvEvents = bad
		if err := Validate(st); !errors.Is(err, ErrInvalidKVEvents) {
			t.Errorf("%v: %v", bad, err)
		}
	}
	// An engine that heartbeats may not have the gateway dial a local
	// socket, nor an address outside engine_networks.
	p := NewAddressPolicy([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	for ev, ok := range map[string]bool{"tcp://10.9.9.9:1": true, "tcp://192.168.0.1:1": false, "ipc:///tmp/x": false} {
		st.KvEvents = &controlv1.KvEvents{Endpoint: ev}
		if err := p.Check(st); (err == nil) != ok {
			t.Errorf("%q: %v", ev, err)
		}
	}
}
