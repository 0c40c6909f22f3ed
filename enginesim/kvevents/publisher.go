package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"
)

// DefaultBufferSteps is the number of batches kept for replay, vLLM's
// buffer_steps default.
const DefaultBufferSteps = 10_000

// pubHWM is the PUB socket's high-water mark, vLLM's hwm default.
const pubHWM = 100_000

// endSeq is the replay's end marker: the sequence -1.
var endSeq = func() []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], ^uint64(0))
	return b[:]
}()

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("kvevents: invalid config")

// Config configures a Publisher.
type Config struct {
	// Endpoint is the PUB socket's address, "tcp://host:port"; port 0
	// takes a free port (Addr says which). The publisher binds it, so
	// subscribers connect to the engine, unless Connect is set.
	Endpoint string
	// Connect dials Endpoint (a subscriber that binds) instead of binding
	// it. vLLM picks between the two by the address: it binds one with a
	// wildcard host (tcp://*:5557) and connects to any other.
	Connect bool
	// ReplayEndpoint, if set, is the ROUTER socket's address (always
	// bound): a request carrying an 8-byte big-endian start sequence is
	// answered with every buffered batch from it, then the end marker.
	ReplayEndpoint string
	// Topic is the first frame of every message ("" by default, as vLLM).
	Topic string
	// Encoder chooses the event encoding and the hash format.
	Encoder Encoder
	// BufferSteps is the number of batches kept for replay (default
	// DefaultBufferSteps).
	BufferSteps int
	// DataParallelRank is the batch's data_parallel_rank.
	DataParallelRank int
	// Logger receives the publisher's logs.
	Logger zerolog.Logger
}

// Faults are the failures a publisher injects.
type Faults struct {
	// Drop numbers batches and keeps them for replay but does not send
	// them: subscribers see a gap that replay can fill.
	Drop bool
	// Delay sends every batch that much later than it was published
	// (order is kept).
	Delay time.Duration
	// RefuseReplay answers every replay request with the end marker
	// alone, as if nothing were buffered.
	RefuseReplay bool
}

// Stats are a publisher's counters.
type Stats struct {
	// Published counts batches numbered; Sent those sent on the PUB
	// socket; Dropped those withheld by the Drop fault.
	Published, Sent, Dropped uint64
	// Replays counts replay requests answered; Refused those answered
	// with the end marker alone by the RefuseReplay fault.
	Replays, Refused uint64
	// NextSeq is the sequence the next batch gets.
	NextSeq int64
	// Queued counts batches published and not yet numbered and sent.
	Queued int
}

// Publisher sends KV event batches over ZMQ. Publish never blocks: batches
// queue in memory, in order, and a goroutine numbers and sends them.
type Publisher struct {
	cfg    Config
	log    zerolog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	pub    zmq4.Socket
	replay zmq4.Socket
	sender sync.WaitGroup
	server sync.WaitGroup

	mu    sync.Mutex
	wake  chan struct{} // signalled when queue grows or faults change
	queue []queued
	// numbering is set while the sender holds a batch taken off the queue
	// and not yet numbered, so Stats never shows it as neither.
	numbering bool
	closed    bool
	faults    Faults

	// Owned by the sending goroutine, read by replay under bufMu.
	bufMu sync.Mutex
	buf   []entry // ring of the last BufferSteps batches, oldest at head
	head  int
	seq   int64
	stats Stats
}

// queued is a published batch waiting to be sent, or a sequence restart.
type queued struct {
	ts      time.Time
	events  []Event
	restart bool
}

type entry struct {
	seq     int64
	payload []byte
}

// Start opens the sockets and starts sending.
func Start(cfg Config) (*Publisher, error) {
	if cfg.BufferSteps == 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	if cfg.BufferSteps < 0 {
		return nil, fmt.Errorf("%w: buffer steps %d < 0", ErrConfig, cfg.BufferSteps)
	}
	for _, ep := range []string{cfg.Endpoint, cfg.ReplayEndpoint} {
		if ep != "" && !strings.HasPrefix(ep, "tcp://") {
			return nil, fmt.Errorf("%w: endpoint %q is not tcp://host:port", ErrConfig, ep)
		}
	}
	if cfg.Endpoint == "" {
		return nil, fmt.Errorf("%w: endpoint is required", ErrConfig)
	}
	p := &Publisher{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1)}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	zlog := log.New(zmqLogWriter{p.log}, "", 0)
	p.pub = zmq4.NewPub(p.ctx, zmq4.WithLogger(zlog))
	// vLLM's hwm: past it, batches are dropped rather than queued without
	// bound behind a stuck subscriber.
	if err := p.pub.SetOption(zmq4.OptionHWM, pubHWM); err != nil {
		p.pub.Close()
		p.cancel()
		return nil, fmt.Errorf("kvevents: PUB high-water mark: %w", err)
	}
	var err error
	if cfg.Connect {
		err = p.pub.Dial(cfg.Endpoint)
	} else {
		err = p.pub.Listen(cfg.Endpoint)
	}
	if err != nil {
		p.pub.Close()
		p.cancel()
		return nil, fmt.Errorf("kvevents: PUB %s: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint != "" {
		p.replay = zmq4.NewRouter(p.ctx, zmq4.WithLogger(zlog))
		if err := p.replay.Listen(cfg.ReplayEndpoint); err != nil {
			p.replay.Close()
			p.pub.Close()
			p.cancel()
			return nil, fmt.Errorf("kvevents: replay ROUTER %s: %w", cfg.ReplayEndpoint, err)
		}
		p.server.Go(p.serveReplay)
	}
	p.sender.Go(p.send)
	return p, nil
}

// Addr returns the PUB endpoint, with the port taken when binding port 0.
func (p *Publisher) Addr() string {
	if p.cfg.Connect {
		return p.cfg.Endpoint
	}
	return "tcp://" + p.pub.Addr().String()
}

// ReplayAddr returns the replay endpoint ("" without one).
func (p *Publisher) ReplayAddr() string {
	if p.replay == nil {
		return ""
	}
	return "tcp://" + p.replay.Addr().String()
}

// Subscribed reports whether a subscriber has subscribed to topic (or
// to a prefix of it) on the PUB socket: batches sent before that are lost
// to it, as on any PUB socket.
func (p *Publisher) Subscribed(topic string) bool {
	ts, ok := p.pub.(zmq4.Topics)
	if !ok {
		return false
	}
	for _, t := range ts.Topics() {
		if strings.HasPrefix(topic, t) {
			return true
		}
	}
	return false
}

// Topic returns the topic frame.
func (p *Publisher) Topic() string { return p.cfg.Topic }

// Publish queues one batch of events, stamped now; empty batches are not
// sent (vLLM publishes a step's batch only when it has events).
func (p *Publisher) Publish(events []Event) {
	if len(events) == 0 {
		return
	}
	p.enqueue(queued{ts: time.Now(), events: events})
}

// RestartSequence numbers the next batch 0 again and empties the replay
// buffer, as a restarted engine's publisher does. Batches published before
// it keep their old numbering.
func (p *Publisher) RestartSequence() { p.enqueue(queued{restart: true}) }

func (p *Publisher) enqueue(q queued) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.queue = append(p.queue, q)
	p.mu.Unlock()
	p.signal()
}

func (p *Publisher) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// SetFaults replaces the injected faults.
func (p *Publisher) SetFaults(f Faults) {
	p.mu.Lock()
	p.faults = f
	p.mu.Unlock()
	p.signal()
}

// Faults returns the injected faults.
func (p *Publisher) Faults() Faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	queued := len(p.queue)
	if p.numbering {
		queued++
	}
	p.bufMu.Lock()
	defer p.bufMu.Unlock()
	s := p.stats
	s.NextSeq, s.Queued = p.seq, queued
	return s
}

// Close sends what is queued (not waiting out a Delay fault) and closes
// the sockets.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.signal()
	p.sender.Wait()
	p.cancel()
	err := closeSocket(p.pub)
	if p.replay != nil {
		err = errors.Join(err, closeSocket(p.replay))
	}
	p.server.Wait()
	return err
}

// closeSocket closes s; a connection its peer closed first is no error
// (zmq4 reports closing it again).
func closeSocket(s zmq4.Socket) error {
	if err := s.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("kvevents: close: %w", err)
	}
	return nil
}

// send numbers, encodes and sends queued batches in order.
func (p *Publisher) send() {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		p.mu.Lock()
		if len(p.queue) == 0 {
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			<-p.wake
			continue
		}
		q, f, closed := p.queue[0], p.faults, p.closed
		if !q.restart && !closed {
			if wait := time.Until(q.ts.Add(f.Delay)); wait > 0 {
				p.mu.Unlock()
				if timer == nil {
					timer = time.NewTimer(wait)
				} else {
					timer.Reset(wait)
				}
				select {
				case <-timer.C:
				case <-p.wake:
					timer.Stop()
				}
				continue
			}
		}
		p.queue[0] = queued{}
		p.queue = p.queue[1:]
		p.numbering = true
		p.mu.Unlock()
		if q.restart {
			p.restart()
		} else {
			p.sendBatch(q, f.Drop)
		}
	}
}

// numbered ends the numbering of the batch taken off the queue.
func (p *Publisher) numbered() {
	p.mu.Lock()
	p.numbering = false
	p.mu.Unlock()
}

func (p *Publisher) restart() {
	p.bufMu.Lock()
	p.seq = 0
	p.buf, p.head = p.buf[:0], 0
	p.bufMu.Unlock()
	p.numbered()
	p.log.Info().Msg("KV event sequence restarted")
}

func (p *Publisher) sendBatch(q queued, drop bool) {
	payload, err := p.cfg.Encoder.EncodeBatch(q.ts, q.events, p.cfg.DataParallelRank)
	if err != nil {
		p.numbered()
		p.log.Error().Err(err).Msg("KV event batch not encodable; skipped")
		return
	}
	p.bufMu.Lock()
	seq := p.seq
	p.seq++
	p.keep(entry{seq: seq, payload: payload})
	p.stats.Published++
	if drop {
		p.stats.Dropped++
	}
	p.bufMu.Unlock()
	p.numbered()
	if drop {
		return
	}
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], uint64(seq))
	if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqb[:], payload)); err != nil {
		if p.ctx.Err() == nil {
			p.log.Warn().Err(err).Int64("seq", seq).Msg("KV event batch not sent")
		}
		return
	}
	p.bufMu.Lock()
	p.stats.Sent++
	p.bufMu.Unlock()
}

// keep appends e to the replay ring; bufMu is held.
func (p *Publisher) keep(e entry) {
	if len(p.buf) < p.cfg.BufferSteps {
		p.buf = append(p.buf, e)
		return
	}
	p.buf[p.head] = e
	p.head = (p.head + 1) % len(p.buf)
}

// since returns the buffered batches with a sequence of at least start,
// oldest first.
func (p *Publisher) since(start uint64) []entry {
	p.bufMu.Lock()
	defer p.bufMu.Unlock()
	var out []entry
	for i := range p.buf {
		e := p.buf[(p.head+i)%len(p.buf)]
		if uint64(e.seq) >= start {
			out = append(out, e)
		}
	}
	return out
}

// serveReplay answers replay requests until the socket closes.
func (p *Publisher) serveReplay() {
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			if p.ctx.Err() == nil {
				p.log.Warn().Err(err).Msg("KV event replay socket failed")
			}
			return
		}
		start, ok := ParseReplayRequest(msg.Frames)
		if !ok {
			p.log.Warn().Int("frames", len(msg.Frames)).Msg("invalid KV event replay request ignored")
			continue
		}
		id := msg.Frames[0]
		refused := p.Faults().RefuseReplay
		var batches []entry
		if !refused {
			batches = p.since(start)
		}
		p.bufMu.Lock()
		p.stats.Replays++
		if refused {
			p.stats.Refused++
		}
		p.bufMu.Unlock()
		for _, e := range batches {
			var seqb [8]byte
			binary.BigEndian.PutUint64(seqb[:], uint64(e.seq))
			if err := p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, seqb[:], e.payload)); err != nil {
				break
			}
		}
		p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, endSeq, nil))
	}
}

// ParseReplayRequest reads a replay request as the ROUTER socket receives
// it, [identity, empty delimiter, 8-byte big-endian start sequence] (vLLM
// accepts exactly these three frames), and returns the start sequence.
func ParseReplayRequest(frames [][]byte) (start uint64, ok bool) {
	if len(frames) != 3 || len(frames[1]) != 0 || len(frames[2]) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(frames[2]), true
}

// zmqLogWriter sends zmq4's own logs to zerolog at debug level.
type zmqLogWriter struct{ log zerolog.Logger }

func (w zmqLogWriter) Write(b []byte) (int, error) {
	w.log.Debug().Str("source", "zmq4").Msg(strings.TrimSpace(string(b)))
	return len(b), nil
}
