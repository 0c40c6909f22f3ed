package kvpub

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/tlgate/tlgate/internal/adapter/kvsub"
)

// ReplayBuffer is how many batches a Publisher keeps for replay (vLLM's
// default buffer_steps).
const ReplayBuffer = 10000

// Publisher is an engine's KV events publisher as vLLM's
// ZmqEventPublisher is: a PUB socket sending [topic, seq, payload], seq
// counting from 0, and an optional ROUTER replay socket that answers an
// 8-byte start sequence number with every buffered batch from it, then
// the end marker (-1). It listens on 127.0.0.1 and stops at the test's
// end.
type Publisher struct {
	t     testing.TB
	topic string
	ln    net.Listener
	rln   net.Listener // nil: no replay socket

	mu       sync.Mutex
	subs     map[*peer]bool // subscribed connections
	conns    map[*peer]bool
	seq      uint64
	buf      []buffered
	noReplay bool // answer replay requests with the end marker only
	replays  int
	wg       sync.WaitGroup
	closed   bool
}

type buffered struct {
	seq     uint64
	payload []byte
}

// peer is one accepted ZMTP connection.
type peer struct {
	mu sync.Mutex // serializes writes
	c  *zmq4.Conn
}

func (p *peer) send(frames ...[]byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.c.SendMsg(zmq4.NewMsgFrom(frames...))
}

// NewPublisher starts a publisher of topic, with a replay socket when
// replay is true.
func NewPublisher(t testing.TB, topic string, replay bool) *Publisher {
	t.Helper()
	p := &Publisher{t: t, topic: topic, subs: map[*peer]bool{}, conns: map[*peer]bool{}}
	var err error
	if p.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	p.wg.Add(1)
	go p.accept(p.ln, zmq4.Pub, p.serveSub)
	if replay {
		if p.rln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		p.wg.Add(1)
		go p.accept(p.rln, zmq4.Router, p.serveReplay)
	}
	t.Cleanup(p.Close)
	return p
}

// Endpoint is the PUB socket's endpoint, tcp://127.0.0.1:port.
func (p *Publisher) Endpoint() string { return "tcp://" + p.ln.Addr().String() }

// ReplayEndpoint is the replay socket's endpoint ("" without one).
func (p *Publisher) ReplayEndpoint() string {
	if p.rln == nil {
		return ""
	}
	return "tcp://" + p.rln.Addr().String()
}

// Close stops the publisher: every connection is closed.
func (p *Publisher) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	for c := range p.conns {
		_ = c.c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	if p.rln != nil {
		_ = p.rln.Close()
	}
	p.wg.Wait()
}

func (p *Publisher) accept(ln net.Listener, typ zmq4.SocketType, serve func(*peer)) {
	defer p.wg.Done()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			zc, err := zmq4.Open(conn, kvsub.NullSecurity(), typ, zmq4.SocketIdentity(""), true, nil)
			if err != nil {
				_ = conn.Close()
				return
			}
			_ = conn.SetDeadline(time.Time{})
			pe := &peer{c: zc}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				_ = zc.Close()
				return
			}
			p.conns[pe] = true
			p.mu.Unlock()
			serve(pe)
			p.mu.Lock()
			delete(p.conns, pe)
			delete(p.subs, pe)
			p.mu.Unlock()
			_ = zc.Close()
		}()
	}
}

// serveSub reads a subscriber's subscriptions ([1, topic] or [0, topic]).
func (p *Publisher) serveSub(pe *peer) {
	for {
		msg, err := pe.c.RecvMsg()
		if err != nil {
			return
		}
		if len(msg.Frames) != 1 || len(msg.Frames[0]) == 0 {
			continue
		}
		f := msg.Frames[0]
		p.mu.Lock()
		switch f[0] {
		case 1:
			if len(f[1:]) <= len(p.topic) && string(f[1:]) == p.topic[:len(f[1:])] {
				p.subs[pe] = true
			}
		case 0:
			delete(p.subs, pe)
		}
		p.mu.Unlock()
	}
}

// serveReplay answers replay requests (["", start seq]).
func (p *Publisher) serveReplay(pe *peer) {
	for {
		msg, err := pe.c.RecvMsg()
		if err != nil {
			return
		}
		fr := msg.Frames
		if len(fr) == 2 && len(fr[0]) == 0 {
			fr = fr[1:]
		}
		if len(fr) != 1 || len(fr[0]) != 8 {
			continue
		}
		start := binary.BigEndian.Uint64(fr[0])
		p.mu.Lock()
		p.replays++
		var out []buffered
		if !p.noReplay {
			for _, b := range p.buf {
				if b.seq >= start {
					out = append(out, b)
				}
			}
		}
		p.mu.Unlock()
		for _, b := range out {
			if pe.send(nil, seqBytes(b.seq), b.payload) != nil {
				return
			}
		}
		if pe.send(nil, seqBytes(^uint64(0)), nil) != nil {
			return
		}
	}
}

func seqBytes(s uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, s)
	return b
}

// Subscribers returns how many connections are subscribed.
func (p *Publisher) Subscribers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.subs)
}

// Replays returns how many replay requests were answered.
func (p *Publisher) Replays() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replays
}

// WaitSubscribers waits until n connections are subscribed (10 s at most).
func (p *Publisher) WaitSubscribers(n int) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for p.Subscribers() < n {
		select {
		case <-ctx.Done():
			p.t.Fatalf("kvpub: %d subscribers after 10s, want %d", p.Subscribers(), n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Publish sends b, encoded by o, with the next sequence number, keeps it
// for replay, and returns its sequence number.
func (p *Publisher) Publish(b Batch, o Options) uint64 {
	return p.PublishPayload(Encode(b, o))
}

// PublishPayload sends payload as the next batch.
func (p *Publisher) PublishPayload(payload []byte) uint64 {
	s := p.next(payload)
	p.Send([]byte(p.topic), seqBytes(s), payload)
	return s
}

// Lose takes the next sequence number for b and keeps it for replay
// without sending it: a batch lost on the way (a PUB socket's high-water
// mark, a subscriber reconnecting).
func (p *Publisher) Lose(b Batch, o Options) uint64 { return p.next(Encode(b, o)) }

func (p *Publisher) next(payload []byte) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.seq
	p.seq++
	p.buf = append(p.buf, buffered{s, payload})
	if len(p.buf) > ReplayBuffer {
		p.buf = p.buf[len(p.buf)-ReplayBuffer:]
	}
	return s
}

// Restart starts the sequence numbers again from 0 and empties the replay
// buffer, as a restarted engine does.
func (p *Publisher) Restart() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq, p.buf = 0, nil
}

// SetSeq makes n the next sequence number.
func (p *Publisher) SetSeq(n uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq = n
}

// ForgetReplay empties the replay buffer (it wrapped), and with refuse
// set answers every later replay request with the end marker alone.
func (p *Publisher) ForgetReplay(refuse bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf, p.noReplay = nil, refuse
}

// Send sends frames as one message to every subscriber, whatever they
// are (a test's garbage).
func (p *Publisher) Send(frames ...[]byte) {
	p.mu.Lock()
	subs := make([]*peer, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		if err := s.send(frames...); err != nil && !errors.Is(err, zmq4.ErrClosedConn) {
			p.t.Logf("kvpub: send: %v", err)
		}
	}
}

// Kick closes every subscriber's connection (they reconnect).
func (p *Publisher) Kick() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.subs {
		_ = s.c.Close()
		delete(p.subs, s)
	}
}
