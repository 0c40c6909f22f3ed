package peerlimit

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestAllowPerPeer(t *testing.T) {
	l := New(Options{Rate: 10, Burst: 3})
	t0 := time.Unix(1000, 0)
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	for i := range 3 {
		if !l.Allow(a, t0) {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	if l.Allow(a, t0) {
		t.Fatal("fourth request at once allowed past a burst of 3")
	}
	if !l.Allow(b, t0) {
		t.Fatal("another peer refused because of the first one")
	}
	if !l.Allow(a, t0.Add(100*time.Millisecond)) {
		t.Fatal("a token did not come back after 1/rate")
	}
}

func TestNilAndDisabled(t *testing.T) {
	if l := New(Options{}); l != nil {
		t.Fatal("rate 0 should disable the limiter")
	}
	var l *Limiter
	if !l.Allow(netip.Addr{}, time.Now()) {
		t.Fatal("nil limiter refused")
	}
}

// TestBoundedPeers: many distinct peers never grow the table past
// MaxPeers; idle buckets are swept, and when none is idle new peers share
// the overflow bucket.
func TestBoundedPeers(t *testing.T) {
	l := New(Options{Rate: 1, Burst: 1, MaxPeers: 4})
	t0 := time.Unix(1000, 0)
	for i := range 100 {
		l.Allow(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), t0)
	}
	if n := len(l.peers); n > 4 {
		t.Fatalf("%d buckets kept, want at most 4", n)
	}
	// After they refill, the table is swept for newcomers.
	if !l.Allow(netip.MustParseAddr("10.1.0.1"), t0.Add(2*time.Second)) {
		t.Fatal("a new peer refused after the idle buckets refilled")
	}
	if _, ok := l.peers[netip.MustParseAddr("10.1.0.1")]; !ok {
		t.Fatal("the new peer did not get its own bucket after the sweep")
	}
}

func TestKey(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 5000}, "127.0.0.1"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.1"), Port: 1}, "10.0.0.1"},
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 1}, "::1"},
		{&net.UnixAddr{Name: "/tmp/s", Net: "unix"}, "invalid IP"},
		{nil, "invalid IP"},
	} {
		if got := Key(tc.addr).String(); got != tc.want {
			t.Errorf("Key(%v) = %s, want %s", tc.addr, got, tc.want)
		}
	}
}
