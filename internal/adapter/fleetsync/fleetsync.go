// Package fleetsync shares the router's view between gateway replicas over
// NATS: each replica publishes its routing decisions, releases, ejections,
// in-flight counts and the workers of the Responses API responses it
// relays (stored and deleted) in small batches on its own subject
// <prefix>.events.<replica>, applies its peers' through the router actor
// (router.SyncInbox, coalesced per peer), answers and asks warm-start
// snapshots (subjects.go), and answers and asks the traffic rings behind
// the console's view of the fleet (traffic.go).
//
// A batch counts only as the replica whose subject it came on: with one
// NATS user per replica, allowed to publish only on its own subjects
// (Permissions), no one can speak for a replica without its credentials.
//
// Routing never waits on NATS: the router hands events to a Client
// (router.Syncer) without blocking, a bounded queue drops what does not
// fit, and a batcher goroutine publishes. What arrives is bounded before the
// router sees it: its size, its age, one peer's rate, and the decoding
// (codec.go) bounds every count; the router bounds what the events may do.
// A replica ignores its own messages. With NATS away a replica routes on
// its own view and reconnects by itself, asking a peer for a snapshot when
// it is back; then it sends again the stored and deleted responses it
// could not announce, and asks each peer once more for its stored ones.
package fleetsync

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
	"github.com/tlgate/tlgate/internal/adapter/traffic"
)

// Options are what a Client needs besides the configuration.
type Options struct {
	Root    *actor.RootContext
	Logger  zerolog.Logger
	Metrics *metrics.SyncMetrics
	// ChunkBytes is the router's prefix-index chunk size (sent with the
	// hashes, so a peer with another chunking ignores them).
	ChunkBytes int
	// Stored is the record of stored responses whose own entries this
	// replica tells a peer that asks (nil: none).
	Stored OwnRecords
	// Keys, when set, splits the API keys' limits between the replicas
	// (keys.go): this replica's demand per key goes to the peers every
	// load_interval, theirs to Keys.
	Keys KeyShares
	// Traffic, when set, is this replica's traffic rings, which it answers
	// the other replicas' Traffic requests with (traffic.go).
	Traffic func() traffic.Raw
}

// OwnRecords are the stored responses a replica relayed itself
// (*sticky.Map).
type OwnRecords interface {
	// ExportOwn calls fn for at most limit live entries as of now, newest
	// first: the id's digest, the owner's tag, the worker, the time left.
	ExportOwn(limit int, now time.Time, fn func(digest, owner, worker string, ttl time.Duration))
}

// Client is one replica's fleet sync: the router's Syncer, and the NATS
// connection with its batcher and subscriptions.
type Client struct {
	cfg     config.Sync
	o       Options
	m       *metrics.SyncMetrics
	log     zerolog.Logger
	queue   chan router.PeerEvent
	maxHash int

	router *actor.PID // set by Start

	mu      sync.Mutex
	id      string
	nc      *nats.Conn
	subs    []*nats.Subscription
	limits  map[string]*rate.Limiter
	ctx     context.Context // cancelled by Close
	cancel  context.CancelFunc
	done    chan struct{}
	started bool
	// warm counts the warm starts running (Close waits for them);
	// warming: one is.
	warm    sync.WaitGroup
	warming atomic.Bool
	// dropped is the slow-consumer drops counted so far, of every
	// subscription (NATS keeps each one's total).
	dropped int
	// snapWait takes the snapshot a warm start waits for (nil: none
	// waits).
	snapWait chan peerSnapshot
	// recordsAsked are the replicas asked for their stored responses and
	// not answered yet: one answer each is taken (onRecords), none
	// unasked.
	recordsAsked map[string]bool
	// unsent are the stored and deleted responses this replica could not
	// tell its peers (the connection was down, or the queue full): sent
	// again once it is back (resend), at most maxUnsent, the newest kept.
	unsent []unsentEvent
	// reask, after a reconnection (nil before one), are the replicas
	// asked again for their stored responses since: the connection may
	// have missed their announcements, which no later message repeats.
	reask map[string]bool

	inbox      inbox
	serveLimit *rate.Limiter // snapshots answered
	// Traffic requests (traffic.go): those answered, this replica's own
	// waiting for answers, and the replicas the router tracks (Tick).
	trafficLimit *rate.Limiter
	trafficNonce uint64
	trafficWaits map[uint64]*trafficWaiter
	peers        atomic.Int64
	// Warnings logged at most once a minute.
	dupWarn, spoofWarn, peersWarn throttle
}

// New returns a Client for cfg, not yet connected: the router may be given
// it at once (events wait in the queue until Start).
func New(cfg config.Sync, o Options) *Client {
	c := &Client{
		cfg: cfg, o: o, m: o.Metrics, log: o.Logger,
		queue:        make(chan router.PeerEvent, cfg.MaxQueue),
		maxHash:      min(MaxHashes, max(1, (cfg.MaxBatchBytes-1024)/8)),
		limits:       map[string]*rate.Limiter{},
		recordsAsked: map[string]bool{},
		// Each peer may ask for one snapshot per peer_timeout.
		serveLimit: rate.NewLimiter(rate.Limit(float64(cfg.MaxPeers)/max(cfg.PeerTimeout.Seconds(), 1e-3)), cfg.MaxPeers),
		// Each peer's consoles may ask a few times a second.
		trafficLimit: rate.NewLimiter(rate.Limit(4*cfg.MaxPeers), 4*cfg.MaxPeers),
	}
	return c
}

// ID is the replica id the client publishes under.
func (c *Client) ID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.id
}

// enqueue queues an event without blocking; a full queue drops it.
func (c *Client) enqueue(ev router.PeerEvent) {
	select {
	case c.queue <- ev:
	default:
		c.m.Dropped(ev.Kind.String(), metrics.SyncDropQueueFull, 1)
		c.keepUnsent(&ev, time.Now())
	}
}

// reasks reports whether replica, heard from, is to be asked again for
// its stored responses: the first time since this replica reconnected
// (at most MaxPeers replicas).
func (c *Client) reasks(replica string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reask == nil || c.reask[replica] || len(c.reask) >= c.cfg.MaxPeers {
		return false
	}
	c.reask[replica] = true
	return true
}

// maxUnsent bounds the stored and deleted responses kept to be sent again.
const maxUnsent = 1024

// unsentEvent is a stored or deleted response not told to the peers, and
// when it was first to be.
type unsentEvent struct {
	ev router.PeerEvent
	at time.Time
}

// keepUnsent keeps ev, an event that did not reach the peers, to be sent
// again when it says what no other message will: a response stored or
// deleted (the peers would answer 404 for the one, or route to the other,
// until its TTL). Load, picks and the like are sent anew all the time.
func (c *Client) keepUnsent(ev *router.PeerEvent, now time.Time) {
	if ev.Kind != router.PeerStored && ev.Kind != router.PeerForget {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.unsent) >= maxUnsent {
		c.unsent = slices.Delete(c.unsent, 0, 1)
	}
	c.unsent = append(c.unsent, unsentEvent{ev: *ev, at: now})
}

// resend queues again the stored and deleted responses the peers were not
// told of, in their order, a stored one's TTL less the time it waited.
func (c *Client) resend(now time.Time) {
	c.mu.Lock()
	un := c.unsent
	c.unsent = nil
	c.mu.Unlock()
	for _, u := range un {
		ev := u.ev
		if ev.Kind == router.PeerStored {
			if ev.For -= now.Sub(u.at); ev.For <= 0 {
				continue
			}
		}
		c.enqueue(ev)
	}
}

// Picked implements router.Syncer.
func (c *Client) Picked(model, worker string) {
	c.enqueue(router.PeerEvent{Kind: router.PeerPick, Model: model, Worker: worker})
}

// Indexed implements router.Syncer.
func (c *Client) Indexed(model, worker string, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	hs := append([]uint64(nil), hashes[:min(len(hashes), c.maxHash)]...)
	c.enqueue(router.PeerEvent{Kind: router.PeerIndex, Model: model, Worker: worker, Hashes: hs})
}

// Speculated implements router.SpeculationSyncer.
func (c *Client) Speculated(worker string, keys []uint64) {
	if len(keys) == 0 {
		return
	}
	ks := append([]uint64(nil), keys[:min(len(keys), c.maxHash)]...)
	c.enqueue(router.PeerEvent{Kind: router.PeerSpeculate, Worker: worker, Hashes: ks})
}

// Released implements router.Syncer.
func (c *Client) Released(worker string) {
	c.enqueue(router.PeerEvent{Kind: router.PeerRelease, Worker: worker})
}

// Ejected implements router.Syncer.
func (c *Client) Ejected(worker, model, reason string, until time.Time) {
	c.enqueue(router.PeerEvent{Kind: router.PeerEject, Worker: worker, Model: model, Reason: reason, For: time.Until(until)})
}

// Lifted implements router.Syncer.
func (c *Client) Lifted(worker string) {
	c.enqueue(router.PeerEvent{Kind: router.PeerLift, Worker: worker})
}

// Stored tells the peers that worker stores the Responses API response
// whose id's digest is digest, owned by owner (sticky.OwnerTag), for ttl
// from now.
func (c *Client) Stored(digest, owner, worker string, ttl time.Duration) {
	c.enqueue(router.PeerEvent{Kind: router.PeerStored, ID: digest, Owner: owner, Worker: worker, For: ttl})
}

// Forgot tells the peers that the response whose id's digest is digest
// was deleted.
func (c *Client) Forgot(digest string) {
	c.enqueue(router.PeerEvent{Kind: router.PeerForget, ID: digest})
}

// Load tells the peers this replica's in-flight count per worker.
func (c *Client) Load(own []router.WorkerLoad) {
	c.enqueue(router.PeerEvent{Kind: router.PeerLoad, Loads: own})
}

// Tick implements router.Syncer: the replica's load goes to the peers,
// the peers tracked and their uncorroborated claims to the metrics.
func (c *Client) Tick(r router.TickReport) {
	c.Load(r.Own)
	c.m.Peers(r.Peers)
	c.m.Uncorroborated(r.Uncorroborated)
	c.peers.Store(int64(r.Peers))
}

// Applied implements router.Syncer: it counts what a peer's batch did,
// and logs (at most once a minute) a replica refused at max_peers.
func (c *Client) Applied(r router.PeerApplied) {
	if !r.Sent.IsZero() {
		c.m.Lag(time.Since(r.Sent))
	}
	for k, n := range r.Applied {
		c.m.Received(k.String(), n)
	}
	for d, n := range r.Dropped {
		c.m.Dropped(d.Kind.String(), d.Reason, n)
	}
	if r.Joined || c.reasks(r.Replica) {
		c.askRecords(r.Replica)
	}
	if r.Refused && c.peersWarn.allow() {
		c.log.Warn().Str("peer", r.Replica).Int("max_peers", c.cfg.MaxPeers).Msg("fleet sync: max_peers replicas are tracked; " +
			"this one's messages are dropped until one falls silent (list the fleet's replica ids in [gateway.sync] peers, or raise max_peers)")
	}
}

func (c *Client) subject(s string) string { return c.cfg.SubjectPrefix + "." + s }

// Start connects to NATS as replica id, feeding the router actor pid,
// and starts the batcher, the subscriptions and the load ticker. When
// NATS is reachable, Start returns once the server holds the
// subscriptions. NATS need not be reachable: the client keeps trying in the background, and
// the gateway serves meanwhile. It fails only on a configuration that
// cannot be used (TLS files, credentials).
func (c *Client) Start(id string, pid *actor.PID) error {
	opts, err := c.natsOptions(id)
	if err != nil {
		return err
	}
	c.router = pid
	c.mu.Lock()
	c.id = id
	c.mu.Unlock()
	c.m.Up(false)
	ctx, cancel := context.WithCancel(context.Background())
	c.mu.Lock()
	c.ctx, c.cancel = ctx, cancel
	c.mu.Unlock()
	nc, err := nats.Connect(strings.Join(c.cfg.URL, ","), opts...)
	if err != nil {
		cancel()
		return fmt.Errorf("fleetsync: connect: %w", err)
	}
	var subs []*nats.Subscription
	for _, sub := range []struct {
		subject, queue string
		handler        nats.MsgHandler
	}{
		{c.subject(subjectEvents + ".*"), "", c.onEvents},
		{c.subject(subjectSnapshot), snapshotQueue, c.onSnapshotRequest},
		{c.subject(subjectStored + "." + id), "", c.onRecordsRequest},
		{c.subject(subjectSnapshots + ".*." + id), "", c.onSnapshot},
		{c.subject(subjectKeys + ".*"), "", c.onKeys},
		{c.subject(subjectTraffic), "", c.onTrafficRequest},
		{c.subject(subjectTraffics + ".*." + id), "", c.onTraffic},
	} {
		if sub.subject == c.subject(subjectKeys+".*") && c.o.Keys == nil {
			continue
		}
		s, err := nc.QueueSubscribe(sub.subject, sub.queue, sub.handler)
		if err != nil {
			cancel()
			nc.Close()
			return fmt.Errorf("fleetsync: subscribe %s: %w", sub.subject, err)
		}
		// Bounded client-side buffers: a replica that cannot keep up drops
		// (slow consumer, counted), never grows without bound.
		if err := s.SetPendingLimits(pendingMessages, 4*c.cfg.MaxMessageBytes); err != nil {
			cancel()
			nc.Close()
			return fmt.Errorf("fleetsync: subscribe %s: %w", sub.subject, err)
		}
		subs = append(subs, s)
	}
	c.mu.Lock()
	c.nc, c.subs, c.done, c.started = nc, subs, make(chan struct{}), true
	c.mu.Unlock()
	go c.run(ctx)
	if nc.IsConnected() {
		// The subscriptions go out on the connection's writer; a round
		// trip makes the server hold them before Start returns, so no
		// peer's message sent after that is missed. A slow server only
		// delays them: the client serves on either way.
		if err := nc.FlushTimeout(c.cfg.ConnectTimeout.Duration); err != nil {
			c.log.Warn().Err(err).Msg("fleet sync: NATS did not confirm the subscriptions in connect_timeout; they take effect when it does")
		}
		c.m.Up(true)
		c.goWarm() // or the connect handler's, whichever runs first
	}
	c.log.Info().Str("replica", id).Strs("url", c.cfg.URL).Str("subject_prefix", c.cfg.SubjectPrefix).Bool("connected", nc.IsConnected()).Msg("fleet sync started")
	return nil
}

// natsOptions are the connection's options: credentials, TLS, the
// reconnection policy and the handlers that keep tlgate_sync_up.
func (c *Client) natsOptions(id string) ([]nats.Option, error) {
	cfg := c.cfg
	opts := []nats.Option{
		nats.Name("tlgate " + id),
		nats.NoEcho(), // a replica's own messages never come back
		nats.Timeout(cfg.ConnectTimeout.Duration),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(cfg.ReconnectWait.Duration),
		nats.ReconnectJitter(cfg.ReconnectWait.Duration/5, cfg.ReconnectWait.Duration/5),
		nats.ReconnectBufSize(-1), // while away, publish fails (counted): no stale replay
		nats.PingInterval(2 * time.Second),
		nats.MaxPingsOutstanding(2),
		nats.ConnectHandler(func(*nats.Conn) { c.connected("connected") }),
		nats.ReconnectHandler(func(*nats.Conn) { c.connected("reconnected") }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			c.m.Up(false)
			c.log.Warn().Err(err).Msg("fleet sync: NATS connection lost; routing on the local view")
		}),
		nats.ClosedHandler(func(*nats.Conn) { c.m.Up(false) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				c.countDrops()
				return
			}
			c.log.Warn().Err(err).Msg("fleet sync: NATS error")
		}),
	}
	tok, err := cfg.SyncToken()
	if err != nil {
		return nil, fmt.Errorf("fleetsync: %w", err)
	}
	if tok != "" {
		opts = append(opts, nats.Token(tok))
	}
	if cfg.User != "" {
		pw, err := cfg.SyncPassword()
		if err != nil {
			return nil, fmt.Errorf("fleetsync: %w", err)
		}
		opts = append(opts, nats.UserInfo(cfg.User, pw))
	}
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.CAFile != "" || cfg.CertFile != "" || hasTLSURL(cfg.URL) {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.CAFile != "" {
			pem, err := os.ReadFile(cfg.CAFile)
			if err != nil {
				return nil, fmt.Errorf("fleetsync: gateway.sync.ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("fleetsync: gateway.sync.ca_file: %s holds no PEM certificate", cfg.CAFile)
			}
			tc.RootCAs = pool
		}
		if cfg.CertFile != "" {
			pair, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("fleetsync: gateway.sync.cert_file: %w", err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

func hasTLSURL(us []string) bool {
	for _, u := range us {
		if strings.HasPrefix(u, "tls://") {
			return true
		}
	}
	return false
}

// connected runs on every (re)connection: sync is up, and a peer's
// snapshot warms the view after the outage.
func (c *Client) connected(how string) {
	c.m.Up(true)
	c.log.Info().Str("replica", c.ID()).Msg("fleet sync: NATS " + how)
	if how == "reconnected" {
		c.mu.Lock()
		c.reask = map[string]bool{}
		c.mu.Unlock()
	}
	c.resend(time.Now())
	c.goWarm()
}

// goWarm starts a warm start unless the client is closed (Close waits for
// the warm starts it let run).
func (c *Client) goWarm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started {
		return
	}
	c.warm.Add(1)
	go func() {
		defer c.warm.Done()
		c.warmStart(c.ctx)
	}()
}

// pendingMessages bounds a subscription's messages waiting to be handled.
const pendingMessages = 4096

// countDrops counts the messages the subscriptions dropped since the last
// count (NATS reports a slow consumer once per episode, and keeps each
// subscription's total): tlgate_sync_messages_dropped_total{reason=
// "slow_consumer"} counts messages, not episodes.
func (c *Client) countDrops() {
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for _, s := range c.subs {
		if n, err := s.Dropped(); err == nil {
			total += n
		}
	}
	if total > c.dropped {
		c.m.Dropped(metrics.SyncBatch, metrics.SyncDropSlowConsumer, total-c.dropped)
		c.dropped = total
	}
}

// Close stops the batcher, ends the warm starts running and closes the
// connection (publishing what is queued first, when connected).
func (c *Client) Close() {
	c.mu.Lock()
	nc, cancel, done := c.nc, c.cancel, c.done
	c.started = false
	c.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	if done != nil {
		<-done
	}
	c.warm.Wait()
	c.countDrops()
	if nc != nil {
		nc.Close()
	}
	c.m.Up(false)
}

// run is the batcher: it publishes queued events in batches at most
// BatchInterval apart, releases and load reports waiting up to
// ReleaseHold to ride with another event (pacer), each batch at most
// MaxBatchBytes, and asks the router for its load every LoadInterval.
func (c *Client) run(ctx context.Context) {
	defer close(c.done)
	load := time.NewTicker(c.cfg.LoadInterval.Duration)
	defer load.Stop()
	flush := time.NewTimer(time.Hour)
	flush.Stop()
	pace := pacer{interval: c.cfg.BatchInterval.Duration, hold: c.cfg.ReleaseHold.Duration}
	var (
		batch []router.PeerEvent
		size  int
		buf   []byte
	)
	send := func() {
		flush.Stop()
		if len(batch) == 0 {
			return
		}
		buf = c.publish(buf[:0], batch)
		pace.sent(time.Now())
		clear(batch)
		batch, size = batch[:0], 0
	}
	add := func(ev router.PeerEvent) {
		n := eventSize(&ev)
		if size+n > c.cfg.MaxBatchBytes && len(batch) > 0 {
			send()
		}
		batch = append(batch, ev)
		size += n
	}
	// gather adds the events queued already: those the router handed over
	// with the first (a pick comes with its prompt's hashes).
	gather := func() {
		for {
			select {
			case ev := <-c.queue:
				add(ev)
			default:
				return
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			gather()
			send()
			return
		case <-load.C:
			c.o.Root.Send(c.router, &router.SyncTick{})
			c.tickKeys(time.Now())
			c.countDrops()
		case <-flush.C:
			send()
		case ev := <-c.queue:
			add(ev)
			d, reset := pace.add(time.Now(), lazyEvent(ev.Kind))
			switch {
			case !reset:
			case d > 0:
				flush.Reset(d)
			default:
				gather()
				send()
			}
		}
	}
}

// lazyEvent reports whether an event of kind k may wait ReleaseHold for
// another to ride with: it only ends or restates what peers count.
func lazyEvent(k router.PeerEventKind) bool {
	return k == router.PeerRelease || k == router.PeerLoad
}

// publish encodes and publishes one batch; with NATS away its events are
// dropped and counted.
func (c *Client) publish(buf []byte, events []router.PeerEvent) []byte {
	c.mu.Lock()
	nc, id := c.nc, c.id
	c.mu.Unlock()
	b := router.PeerBatch{Replica: id, Sent: time.Now(), ChunkBytes: c.o.ChunkBytes, Events: events}
	buf = EncodeBatch(buf, &b)
	counts := map[string]int{}
	for i := range events {
		counts[events[i].Kind.String()]++
	}
	if nc == nil || !nc.IsConnected() || nc.Publish(c.subject(subjectEvents+"."+id), buf) != nil {
		for k, n := range counts {
			c.m.Dropped(k, metrics.SyncDropDisconnected, n)
		}
		c.m.Dropped(metrics.SyncBatch, metrics.SyncDropDisconnected, 1)
		now := time.Now()
		for i := range events {
			c.keepUnsent(&events[i], now)
		}
		return buf
	}
	for k, n := range counts {
		c.m.Sent(k, n)
	}
	c.m.Sent(metrics.SyncBatch, 1)
	c.m.SentBytes(len(buf))
	return buf
}
