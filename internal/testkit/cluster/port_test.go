package cluster

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestReservedPortIsHeld: nothing else binds a reserved port; a
// connection before the replica takes it is closed at once, one after
// reaches the replica's Accept; the replica's Close releases it.
func TestReservedPortIsHeld(t *testing.T) {
	p := Reserve(t)
	if l, err := net.Listen("tcp", p.Addr()); err == nil {
		_ = l.Close()
		t.Fatalf("listened on reserved %s", p.Addr())
	}

	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection before the port was taken stayed open")
	}
	_ = c.Close()

	lis := p.take()
	if lis.Addr().String() != p.Addr() {
		t.Fatalf("listener on %s, reserved %s", lis.Addr(), p.Addr())
	}
	c, err = net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
		t.Fatalf("accepted connection: %v", err)
	}
	_ = s.Close()

	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := lis.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
	l, err := net.Listen("tcp", p.Addr())
	if err != nil {
		t.Fatalf("port not released: %v", err)
	}
	_ = l.Close()
}
