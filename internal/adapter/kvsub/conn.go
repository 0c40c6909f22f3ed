package kvsub

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// ErrOversized: the engine sent a frame or message beyond the bounds; the
// connection is closed.
var ErrOversized = errors.New("kvsub: oversized message")

// Bounds bound what an engine may send on one connection.
type Bounds struct {
	// MaxMessage bounds a message's bytes (every frame of it); MaxFrames
	// its frames.
	MaxMessage int
	MaxFrames  int
}

// Control checks an address before a connection is made to it (a
// net.Dialer's Control: fleet.AddressPolicy.DialControl).
type Control func(network, address string, c syscall.RawConn) error

// dial connects to endpoint and opens a ZMTP connection of socket type typ
// on it (the handshake bounded by timeout), whose reads are bounded by b.
func dial(ctx context.Context, endpoint string, typ zmq4.SocketType, timeout time.Duration, b Bounds, control Control) (*zmq4.Conn, net.Conn, error) {
	network, addr, err := fleet.ParseKVEndpoint(endpoint)
	if err != nil {
		return nil, nil, err
	}
	d := net.Dialer{Timeout: timeout, KeepAlive: 15 * time.Second}
	if network == "tcp" {
		d.Control = control
	}
	raw, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, nil, fmt.Errorf("kvsub: dial %s: %w", endpoint, err)
	}
	conn := &boundedConn{Conn: raw, r: bufio.NewReaderSize(raw, readBuffer), b: b, greeting: greetingLen}
	_ = raw.SetDeadline(time.Now().Add(timeout))
	zc, err := zmq4.Open(conn, NullSecurity(), typ, zmq4.SocketIdentity(""), false, nil)
	if err != nil {
		_ = raw.Close()
		return nil, nil, fmt.Errorf("kvsub: handshake with %s: %w", endpoint, err)
	}
	_ = raw.SetDeadline(time.Time{})
	return zc, conn, nil
}

// greetingLen is the ZMTP 3 greeting's length: signature, version,
// mechanism, as-server, filler.
const greetingLen = 64

// readBuffer is the bytes a connection reads from its socket at a time.
// The ZMTP reader reads each frame's header and body apart (three frames
// a batch), which unbuffered would be six system calls or more a batch.
const readBuffer = 64 << 10

// boundedConn reads a ZMTP stream, buffered, and refuses, before the bytes
// reach the ZMTP reader (which would allocate whatever size a frame header
// claims), a frame or message beyond its bounds: ZMTP frames are a flags
// byte (bit 0 more frames follow, bit 1 a long 8-byte size, bit 2 a
// command), the size, and the body.
type boundedConn struct {
	net.Conn
	r        *bufio.Reader // of Conn
	b        Bounds
	greeting int // greeting bytes still to pass
	state    int // what the next byte is
	flags    byte
	size     [8]byte
	sizeLen  int // size bytes read
	body     uint64
	msgBytes uint64
	frames   int
	err      error
}

const (
	stFlags = iota
	stSize
	stBody
)

// Read reads from the connection and checks what it read.
func (c *boundedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.r.Read(p)
	if cerr := c.check(p[:n]); cerr != nil {
		c.err = cerr
		_ = c.Conn.Close()
		return 0, cerr
	}
	return n, err
}

// check advances the frame parser over b.
func (c *boundedConn) check(b []byte) error {
	for len(b) > 0 {
		if c.greeting > 0 {
			k := min(c.greeting, len(b))
			c.greeting -= k
			b = b[k:]
			continue
		}
		switch c.state {
		case stFlags:
			c.flags = b[0]
			b = b[1:]
			c.state, c.sizeLen = stSize, 0
		case stSize:
			need := 1
			if c.flags&0x02 != 0 {
				need = 8
			}
			k := min(need-c.sizeLen, len(b))
			copy(c.size[c.sizeLen:], b[:k])
			c.sizeLen += k
			b = b[k:]
			if c.sizeLen < need {
				continue
			}
			if need == 1 {
				c.body = uint64(c.size[0])
			} else {
				c.body = binary.BigEndian.Uint64(c.size[:])
			}
			if err := c.frame(); err != nil {
				return err
			}
			c.state = stBody
			if c.body == 0 {
				c.state = stFlags
			}
		case stBody:
			k := uint64(len(b))
			if k > c.body {
				k = c.body
			}
			c.body -= k
			b = b[k:]
			if c.body == 0 {
				c.state = stFlags
			}
		}
	}
	return nil
}

// frame accounts for a frame whose header was just read.
func (c *boundedConn) frame() error {
	if c.flags&0x04 != 0 { // a command: handshake, ping
		if c.body > 1<<16 {
			return fmt.Errorf("%w: a command of %d bytes", ErrOversized, c.body)
		}
		return nil
	}
	c.frames++
	c.msgBytes += c.body
	if c.frames > c.b.MaxFrames || c.msgBytes > uint64(c.b.MaxMessage) {
		return fmt.Errorf("%w: %d frames, %d bytes (at most %d frames, %d bytes)", ErrOversized, c.frames, c.msgBytes, c.b.MaxFrames, c.b.MaxMessage)
	}
	if c.flags&0x01 == 0 { // the message's last frame
		c.frames, c.msgBytes = 0, 0
	}
	return nil
}

// NullSecurity is ZMTP's NULL security mechanism (no authentication, no
// encryption), which vLLM's and SGLang's publishers use, for zmq4.Open:
// each side sends its READY command with its metadata (socket type,
// identity) and reads the other's.
func NullSecurity() zmq4.Security { return nullSecurity{} }

type nullSecurity struct{}

func (nullSecurity) Type() zmq4.SecurityType { return zmq4.NullSecurity }

func (nullSecurity) Handshake(conn *zmq4.Conn, _ bool) error {
	raw, err := conn.Meta.MarshalZMTP()
	if err != nil {
		return fmt.Errorf("kvsub: metadata: %w", err)
	}
	if err := conn.SendCmd(zmq4.CmdReady, raw); err != nil {
		return fmt.Errorf("kvsub: send READY: %w", err)
	}
	cmd, err := conn.RecvCmd()
	if err != nil {
		return fmt.Errorf("kvsub: read READY: %w", err)
	}
	if cmd.Name != zmq4.CmdReady {
		return fmt.Errorf("kvsub: %w: %q, want READY", zmq4.ErrBadCmd, cmd.Name)
	}
	if err := conn.Peer.Meta.UnmarshalZMTP(cmd.Body); err != nil {
		return fmt.Errorf("kvsub: peer metadata: %w", err)
	}
	return nil
}

func (nullSecurity) Encrypt(w io.Writer, data []byte) (int, error) { return w.Write(data) }
func (nullSecurity) Decrypt(w io.Writer, data []byte) (int, error) { return w.Write(data) }
