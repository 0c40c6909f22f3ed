package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/adapter/config"
)

// lookupTimeout bounds one resolution of a DNS source's name.
const lookupTimeout = 5 * time.Second

// DNS is a source that resolves a name every interval: its A and AAAA
// records (each address an engine at the configured port) or its SRV
// records (each target's addresses an engine at the record's port), as a
// Kubernetes headless Service publishes its ready pods.
//
// An address that stops being published drains (it is reported draining)
// for drain_period, then is dropped; an address published again within
// it is routable again. A name that does not exist (NXDOMAIN) has no
// addresses; any other failure (a timeout, SERVFAIL), of any name the
// search list makes of it or of either address family, keeps the last set
// and is logged once until a resolution succeeds.
//
// Each address is an engine of its own: DNS does not say which addresses
// are one pod's, so a dual-stack headless Service's pod, published with an
// IPv4 and an IPv6 address, is two engines (the Kubernetes source merges a
// pod's families into one).
type DNS struct {
	cfg      config.Discovery
	log      zerolog.Logger
	resolver resolver
	now      func() time.Time

	// present and gone belong to Run's goroutine.
	present map[string]string    // key → address, published by the last resolution
	gone    map[string]goneEntry // key → address and when it was last published
	failing bool
}

// resolver is the part of *net.Resolver a DNS source asks.
type resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

type goneEntry struct {
	addr  string
	since time.Time
}

// NewDNS returns the DNS source c configures. With c.Resolver set, every
// query goes to that server; otherwise to the system's.
//
// Its resolvers have StrictErrors set: a temporary failure (a timeout,
// SERVFAIL) of any name of the search list, or of either address family,
// fails the whole resolution. Without it Go's resolver goes on to the next
// name of the search list and may return that name's NXDOMAIN (with
// Kubernetes' ndots:5, a SERVFAIL on an SRV name or on a short name's first
// expansion would read as no engines), or returns the addresses of the
// family that answered (half a dual-stack set).
func NewDNS(c config.Discovery, log zerolog.Logger) *DNS {
	r := &net.Resolver{StrictErrors: true}
	if c.Resolver != "" {
		server := c.Resolver
		r = &net.Resolver{PreferGo: true, StrictErrors: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, server)
		}}
	}
	return &DNS{cfg: c, log: log, resolver: r, now: time.Now, present: map[string]string{}, gone: map[string]goneEntry{}}
}

// Run resolves the name at once and then every interval, reporting the set
// after each resolution, until ctx ends.
func (d *DNS) Run(ctx context.Context, report func([]Endpoint)) {
	t := time.NewTicker(d.cfg.Interval.Duration)
	defer t.Stop()
	for {
		if eps, ok := d.once(ctx); ok {
			report(eps)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// once resolves the name and returns the set to report, or false when the
// resolution failed and the last set stands.
func (d *DNS) once(ctx context.Context) ([]Endpoint, bool) {
	lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	addrs, err := d.resolve(lctx)
	cancel()
	if ctx.Err() != nil {
		return nil, false
	}
	if err != nil {
		if !d.failing {
			d.log.Warn().Err(err).Str("host", d.cfg.Host).Msg("discovery: DNS resolution failed; keeping the last engines")
		}
		d.failing = true
		return d.apply(nil, false), true
	}
	if d.failing {
		d.log.Info().Str("host", d.cfg.Host).Int("addresses", len(addrs)).Msg("discovery: DNS resolves again")
	}
	d.failing = false
	return d.apply(addrs, true), true
}

// apply folds a resolution's addresses (when resolved) into present and
// gone and returns the set: present ones routable, gone ones draining
// until drain_period has passed.
func (d *DNS) apply(addrs map[string]string, resolved bool) []Endpoint {
	now := d.now()
	if resolved {
		for key, addr := range d.present {
			if _, still := addrs[key]; !still {
				d.gone[key] = goneEntry{addr: addr, since: now}
				d.log.Info().Str("address", addr).Msg("discovery: address gone from DNS; draining")
			}
		}
		for key := range addrs {
			delete(d.gone, key)
		}
		d.present = addrs
	}
	eps := make([]Endpoint, 0, len(d.present)+len(d.gone))
	for key, addr := range d.present {
		eps = append(eps, Endpoint{Key: key, Address: addr})
	}
	for key, g := range d.gone {
		if now.Sub(g.since) >= d.cfg.DrainPeriod.Duration {
			delete(d.gone, key)
			continue
		}
		eps = append(eps, Endpoint{Key: key, Address: g.addr, Draining: true})
	}
	slices.SortFunc(eps, func(a, b Endpoint) int { return strings.Compare(a.Key, b.Key) })
	return eps
}

// resolve returns the published addresses by key (ip:port without
// brackets).
func (d *DNS) resolve(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	if d.cfg.Record == config.RecordSRV {
		_, srvs, err := d.resolver.LookupSRV(ctx, "", "", d.cfg.Host)
		if notFound(err) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("discovery: SRV %s: %w", d.cfg.Host, d.named(err))
		}
		for _, s := range srvs {
			ips, err := d.lookupIPs(ctx, s.Target)
			if err != nil {
				return nil, err
			}
			for _, ip := range ips {
				d.add(out, ip, int(s.Port))
			}
		}
		return out, nil
	}
	ips, err := d.lookupIPs(ctx, d.cfg.Host)
	if err != nil {
		return nil, err
	}
	for _, ip := range ips {
		d.add(out, ip, d.cfg.Port.Number())
	}
	return out, nil
}

func (d *DNS) add(out map[string]string, ip net.IP, port int) {
	out[fmt.Sprintf("%s:%d", ip, port)] = hostPort(ip.String(), port)
}

// lookupIPs resolves name's A and AAAA records; a name that does not exist
// has none.
func (d *DNS) lookupIPs(ctx context.Context, name string) ([]net.IP, error) {
	if ip := net.ParseIP(name); ip != nil {
		return []net.IP{ip}, nil
	}
	as, err := d.resolver.LookupIPAddr(ctx, name)
	if notFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("discovery: A/AAAA %s: %w", name, d.named(err))
	}
	ips := make([]net.IP, len(as))
	for i, a := range as {
		ips[i] = a.IP
	}
	return ips, nil
}

// named returns err naming the configured resolver as the server asked:
// Go's resolver names the server of the system's configuration
// (/etc/resolv.conf) even when every query went to resolver's address.
func (d *DNS) named(err error) error {
	var de *net.DNSError
	if d.cfg.Resolver == "" || !errors.As(err, &de) {
		return err
	}
	c := *de
	c.Server = d.cfg.Resolver
	return &c
}

// notFound reports whether err says the name has no such records.
func notFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}
