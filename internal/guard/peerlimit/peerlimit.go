// Package peerlimit rate-limits requests per peer address: a token bucket
// per IP (the port is ignored, since a peer may open many connections),
// with a bounded number of buckets so that many peers cannot exhaust
// memory. It does no I/O.
package peerlimit

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// DefaultMaxPeers bounds the buckets kept when Options.MaxPeers is 0.
const DefaultMaxPeers = 4096

// Options configure a Limiter.
type Options struct {
	// Rate is the sustained requests per second allowed to one peer; 0
	// (or less) disables the limit.
	Rate float64
	// Burst is how many requests a peer may send at once (at least 1).
	Burst int
	// MaxPeers bounds the buckets kept (DefaultMaxPeers when 0). When
	// full, buckets that are full again (their peer idle) are dropped;
	// if none is, a new peer shares one overflow bucket.
	MaxPeers int
}

// Limiter is a set of token buckets keyed by peer IP. It is safe for
// concurrent use. A nil *Limiter allows everything.
type Limiter struct {
	o        Options
	mu       sync.Mutex
	peers    map[netip.Addr]*rate.Limiter
	overflow *rate.Limiter
}

// New returns a limiter; with o.Rate <= 0 it returns nil (no limit).
func New(o Options) *Limiter {
	if o.Rate <= 0 {
		return nil
	}
	if o.Burst < 1 {
		o.Burst = 1
	}
	if o.MaxPeers <= 0 {
		o.MaxPeers = DefaultMaxPeers
	}
	return &Limiter{o: o, peers: map[netip.Addr]*rate.Limiter{}, overflow: rate.NewLimiter(rate.Limit(o.Rate), o.Burst)}
}

// Key returns the bucket key of a peer address: its IP, IPv4-mapped IPv6
// unmapped; the zero Addr (one shared bucket) when addr has no IP.
func Key(addr net.Addr) netip.Addr {
	if addr == nil {
		return netip.Addr{}
	}
	if ap, err := netip.ParseAddrPort(addr.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// Allow reports whether a request from peer may go ahead at now, taking a
// token if so.
func (l *Limiter) Allow(peer netip.Addr, now time.Time) bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.peers[peer]
	if !ok {
		if len(l.peers) >= l.o.MaxPeers {
			l.sweep(now)
		}
		if len(l.peers) >= l.o.MaxPeers {
			b = l.overflow
		} else {
			b = rate.NewLimiter(rate.Limit(l.o.Rate), l.o.Burst)
			l.peers[peer] = b
		}
	}
	return b.AllowN(now, 1)
}

// sweep drops the buckets that have refilled: their peers are idle and
// would start full anyway.
func (l *Limiter) sweep(now time.Time) {
	for k, b := range l.peers {
		if b.TokensAt(now) >= float64(l.o.Burst) {
			delete(l.peers, k)
		}
	}
}
