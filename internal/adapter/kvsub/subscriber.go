// Package kvsub subscribes to engines' KV cache events, as vLLM and SGLang
// publish them over ZMQ: one Subscriber per engine connects a SUB socket
// to the engine's PUB endpoint (and, when the engine has one, a DEALER to
// its replay ROUTER), decodes every batch (internal/wire/kvevents), follows
// the batches' sequence numbers, and hands the batches with the state of
// the engine's view to a Sink (the router actor, which owns the exact
// index).
//
// The view of an engine is exact only while no batch is missing since it
// began:
//
//   - a gap in the sequence numbers is filled from the replay socket; the
//     replay starts at the last batch applied, whose digest must match, so
//     that a restarted engine (its numbers counted again from 0 past the
//     last) is not mistaken for the same one;
//   - a sequence back at 0 is a restarted engine with an empty cache: the
//     view is cleared and starts again, exact, and knows every block the
//     engine holds (Update.Restarted), as does a view whose first batch is
//     the engine's first;
//   - what cannot be recovered (no replay socket, a replay buffer that
//     wrapped, a batch that does not decode, a sequence that jumps
//     backwards, a flood over the byte budget) clears the view and makes
//     it stale until the next batch comes in order;
//   - while the connection is down the view is stale, and on reconnecting
//     it catches up from the replay socket, or starts again.
//
// Everything an engine sends is bounded: frames and messages by size
// before they are read (Bounds), batches by kvevents.Limits, the bytes
// decoded per second by a token bucket, the batches queued between the
// socket and the decoder, and the updates in flight to the Sink (a slow
// Sink makes the queue overflow, which is a gap like any other). Nothing
// here blocks the Sink's owner.
package kvsub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/kvindex"
	"github.com/tlgate/tlgate/internal/wire/kvevents"
)

// Defaults of Config.
const (
	DefaultDialTimeout   = 2 * time.Second
	DefaultReplayTimeout = 2 * time.Second
	DefaultMinBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff    = 5 * time.Second
	// DefaultMaxMessage bounds one message: a batch is one engine step's
	// events, a few KiB to a few hundred.
	DefaultMaxMessage = 16 << 20
	// DefaultBytesPerSecond is the payload bytes decoded per second per
	// engine (with a burst of as much): well above what an engine's steps
	// produce.
	DefaultBytesPerSecond = 64 << 20
	DefaultQueueLen       = 256
	DefaultMaxPending     = 8
	DefaultMaxCoalesce    = 64
)

// Update is what a Subscriber hands its Sink: an engine's batches, in
// order, and its view's state once they are applied.
type Update struct {
	Worker string
	// Clear: empty the view before applying Batches (the engine restarted,
	// or batches were lost).
	Clear bool
	// Restarted: the engine's cache was empty before Batches (it
	// restarted, or Batches begin with its first batch, sequence 0): the
	// view is emptied as with Clear, and knows every block the engine
	// holds (kvindex.Index.ClearRestarted).
	Restarted bool
	Batches   []kvindex.Batch
	State     kvindex.State
}

// Sink applies updates. Send must not block; it calls done once it applied
// u (or dropped it), so that the Subscriber bounds what it has in flight.
type Sink interface {
	Send(u *Update, done func())
}

// Problems an Observer hears of.
const (
	ProblemMalformed    = "malformed"    // a message or batch that does not decode
	ProblemOversized    = "oversized"    // beyond the bounds or limits
	ProblemFlood        = "flood"        // over the byte budget
	ProblemQueueFull    = "queue_full"   // the decoder fell behind the socket
	ProblemBackwards    = "backwards"    // a sequence number going back, not to 0
	ProblemRestart      = "restart"      // the sequence back at 0
	ProblemDisconnected = "disconnected" // the connection dropped or could not be made
	ProblemUnrecovered  = "unrecovered"  // lost batches the replay did not give back
)

// Observer hears what a Subscriber does, for metrics. Its methods are
// called from the Subscriber's goroutines and must not block.
type Observer interface {
	// Received: a batch of events arrived and was decoded (replayed:
	// from the replay socket).
	Received(worker string, events int, replayed bool)
	// Gap: missing batches were noticed; recovered says whether the
	// replay gave them back.
	Gap(worker string, missing uint64, recovered bool)
	// Replayed: a replay request was answered with batches (err: failed).
	Replayed(worker string, batches int, err error)
	// Problem: something was refused or lost (the Problem constants).
	Problem(worker, problem string)
	// Connected: the event socket's connection is up or down.
	Connected(worker string, up bool)
}

// Config is one engine's subscription.
type Config struct {
	// Worker is the engine's worker id, named in every Update.
	Worker string
	// Endpoint is its PUB socket (tcp://host:port or ipc:///path), Replay
	// its replay socket ("" for none), Topic the topic subscribed.
	Endpoint, Replay, Topic string
	Sink                    Sink
	Observer                Observer // nil: none
	Logger                  zerolog.Logger
	// Control checks every address dialed (nil: none).
	Control Control

	DialTimeout, ReplayTimeout time.Duration
	MinBackoff, MaxBackoff     time.Duration
	Bounds                     Bounds
	Limits                     kvevents.Limits
	// BytesPerSecond is the payload bytes decoded per second.
	BytesPerSecond int
	// QueueLen bounds the messages queued between the socket and the
	// decoder; MaxPending the updates in flight to the Sink; MaxCoalesce
	// the batches of one update.
	QueueLen, MaxPending, MaxCoalesce int
}

func (c *Config) defaults() {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.DialTimeout, DefaultDialTimeout)
	def(&c.ReplayTimeout, DefaultReplayTimeout)
	def(&c.MinBackoff, DefaultMinBackoff)
	def(&c.MaxBackoff, DefaultMaxBackoff)
	if c.Bounds.MaxMessage <= 0 {
		c.Bounds.MaxMessage = DefaultMaxMessage
	}
	if c.Bounds.MaxFrames <= 0 {
		c.Bounds.MaxFrames = 4
	}
	if c.BytesPerSecond <= 0 {
		c.BytesPerSecond = DefaultBytesPerSecond
	}
	if c.QueueLen <= 0 {
		c.QueueLen = DefaultQueueLen
	}
	if c.MaxPending <= 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.MaxCoalesce <= 0 {
		c.MaxCoalesce = DefaultMaxCoalesce
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
}

type nopObserver struct{}

func (nopObserver) Received(string, int, bool)  {}
func (nopObserver) Gap(string, uint64, bool)    {}
func (nopObserver) Replayed(string, int, error) {}
func (nopObserver) Problem(string, string)      {}
func (nopObserver) Connected(string, bool)      {}

// Run subscribes to the engine until ctx ends; it returns ctx's error, or
// the configuration's (a bad endpoint).
func Run(ctx context.Context, cfg Config) error {
	cfg.defaults()
	if _, _, err := fleet.ParseKVEndpoint(cfg.Endpoint); err != nil {
		return err
	}
	if cfg.Replay != "" {
		if _, _, err := fleet.ParseKVEndpoint(cfg.Replay); err != nil {
			return err
		}
	}
	s := &sub{cfg: cfg, dec: kvevents.NewDecoder(cfg.Limits), state: kvindex.Pending,
		slots: make(chan struct{}, cfg.MaxPending),
		flood: rate.NewLimiter(rate.Limit(cfg.BytesPerSecond), cfg.BytesPerSecond)}
	return s.run(ctx)
}

// sub is one Subscriber's state, owned by its run goroutine.
type sub struct {
	cfg    Config
	dec    *kvevents.Decoder
	tr     Tracker
	digest uint64 // xxhash of the last applied batch's payload
	state  kvindex.State
	// dedupe: after a catch-up, live batches the replay gave already are
	// skipped until one comes after them.
	dedupe bool
	cur    *Update // being built
	slots  chan struct{}
	flood  *rate.Limiter
}

// message is one message read off the SUB socket (or the reader's end).
type message struct {
	frames [][]byte
	err    error
}

func (s *sub) run(ctx context.Context) error {
	backoff := s.cfg.MinBackoff
	for {
		zc, raw, err := dial(ctx, s.cfg.Endpoint, zmq4.Sub, s.cfg.DialTimeout, s.cfg.Bounds, s.cfg.Control)
		if err == nil {
			err = zc.SendMsg(zmq4.NewMsg(append([]byte{1}, s.cfg.Topic...)))
			if err != nil {
				_ = raw.Close()
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.cfg.Observer.Problem(s.cfg.Worker, ProblemDisconnected)
			s.cfg.Logger.Debug().Err(err).Str("worker", s.cfg.Worker).Msg("kv events: connect")
			s.lost(ctx, false)
			if !sleep(ctx, backoff) {
				return ctx.Err()
			}
			backoff = min(2*backoff, s.cfg.MaxBackoff)
			continue
		}
		s.cfg.Observer.Connected(s.cfg.Worker, true)
		err = s.serve(ctx, zc, raw)
		_ = raw.Close()
		s.cfg.Observer.Connected(s.cfg.Worker, false)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.cfg.Observer.Problem(s.cfg.Worker, ProblemDisconnected)
		s.cfg.Logger.Info().Err(err).Str("worker", s.cfg.Worker).Msg("kv events: connection lost")
		if errors.Is(err, ErrOversized) {
			s.cfg.Observer.Problem(s.cfg.Worker, ProblemOversized)
		}
		s.lost(ctx, false)
		backoff = s.cfg.MinBackoff
		if !sleep(ctx, backoff) {
			return ctx.Err()
		}
	}
}

// serve reads one connection until it fails or ctx ends.
func (s *sub) serve(ctx context.Context, zc *zmq4.Conn, raw net.Conn) error {
	msgs := make(chan message, s.cfg.QueueLen)
	dropped := make(chan struct{}, 1) // the reader dropped a message
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer close(msgs)
		for {
			m, err := zc.RecvMsg()
			if err != nil {
				select {
				case msgs <- message{err: err}:
				case <-done:
				}
				return
			}
			if m.Type == zmq4.CmdMsg {
				continue // a PING answered by RecvMsg
			}
			select {
			case msgs <- message{frames: m.Frames}:
			default:
				s.cfg.Observer.Problem(s.cfg.Worker, ProblemQueueFull)
				select {
				case dropped <- struct{}{}:
				default:
				}
			}
		}
	}()
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()
	s.catchUpMissed(ctx)
	s.flush(ctx)
	// lostSome: the reader dropped a message since the queue was last
	// empty. The batches queued may all be older than it, so only an empty
	// queue proves none will show the gap.
	lostSome := false
	for {
		if lostSome && len(msgs) == 0 {
			lostSome = false
			s.catchUpMissed(ctx)
			s.flush(ctx)
		}
		var m message
		ok := true
		select {
		case m, ok = <-msgs:
		case <-dropped:
			lostSome = true
			continue
		}
		if !ok {
			return errors.New("kvsub: reader stopped")
		}
		if m.err != nil {
			for range msgs { // let the reader finish
			}
			return m.err
		}
		s.handle(ctx, m.frames)
		// Coalesce what is queued already into one update.
		for more := true; more && len(s.pendingBatches()) < s.cfg.MaxCoalesce; {
			select {
			case m, ok := <-msgs:
				if !ok || m.err != nil {
					s.flush(ctx)
					if ok {
						for range msgs {
						}
						return m.err
					}
					return errors.New("kvsub: reader stopped")
				}
				s.handle(ctx, m.frames)
			default:
				more = false
			}
		}
		s.flush(ctx)
	}
}

// handle handles one live message.
func (s *sub) handle(ctx context.Context, frames [][]byte) {
	seq, payload, err := kvevents.ParseMessage(frames, s.cfg.Topic)
	if err != nil {
		// Not a batch of this stream: whatever it was, a batch may be lost.
		s.cfg.Observer.Problem(s.cfg.Worker, ProblemMalformed)
		s.cfg.Logger.Warn().Err(err).Str("worker", s.cfg.Worker).Msg("kv events: a message that is not a batch")
		s.clear(kvindex.Stale)
		return
	}
	if s.dedupe {
		if last, ok := s.tr.Last(); ok && seq <= last {
			return // the catch-up gave it already
		}
		s.dedupe = false
	}
	last, _ := s.tr.Last()
	switch v := s.tr.Next(seq); v {
	case First, InOrder:
		if v == First && seq == 0 {
			s.begin()
		}
		s.apply(payload, false, kvindex.Exact)
	case Restart:
		s.cfg.Observer.Problem(s.cfg.Worker, ProblemRestart)
		s.cfg.Logger.Info().Str("worker", s.cfg.Worker).Uint64("last", last).Msg("kv events: the engine restarted")
		s.restart(kvindex.Exact)
		s.apply(payload, false, kvindex.Exact)
	case Backwards:
		s.cfg.Observer.Problem(s.cfg.Worker, ProblemBackwards)
		s.cfg.Logger.Warn().Str("worker", s.cfg.Worker).Uint64("last", last).Uint64("seq", seq).Msg("kv events: sequence went backwards")
		s.clear(kvindex.Stale)
		s.apply(payload, false, kvindex.Stale) // stale until the next batch
	case Gap:
		missing := seq - last - 1
		s.tr.last = last // catch up from the last applied batch
		recovered := s.cfg.Replay != "" && s.catchUp(ctx, seq, true)
		s.cfg.Observer.Gap(s.cfg.Worker, missing, recovered)
		if !recovered {
			s.cfg.Observer.Problem(s.cfg.Worker, ProblemUnrecovered)
			s.cfg.Logger.Info().Str("worker", s.cfg.Worker).Uint64("missing", missing).Msg("kv events: lost batches, view cleared")
		}
		if l, ok := s.tr.Last(); ok && seq <= l {
			return // the replay gave it (a rebuild too, in the state it left)
		}
		if recovered && s.tr.Next(seq) == InOrder {
			s.apply(payload, false, kvindex.Exact)
			return
		}
		s.tr.last, s.tr.started = seq, true
		s.clear(kvindex.Stale)
		s.apply(payload, false, kvindex.Stale) // stale until the next batch
	}
}

// apply decodes and adds one in-order batch, after which the view is in
// state st; a batch that does not decode is a loss (the view is cleared,
// stale) and apply reports false.
func (s *sub) apply(payload []byte, replayed bool, st kvindex.State) bool {
	b, ok := s.decode(payload, replayed)
	if !ok {
		s.clear(kvindex.Stale)
		return false
	}
	s.add(b, payload)
	s.setState(st)
	return true
}

// decode decodes a payload within the byte budget and the limits; a
// payload it refuses is a lost batch (the caller clears the view).
func (s *sub) decode(payload []byte, replayed bool) (kvindex.Batch, bool) {
	if !s.flood.AllowN(time.Now(), len(payload)) {
		s.cfg.Observer.Problem(s.cfg.Worker, ProblemFlood)
		return kvindex.Batch{}, false
	}
	b, err := s.dec.Decode(payload)
	if err != nil {
		p := ProblemMalformed
		if errors.Is(err, kvevents.ErrTooLarge) {
			p = ProblemOversized
		}
		s.cfg.Observer.Problem(s.cfg.Worker, p)
		s.cfg.Logger.Warn().Err(err).Str("worker", s.cfg.Worker).Msg("kv events: a batch refused")
		return b, false
	}
	s.cfg.Observer.Received(s.cfg.Worker, len(b.Events), replayed)
	return b, true
}

// add appends a decoded batch to the update being built.
func (s *sub) add(b kvindex.Batch, payload []byte) {
	u := s.update()
	u.Batches = append(u.Batches, b)
	s.digest = xxhash.Sum64(payload)
}

func (s *sub) update() *Update {
	if s.cur == nil {
		s.cur = &Update{Worker: s.cfg.Worker, State: s.state}
	}
	return s.cur
}

func (s *sub) pendingBatches() []kvindex.Batch {
	if s.cur == nil {
		return nil
	}
	return s.cur.Batches
}

// clear empties the view (what was built before it is moot) and sets st.
func (s *sub) clear(st kvindex.State) { s.empty(st, false) }

// restart empties the view as clear does, where the engine's cache is
// known empty: the batches that follow are all it holds.
func (s *sub) restart(st kvindex.State) { s.empty(st, true) }

func (s *sub) empty(st kvindex.State, restarted bool) {
	u := s.update()
	u.Clear, u.Restarted, u.Batches = true, restarted, nil
	s.digest = 0
	s.setState(st)
}

// begin notes that the view starts at the engine's first batch (a first
// view, or one cleared when it stopped following): the engine's cache was
// empty before it.
func (s *sub) begin() {
	u := s.update()
	u.Restarted, u.Batches = true, nil
}

func (s *sub) setState(st kvindex.State) {
	s.state = st
	s.update().State = st
}

// lost notes that the view cannot follow the engine now (no connection):
// stale, not cleared (a catch-up may prove nothing was lost), unless
// clear.
func (s *sub) lost(ctx context.Context, clear bool) {
	if s.state == kvindex.Exact || clear {
		if clear {
			s.clear(kvindex.Stale)
		} else {
			s.setState(kvindex.Stale)
		}
		s.flush(ctx)
	}
}

// flush hands the update being built to the Sink, waiting for a slot.
func (s *sub) flush(ctx context.Context) {
	u := s.cur
	if u == nil {
		return
	}
	s.cur = nil
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return
	}
	s.cfg.Sink.Send(u, func() { <-s.slots })
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// catchUp asks the replay socket for what follows the last batch applied
// (everything buffered when none was) and applies it as it comes, up to
// until when bounded; it reports whether the view followed the engine
// without a loss. The replay starts at the last batch itself, whose
// digest must match: a restarted engine numbers its batches from 0 again,
// and may have passed the last number by now. When nothing proves the
// engine is the same one with nothing lost, the view starts again from
// whatever the replay buffer holds: exact if that is the engine's whole
// history (from batch 0), else stale until the next batch.
func (s *sub) catchUp(ctx context.Context, until uint64, bounded bool) bool {
	last, started := s.tr.Last()
	if !started {
		s.rebuild(ctx, false)
		return true
	}
	seen, ok, n := false, true, 0
	err := s.replay(ctx, last, until, bounded, func(seq uint64, payload []byte) bool {
		if !seen {
			seen = true
			if seq != last || s.digest == 0 || xxhash.Sum64(payload) != s.digest {
				ok = false
				return false
			}
			return true // the same engine: continue after the last batch
		}
		n++
		if !s.replayed(ctx, seq, payload, kvindex.Exact) {
			ok = false
			return false
		}
		return true
	})
	s.cfg.Observer.Replayed(s.cfg.Worker, n, err)
	if err != nil || !seen || !ok {
		if err != nil {
			s.cfg.Logger.Info().Err(err).Str("worker", s.cfg.Worker).Msg("kv events: replay failed")
		}
		s.tr.Reset()
		s.clear(kvindex.Stale)
		if err == nil {
			s.rebuild(ctx, true)
		}
		return false
	}
	s.setState(kvindex.Exact)
	s.dedupe = true
	return true
}

// catchUpMissed catches up with what was published while the view was
// not following: on a connection, everything buffered (a first one) or
// what came after the last batch applied (a reconnection); after batches
// the reader had no room for and no later batch queued to show the gap
// (an engine that then goes quiet would leave the view without them for
// good). The replay gives it back (what it cannot, it starts again
// itself); without one, nothing proves the engine is the one followed nor
// that nothing was lost, so a view that followed one starts again, stale
// until the next batch.
func (s *sub) catchUpMissed(ctx context.Context) {
	if s.cfg.Replay != "" {
		s.catchUp(ctx, 0, false)
		return
	}
	if _, ok := s.tr.Last(); ok {
		s.tr.Reset()
		s.clear(kvindex.Stale)
	}
}

// rebuild fills an empty view from the replay buffer, from its start;
// the view is exact when the buffer held the engine's whole history
// (batch 0 on), or when the view is a first one (it is all the gateway
// knows, and nothing in it is wrong); else stale until the next batch.
func (s *sub) rebuild(ctx context.Context, afterLoss bool) {
	whole, ok, n := false, true, 0
	st := kvindex.Exact
	if afterLoss {
		st = kvindex.Stale // until it proves whole
	}
	err := s.replay(ctx, 0, 0, false, func(seq uint64, payload []byte) bool {
		if n == 0 {
			whole = seq == 0
		}
		n++
		if !s.replayed(ctx, seq, payload, st) {
			ok = false
			return false
		}
		return true
	})
	s.cfg.Observer.Replayed(s.cfg.Worker, n, err)
	if err != nil || !ok {
		if _, had := s.tr.Last(); had {
			s.tr.Reset()
			s.clear(kvindex.Stale)
		}
		return
	}
	if _, had := s.tr.Last(); !had {
		return // nothing buffered: the next live batch starts the view
	}
	if afterLoss && !whole {
		s.setState(kvindex.Stale)
	} else {
		s.setState(kvindex.Exact)
	}
	s.dedupe = true
}

// replayed applies one batch of a replay in order; false when it cannot.
func (s *sub) replayed(ctx context.Context, seq uint64, payload []byte, st kvindex.State) bool {
	v := s.tr.Next(seq)
	if v != First && v != InOrder {
		return false
	}
	if v == First && seq == 0 {
		s.begin() // the replay holds the engine's whole history
	}
	if !s.apply(payload, true, st) {
		return false
	}
	if len(s.pendingBatches()) >= s.cfg.MaxCoalesce {
		s.flush(ctx)
	}
	return true
}

// MaxReplayBatches bounds the batches one replay reads.
const MaxReplayBatches = 1 << 16

// replay asks the replay socket for the batches from seq from on and
// hands each to fn until the end marker, fn returning false, (bounded)
// one past until, or MaxReplayBatches, within the replay timeout.
func (s *sub) replay(ctx context.Context, from, until uint64, bounded bool, fn func(seq uint64, payload []byte) bool) error {
	zc, raw, err := dial(ctx, s.cfg.Replay, zmq4.Dealer, s.cfg.DialTimeout, s.cfg.Bounds, s.cfg.Control)
	if err != nil {
		return err
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(s.cfg.ReplayTimeout))
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()
	if err := zc.SendMsg(zmq4.NewMsgFrom(kvevents.ReplayRequest(from)...)); err != nil {
		return fmt.Errorf("kvsub: replay request: %w", err)
	}
	for n := 0; n < MaxReplayBatches; {
		m, err := zc.RecvMsg()
		if err != nil {
			return fmt.Errorf("kvsub: replay: %w", err)
		}
		if m.Type == zmq4.CmdMsg {
			continue
		}
		seq, payload, end, err := kvevents.ParseReplay(m.Frames)
		if err != nil || end {
			return err
		}
		if seq < from {
			continue
		}
		n++
		if !fn(seq, payload) || bounded && seq >= until {
			return nil
		}
	}
	return nil
}
