package discovery

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/miekg/dns"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/adapter/config"
)

// fakeResolver answers A/AAAA lookups from a table the test changes.
type fakeResolver struct {
	mu    sync.Mutex
	hosts map[string][]string // name → addresses
	err   error
}

func (f *fakeResolver) set(name string, addrs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hosts[name] = addrs
}

func (f *fakeResolver) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	addrs, ok := f.hosts[host]
	if !ok || len(addrs) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	out := make([]net.IPAddr, len(addrs))
	for i, a := range addrs {
		out[i] = net.IPAddr{IP: net.ParseIP(a)}
	}
	return out, nil
}

func (f *fakeResolver) LookupSRV(context.Context, string, string, string) (string, []*net.SRV, error) {
	return "", nil, &net.DNSError{Err: "no such host", IsNotFound: true}
}

// dnsSource returns a DNS source of host:8000 resolving through a fake
// resolver, resolved every interval and draining for drain.
func dnsSource(interval, drain time.Duration) (*DNS, *fakeResolver) {
	cfg := config.Discovery{Name: "d", Kind: config.DiscoveryDNS, EngineKind: config.KindVLLM, Host: "engines.test",
		Record: config.RecordA, Port: "8000", Interval: config.D(interval), DrainPeriod: config.D(drain)}
	d := NewDNS(cfg, zerolog.Nop())
	f := &fakeResolver{hosts: map[string][]string{}}
	d.resolver = f
	return d, f
}

// reports runs src until the test ends and keeps its reports.
type reports struct {
	mu  sync.Mutex
	all [][]Endpoint
}

func (r *reports) last(t *testing.T) []Endpoint {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.all) == 0 {
		t.Fatal("no report yet")
	}
	return r.all[len(r.all)-1]
}

func run(t *testing.T, src Source) *reports {
	t.Helper()
	r := &reports{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		src.Run(ctx, func(eps []Endpoint) {
			r.mu.Lock()
			r.all = append(r.all, slices.Clone(eps))
			r.mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return r
}

// states writes a report as "key=state" lines in key order, state routable
// or draining, one line per endpoint listed (a key listed twice shows
// twice).
func states(eps []Endpoint) string {
	var b strings.Builder
	for _, ep := range eps {
		st := "routable"
		if ep.Draining {
			st = "draining"
		}
		fmt.Fprintf(&b, "%s=%s;", ep.Key, st)
	}
	return b.String()
}

// The sets of the drain tests: two addresses, and the second gone.
const (
	bothRoutable   = "10.0.0.1:8000=routable;10.0.0.2:8000=routable;"
	secondDraining = "10.0.0.1:8000=routable;10.0.0.2:8000=draining;"
)

// secondGone runs a source resolved every interval that drains for drain,
// whose name publishes 10.0.0.1 and 10.0.0.2 and then only 10.0.0.1, up
// to the resolution that sees 10.0.0.2 gone. It runs in a synctest bubble.
func secondGone(t *testing.T, interval, drain time.Duration) (*reports, *fakeResolver) {
	t.Helper()
	d, f := dnsSource(interval, drain)
	f.set("engines.test", "10.0.0.1", "10.0.0.2")
	r := run(t, d)
	synctest.Wait()
	if got := states(r.last(t)); got != bothRoutable {
		t.Fatalf("first resolution: %s, want %s", got, bothRoutable)
	}
	f.set("engines.test", "10.0.0.1")
	time.Sleep(interval)
	synctest.Wait()
	if got := states(r.last(t)); got != secondDraining {
		t.Fatalf("just gone: %s, want %s", got, secondDraining)
	}
	return r, f
}

// TestDiscoveryDNSDrainPeriod: an address gone from DNS drains for
// drain_period, however many resolutions (every interval) happen in it,
// and is dropped once drain_period has passed.
func TestDiscoveryDNSDrainPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval, drain = time.Second, 10 * time.Second
		r, _ := secondGone(t, interval, drain)
		gone := time.Now()
		for time.Since(gone)+interval < drain {
			time.Sleep(interval)
			synctest.Wait()
			if got := states(r.last(t)); got != secondDraining {
				t.Fatalf("%s after it went (drain_period %s, interval %s): %s, want %s", time.Since(gone), drain, interval, got, secondDraining)
			}
		}
		time.Sleep(interval) // drain_period has passed
		synctest.Wait()
		if got, want := states(r.last(t)), "10.0.0.1:8000=routable;"; got != want {
			t.Fatalf("%s after it went: %s, want %s", time.Since(gone), got, want)
		}
	})
}

// TestDiscoveryDNSRepublishedWithinDrain: an address gone from DNS and
// published again within drain_period is routable again, listed once, and
// stays so after its old drain_period would have ended.
func TestDiscoveryDNSRepublishedWithinDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval, drain = time.Second, 10 * time.Second
		r, f := secondGone(t, interval, drain)
		f.set("engines.test", "10.0.0.1", "10.0.0.2")
		for i := range 2 * int(drain/interval) {
			time.Sleep(interval)
			synctest.Wait()
			if got := states(r.last(t)); got != bothRoutable {
				t.Fatalf("resolution %d after it came back: %s, want %s", i+1, got, bothRoutable)
			}
		}
	})
}

// dnsServer serves h on a UDP port of 127.0.0.1 until the test ends and
// returns its address.
func dnsServer(t *testing.T, h dns.HandlerFunc) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, NotifyStartedFunc: func() { close(started) }, Handler: h}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ActivateAndServe()
	}()
	<-started
	t.Cleanup(func() {
		_ = srv.Shutdown()
		<-done
	})
	return pc.LocalAddr().String()
}

// TestDiscoveryDNSErrorNamesResolver: with resolver set, a failed
// resolution's error names that server, not the system's.
func TestDiscoveryDNSErrorNamesResolver(t *testing.T) {
	server := dnsServer(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeServerFailure)
		_ = w.WriteMsg(m)
	})
	for _, record := range []string{config.RecordA, config.RecordSRV} {
		cfg := config.Discovery{Name: "d", Kind: config.DiscoveryDNS, Host: "engines.tlgate.test.", Record: record,
			Port: "8000", Resolver: server}
		_, err := NewDNS(cfg, zerolog.Nop()).resolve(t.Context())
		if err == nil || !strings.Contains(err.Error(), "on "+cfg.Resolver+":") {
			t.Fatalf("record %s: error %v does not name the resolver %s", record, err, cfg.Resolver)
		}
	}
}

// TestDiscoveryDNSStrictErrors: a SERVFAIL on one address family fails the
// resolution (the last set stands) rather than resolving to the other
// family's addresses alone, and the system's resolver is as strict. Go's
// resolver treats a SERVFAIL on one name of the search list the same way
// as one on one family, so this also keeps a search list from turning a
// SERVFAIL into the NXDOMAIN of a later name (no engines).
func TestDiscoveryDNSStrictErrors(t *testing.T) {
	server := dnsServer(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		q := r.Question[0]
		if q.Qtype != dns.TypeAAAA {
			m.SetRcode(r, dns.RcodeServerFailure)
			_ = w.WriteMsg(m)
			return
		}
		m.SetReply(r)
		m.Answer = append(m.Answer, &dns.AAAA{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 5},
			AAAA: net.ParseIP("fd00::1")})
		_ = w.WriteMsg(m)
	})
	cfg := config.Discovery{Name: "d", Kind: config.DiscoveryDNS, Host: "engines.tlgate.test.", Record: config.RecordA,
		Port: "8000", Resolver: server}
	got, err := NewDNS(cfg, zerolog.Nop()).resolve(t.Context())
	if err == nil {
		t.Fatalf("A SERVFAIL, AAAA answered: resolved to %v and no error; want an error (the last set stands)", got)
	}

	cfg.Resolver = ""
	r, ok := NewDNS(cfg, zerolog.Nop()).resolver.(*net.Resolver)
	if !ok || !r.StrictErrors {
		t.Fatalf("the system's resolver is %#v; want a *net.Resolver with StrictErrors", NewDNS(cfg, zerolog.Nop()).resolver)
	}
}
