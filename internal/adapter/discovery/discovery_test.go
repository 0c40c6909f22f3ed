package discovery

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/probe"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/testkit/syncbuf"
)

// fakeSink keeps what each source last set.
type fakeSink struct {
	mu      sync.Mutex
	engines map[string][]probe.Engine
	sets    int
}

func (s *fakeSink) SetSource(name string, engines []probe.Engine) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.engines[name] = engines
	s.sets++
}

// states writes a source's engines as "id=state;" in id order.
func (s *fakeSink) states(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, e := range s.engines[name] {
		st := "routable"
		if e.Draining {
			st = "draining"
		}
		b.WriteString(e.ID + "=" + st + ";")
	}
	return b.String()
}

// fakeMetrics keeps the last Discovered call.
type fakeMetrics struct {
	mu                       sync.Mutex
	engines, refused, capped int
}

func (m *fakeMetrics) Discovered(_ string, engines, refused, capped int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.engines, m.refused, m.capped = engines, refused, capped
}

func (m *fakeMetrics) get() [3]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return [3]int{m.engines, m.refused, m.capped}
}

// TestDiscoveryDNSDropsForbiddenAddresses: with engine_networks set, a DNS
// source's addresses outside them and those requests are never sent to
// (unspecified, multicast, link-local, among them the cloud metadata
// service) are not reported as engines; each is logged once, not at every
// resolution, and counted.
func TestDiscoveryDNSDropsForbiddenAddresses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = time.Second
		d, f := dnsSource(interval, 10*time.Second)
		forbidden := []string{"169.254.169.254", "0.0.0.0", "224.0.0.1", "fe80::1", "192.168.1.5", "::", "ff02::1"}
		f.set("engines.test", append([]string{"10.0.0.1", "10.0.0.2"}, forbidden...)...)
		sink := &fakeSink{engines: map[string][]probe.Engine{}}
		m := &fakeMetrics{}
		var logs syncbuf.Buffer
		r, err := Start([]config.Discovery{d.cfg}, sink, Options{
			Logger: zerolog.New(&logs), Metrics: m,
			Addresses: fleet.NewAddressPolicy([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fe80::/10")}),
			NewSource: func(config.Discovery, zerolog.Logger) (Source, error) { return d, nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		synctest.Wait()
		want := "d:10.0.0.1:8000=routable;d:10.0.0.2:8000=routable;"
		if got := sink.states("d"); got != want {
			t.Fatalf("engines %s, want %s", got, want)
		}
		if got := m.get(); got != [3]int{2, len(forbidden), 0} {
			t.Fatalf("metrics (engines, refused, capped) = %v, want [2 %d 0]", got, len(forbidden))
		}
		for range 3 {
			time.Sleep(interval)
			synctest.Wait()
		}
		out := logs.String()
		for _, a := range forbidden {
			hp := netip.AddrPortFrom(netip.MustParseAddr(a), 8000).String()
			if n := strings.Count(out, `"address":"`+hp+`"`); n != 1 {
				t.Errorf("%s logged %d times over 4 resolutions, want once:\n%s", hp, n, out)
			}
		}
		if strings.Contains(out, "10.0.0.1") {
			t.Errorf("an engine's address was logged as dropped:\n%s", out)
		}
		if got := sink.states("d"); got != want {
			t.Fatalf("engines after 4 resolutions %s, want %s", got, want)
		}
	})
}

// steppedSource reports the sets the test sends, one at a time.
type steppedSource struct {
	sets chan []Endpoint
	done chan struct{}
}

func (s *steppedSource) Run(ctx context.Context, report func([]Endpoint)) {
	for {
		select {
		case <-ctx.Done():
			return
		case eps := <-s.sets:
			report(eps)
			s.done <- struct{}{}
		}
	}
}

// report hands eps to the source and waits until the Runner took it.
func (s *steppedSource) report(eps ...Endpoint) {
	s.sets <- eps
	<-s.done
}

func ep(key string, draining bool) Endpoint {
	return Endpoint{Key: key, Address: "10.0.0." + strings.TrimPrefix(key, "e") + ":8000", Draining: draining}
}

// TestDiscoveryCap: a source reports at most max_engines engines; past it
// routable engines win over draining ones and engines it already reported
// over new ones (the set does not churn), the rest are left out, counted,
// and logged once when the cap is reached and once when it is not any
// more. The cap is the Runner's, for every kind of source.
func TestDiscoveryCap(t *testing.T) {
	src := &steppedSource{sets: make(chan []Endpoint), done: make(chan struct{})}
	sink := &fakeSink{engines: map[string][]probe.Engine{}}
	m := &fakeMetrics{}
	var logs syncbuf.Buffer
	cfg := config.Discovery{Name: "k", Kind: config.DiscoveryKubernetes, EngineKind: config.KindVLLM, Scheme: "http", MaxEngines: 3}
	r, err := Start([]config.Discovery{cfg}, sink, Options{Logger: zerolog.New(&logs), Metrics: m,
		NewSource: func(config.Discovery, zerolog.Logger) (Source, error) { return src, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	capLogs := func() int { return strings.Count(logs.String(), "more engines than max_engines") }

	for _, step := range []struct {
		name    string
		eps     []Endpoint
		want    string
		metrics [3]int
		capLogs int
	}{
		{"five found", []Endpoint{ep("e2", false), ep("e3", false), ep("e4", false), ep("e5", false), ep("e6", false)},
			"k:e2=routable;k:e3=routable;k:e4=routable;", [3]int{3, 0, 2}, 1},
		{"a new one sorting first does not displace a kept one", []Endpoint{ep("e1", false), ep("e2", false), ep("e3", false), ep("e4", false), ep("e5", false)},
			"k:e2=routable;k:e3=routable;k:e4=routable;", [3]int{3, 0, 2}, 1},
		{"routable ones win over a draining kept one", []Endpoint{ep("e1", false), ep("e2", true), ep("e3", false), ep("e4", false)},
			"k:e1=routable;k:e3=routable;k:e4=routable;", [3]int{3, 0, 1}, 1},
		{"within the cap again", []Endpoint{ep("e3", false), ep("e4", true)},
			"k:e3=routable;k:e4=draining;", [3]int{2, 0, 0}, 1},
		{"over it again", []Endpoint{ep("e3", false), ep("e4", false), ep("e5", false), ep("e6", false)},
			"k:e3=routable;k:e4=routable;k:e5=routable;", [3]int{3, 0, 1}, 2},
	} {
		src.report(step.eps...)
		if got := sink.states("k"); got != step.want {
			t.Fatalf("%s: engines %s, want %s", step.name, got, step.want)
		}
		if got := m.get(); got != step.metrics {
			t.Fatalf("%s: metrics (engines, refused, capped) %v, want %v", step.name, got, step.metrics)
		}
		if got := capLogs(); got != step.capLogs {
			t.Fatalf("%s: the cap was logged %d times, want %d:\n%s", step.name, got, step.capLogs, logs.String())
		}
	}
	if !strings.Contains(logs.String(), "within max_engines again") {
		t.Fatalf("the end of the cap was not logged:\n%s", logs.String())
	}
}
