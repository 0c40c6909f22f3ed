package fleet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"

	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// ErrRefusedAddress is wrapped by AddressPolicy.Check's errors: a well-formed
// address the gateway will not send requests to.
var ErrRefusedAddress = errors.New("refused address")

// checkHost checks the host of an engine address for the forms the gateway
// would dial somewhere unexpected. It is an IP literal in its canonical
// form (no zone; IPv6 in brackets and only IPv6 there) that is not
// unspecified, multicast or link-local (169.254.0.0/16, fe80::/10, where
// cloud metadata services live), or a DNS name whose last label is not a
// number: "0x7f000001", "2130706433" or "127.1" are each read by some
// resolvers and URL parsers as 127.0.0.1, so they are refused rather than
// guessed at.
func checkHost(field, addr, host string) error {
	bracketed := strings.HasPrefix(addr, "[")
	if ip, err := netip.ParseAddr(host); err == nil {
		switch u := ip.Unmap(); {
		case ip.Zone() != "":
			return fmt.Errorf("%s: %w: %q has an IPv6 zone", field, ErrInvalidAddress, truncate(addr))
		case bracketed != ip.Is6():
			return fmt.Errorf("%s: %w: %q: brackets are for IPv6 addresses only", field, ErrInvalidAddress, truncate(addr))
		case u.IsUnspecified():
			return fmt.Errorf("%s: %w: %q is the unspecified address", field, ErrInvalidAddress, truncate(addr))
		case u.IsMulticast():
			return fmt.Errorf("%s: %w: %q is a multicast address", field, ErrInvalidAddress, truncate(addr))
		case u.IsLinkLocalUnicast():
			return fmt.Errorf("%s: %w: %q is link-local (169.254.0.0/16, fe80::/10)", field, ErrInvalidAddress, truncate(addr))
		}
		return nil
	}
	if bracketed || len(host) > 253 {
		return fmt.Errorf("%s: %w: %q has a bad host", field, ErrInvalidAddress, truncate(addr))
	}
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("%s: %w: %q is not a host name", field, ErrInvalidAddress, truncate(addr))
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("%s: %w: %q is not a host name", field, ErrInvalidAddress, truncate(addr))
			}
		}
	}
	if numeric(labels[len(labels)-1]) {
		return fmt.Errorf("%s: %w: %q is a numeric host that is not a dotted-quad IPv4 address", field, ErrInvalidAddress, truncate(addr))
	}
	return nil
}

// numeric reports whether a host's last label is a number (decimal, or hex
// after 0x), which URL parsers and inet_aton take as part of an IPv4 address.
func numeric(l string) bool {
	digits := l
	hex := false
	if len(l) >= 2 && (l[:2] == "0x" || l[:2] == "0X") {
		digits, hex = l[2:], true
	}
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		if !(c >= '0' && c <= '9' || hex && (c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F')) {
			return false
		}
	}
	return true
}

// AddressPolicy holds the deployment's rules for engine addresses, beyond
// Validate's: never one of the gateway's own listeners (a heartbeat naming
// them would make the gateway send clients' requests to itself), and, when
// networks are configured (gateway.engine_networks), only IP addresses in
// them. It is safe for concurrent use; a nil *AddressPolicy allows what
// Validate allows.
type AddressPolicy struct {
	allow []netip.Prefix
	mu    sync.RWMutex
	own   []netip.AddrPort
	local map[netip.Addr]bool // this host's addresses, for wildcard listeners
	// interfaceAddrs lists this host's addresses; nil is
	// net.InterfaceAddrs (tests set another).
	interfaceAddrs func() ([]net.Addr, error)
}

// NewAddressPolicy returns a policy allowing only addresses in allow (any
// address, when allow is empty).
func NewAddressPolicy(allow []netip.Prefix) *AddressPolicy {
	return &AddressPolicy{allow: allow}
}

// AddOwn records a listener of the gateway, once it is bound (its port is
// then known). A listener on every interface (0.0.0.0, ::) makes every
// address of this host's interfaces, and loopback, its own. When this
// host's addresses cannot be listed (a sandbox refusing netlink sockets,
// say), the listener is still recorded, with loopback alone as its
// addresses, and the error is returned, once: an engine may then name
// the listener at one of this host's other addresses.
func (p *AddressPolicy) AddOwn(a net.Addr) error {
	var ap netip.AddrPort
	switch t := a.(type) {
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(t.IP)
		if !ip.IsValid() {
			ip = netip.IPv6Unspecified() // ":8080": every interface
		}
		ap = netip.AddrPortFrom(ip.Unmap(), uint16(t.Port))
	default:
		var err error
		if ap, err = netip.ParseAddrPort(a.String()); err != nil {
			return nil
		}
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.own = append(p.own, ap)
	if !ap.Addr().IsUnspecified() || p.local != nil {
		return nil
	}
	p.local = map[netip.Addr]bool{}
	list := p.interfaceAddrs
	if list == nil {
		list = net.InterfaceAddrs
	}
	addrs, err := list()
	if err != nil {
		return fmt.Errorf("listener %s: this host's addresses: %w", ap, err)
	}
	for _, ia := range addrs {
		if pfx, err := netip.ParsePrefix(ia.String()); err == nil {
			p.local[pfx.Addr().Unmap()] = true
		}
	}
	return nil
}

// Check applies the policy to a status Validate accepted: each of its
// addresses, refused with an error wrapping ErrRefusedAddress.
func (p *AddressPolicy) Check(s *controlv1.WorkerStatus) error {
	if p == nil {
		return nil
	}
	for _, f := range []struct{ name, addr string }{
		{"http_address", s.GetHttpAddress()}, {"grpc_address", s.GetGrpcAddress()}, {"kv_address", s.GetKvAddress()},
	} {
		if f.addr == "" {
			continue
		}
		if err := p.check(f.name, f.addr); err != nil {
			return err
		}
	}
	kv, err := kvEventsOf(s)
	if err != nil {
		return err
	}
	for _, f := range []struct{ name, ep string }{{"kv_events.endpoint", kv.Endpoint}, {"kv_events.replay_endpoint", kv.Replay}} {
		if f.ep == "" {
			continue
		}
		network, addr, _ := ParseKVEndpoint(f.ep)
		if network != "tcp" {
			return fmt.Errorf("%s: %w: %q: an engine that heartbeats names tcp endpoints only", f.name, ErrRefusedAddress, truncate(f.ep))
		}
		if err := p.check(f.name, addr); err != nil {
			return err
		}
	}
	return nil
}

func (p *AddressPolicy) check(field, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s: %w: %q is not host:port", field, ErrInvalidAddress, truncate(addr))
	}
	ip, ipErr := netip.ParseAddr(host)
	ip = ip.Unmap()
	var ips []netip.Addr
	switch {
	case ipErr == nil:
		ips = []netip.Addr{ip}
	case strings.EqualFold(strings.TrimSuffix(host, "."), "localhost"):
		ips = []netip.Addr{netip.IPv6Loopback(), netip.AddrFrom4([4]byte{127, 0, 0, 1})}
	}
	if err := p.checkOwn(field, addr, port, ips); err != nil {
		return err
	}
	if len(p.allow) == 0 {
		return nil
	}
	if ipErr != nil {
		return fmt.Errorf("%s: %w: %q: with engine_networks set, an engine address must be an IP address", field, ErrRefusedAddress, truncate(addr))
	}
	return p.checkAllowed(field, addr, ip)
}

// checkOwn refuses addr when one of ips, with port, is a listener of the
// gateway.
func (p *AddressPolicy) checkOwn(field, addr, port string, ips []netip.Addr) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, own := range p.own {
		if port != fmt.Sprint(own.Port()) {
			continue
		}
		for _, a := range ips {
			if a == own.Addr() || own.Addr().IsUnspecified() && (a.IsLoopback() || p.local[a]) {
				return fmt.Errorf("%s: %w: %q is the gateway's own listener %s", field, ErrRefusedAddress, truncate(addr), own)
			}
		}
	}
	return nil
}

// checkAllowed refuses ip (of addr) when engine_networks are set and none
// holds it.
func (p *AddressPolicy) checkAllowed(field, addr string, ip netip.Addr) error {
	if len(p.allow) == 0 {
		return nil
	}
	for _, n := range p.allow {
		if n.Contains(ip) {
			return nil
		}
	}
	return fmt.Errorf("%s: %w: %q is in none of engine_networks", field, ErrRefusedAddress, truncate(addr))
}

// CheckDial applies the policy to the address a connection to an engine is
// about to be made to, once any host name in the engine's address was
// resolved: a name that passed Check may resolve, or later be made to
// resolve, to an address Check refuses as a literal. It refuses the
// unspecified, multicast and link-local addresses (where cloud metadata
// services live), the gateway's own listeners, and addresses outside
// engine_networks when they are set, with an error wrapping
// ErrRefusedAddress. A nil policy refuses only the first three.
func (p *AddressPolicy) CheckDial(network, address string) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("dial %s: %w: %q is not ip:port", network, ErrRefusedAddress, truncate(address))
	}
	ip := ap.Addr().Unmap()
	switch {
	case ip.IsUnspecified():
		return fmt.Errorf("dial %s: %w: %s is the unspecified address", network, ErrRefusedAddress, address)
	case ip.IsMulticast():
		return fmt.Errorf("dial %s: %w: %s is a multicast address", network, ErrRefusedAddress, address)
	case ip.IsLinkLocalUnicast():
		return fmt.Errorf("dial %s: %w: %s is link-local (169.254.0.0/16, fe80::/10)", network, ErrRefusedAddress, address)
	}
	if p == nil {
		return nil
	}
	field := "dial " + network
	if err := p.checkOwn(field, address, fmt.Sprint(ap.Port()), []netip.Addr{ip}); err != nil {
		return err
	}
	return p.checkAllowed(field, address, ip)
}

// DialControl is CheckDial as a net.Dialer's Control: it runs for every
// address a dial tries, after name resolution and before connecting.
func (p *AddressPolicy) DialControl(network, address string, _ syscall.RawConn) error {
	return p.CheckDial(network, address)
}
