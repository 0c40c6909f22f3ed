// Package connlimit caps the connections a listener holds open, in total
// and per client address (the remote IP). A connection over a cap is closed
// as soon as it is accepted, before a byte of it is read, and the listener
// goes on accepting: a flood of idle or slow connections from one address
// cannot exhaust the process's file descriptors and memory, nor, up to the
// total cap, lock other clients out.
package connlimit

import (
	"net"
	"sync"
)

// Reasons a connection is refused, as passed to Options.OnRefuse.
const (
	ReasonTotal     = "total"
	ReasonPerClient = "per_client"
)

// Options configures the caps. A cap of 0 is no cap.
type Options struct {
	// Max caps the open connections in total.
	Max int
	// PerClient caps the open connections of one remote IP.
	PerClient int
	// OnRefuse, if set, is called (from Accept; it must not block) for each
	// connection refused, with its remote address and the Reason.
	OnRefuse func(remote net.Addr, reason string)
}

// Listener is a net.Listener whose connections are capped.
type Listener struct {
	net.Listener
	o     Options
	mu    sync.Mutex
	total int
	per   map[string]int
}

// Wrap returns l with the caps of o.
func Wrap(l net.Listener, o Options) *Listener {
	return &Listener{Listener: l, o: o, per: map[string]int{}}
}

// Accept returns the next connection within the caps; those over a cap are
// closed and skipped.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := clientOf(c.RemoteAddr())
		if reason := l.acquire(ip); reason != "" {
			_ = c.Close()
			if l.o.OnRefuse != nil {
				l.o.OnRefuse(c.RemoteAddr(), reason)
			}
			continue
		}
		return &conn{Conn: c, l: l, ip: ip}, nil
	}
}

// Open returns the number of open connections in total and of the client
// whose address is addr (an IP, or host:port).
func (l *Listener) Open(addr string) (total, client int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.per[clientOfString(addr)]
}

func (l *Listener) acquire(ip string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.o.Max > 0 && l.total >= l.o.Max:
		return ReasonTotal
	case l.o.PerClient > 0 && l.per[ip] >= l.o.PerClient:
		return ReasonPerClient
	}
	l.total++
	l.per[ip]++
	return ""
}

func (l *Listener) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.per[ip]--; l.per[ip] <= 0 {
		delete(l.per, ip)
	}
}

// clientOf is the key a connection is counted under: its remote IP.
func clientOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	return clientOfString(a.String())
}

func clientOfString(s string) string {
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	if ip := net.ParseIP(s); ip != nil {
		return ip.String()
	}
	return s
}

// conn is an accepted connection; closing it frees its place.
type conn struct {
	net.Conn
	l    *Listener
	ip   string
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.ip) })
	return err
}

// CloseWrite half-closes the connection when the underlying one can (net/http
// does so before closing a connection whose request it did not read whole).
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
