package enginesim

import (
	"fmt"
	"net"
	"sync"
)

// gateListener is a TCP listener that can really stop listening (so
// connections are refused by the kernel) and listen again on the same
// address, while its server's Accept loop just waits. It tracks the
// connections it accepted so they can be closed all at once.
type gateListener struct {
	addr net.Addr

	mu      sync.Mutex
	cur     net.Listener // nil while refusing
	closed  bool
	changed chan struct{} // closed (and replaced) whenever cur or closed changes
	conns   map[*gateConn]struct{}
}

func listen(addr string) (*gateListener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("enginesim: listen %s: %w", addr, err)
	}
	return &gateListener{
		addr:    ln.Addr(),
		cur:     ln,
		changed: make(chan struct{}),
		conns:   make(map[*gateConn]struct{}),
	}, nil
}

// Accept waits for a connection; while refusing it waits for reopen.
func (l *gateListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, net.ErrClosed
		}
		cur, changed := l.cur, l.changed
		l.mu.Unlock()
		if cur == nil {
			<-changed
			continue
		}
		c, err := cur.Accept()
		l.mu.Lock()
		if err != nil {
			swapped := l.cur != cur || l.closed
			l.mu.Unlock()
			if swapped {
				continue
			}
			return nil, err
		}
		if l.closed || l.cur != cur { // refused or closed meanwhile
			l.mu.Unlock()
			c.Close()
			continue
		}
		gc := &gateConn{Conn: c, l: l}
		l.conns[gc] = struct{}{}
		l.mu.Unlock()
		return gc, nil
	}
}

// signalLocked wakes Accept calls waiting on a change.
func (l *gateListener) signalLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// refuse closes the socket: new connections are refused until reopen.
func (l *gateListener) refuse() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != nil {
		l.cur.Close()
		l.cur = nil
		l.signalLocked()
	}
}

// reopen listens on the same address again after refuse.
func (l *gateListener) reopen() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != nil || l.closed {
		return nil
	}
	ln, err := net.Listen("tcp", l.addr.String())
	if err != nil {
		return fmt.Errorf("enginesim: listen again on %s: %w", l.addr, err)
	}
	l.cur = ln
	l.signalLocked()
	return nil
}

// Close stops listening for good; accepted connections stay open.
func (l *gateListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.cur != nil {
		l.cur.Close()
		l.cur = nil
	}
	l.signalLocked()
	return nil
}

// closeConns closes every open accepted connection.
func (l *gateListener) closeConns() {
	l.mu.Lock()
	conns := make([]*gateConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// Addr returns the address first listened on (kept across refuse).
func (l *gateListener) Addr() net.Addr { return l.addr }

type gateConn struct {
	net.Conn
	l    *gateListener
	once sync.Once
}

func (c *gateConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
