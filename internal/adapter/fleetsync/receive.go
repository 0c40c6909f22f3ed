package fleetsync

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
)

// onEvents takes a peer's batch: bounded, decoded, checked against the
// subject it came on, then put in the inbox the router takes from.
func (c *Client) onEvents(msg *nats.Msg) {
	from, ok := subjectToken(msg.Subject, c.subject(subjectEvents))
	if !ok {
		c.m.Dropped(metrics.SyncBatch, metrics.SyncDropMalformed, 1)
		return
	}
	b, reason := c.accept(from, msg.Data)
	if reason == "" && !c.inbox.put(b) {
		reason = metrics.SyncDropBacklog
	}
	if reason != "" {
		c.m.Dropped(metrics.SyncBatch, reason, 1)
		if reason == metrics.SyncDropSpoofed {
			c.warnSpoofed(from, b.Replica)
		}
		return
	}
	c.m.Received(metrics.SyncBatch, 1)
	c.m.ReceivedBytes(len(msg.Data))
	if c.inbox.arm() {
		c.o.Root.Send(c.router, &router.SyncInbox{Take: c.inbox.take})
	}
}

// accept decodes data, published on the events subject of replica from,
// and checks it; reason says why it is dropped (b is set when it
// decoded).
func (c *Client) accept(from string, data []byte) (b *router.PeerBatch, reason string) {
	if len(data) > c.cfg.MaxMessageBytes {
		return nil, metrics.SyncDropOversized
	}
	if from == c.ID() {
		c.warnDuplicateID()
		return nil, metrics.SyncDropDuplicateID
	}
	b, err := DecodeBatch(data)
	switch {
	case err != nil:
		return nil, metrics.SyncDropMalformed
	case b.Replica != from:
		return b, metrics.SyncDropSpoofed
	}
	if age := time.Since(b.Sent); age > c.cfg.StaleAfter.Duration || -age > c.cfg.StaleAfter.Duration {
		return b, metrics.SyncDropStale
	}
	if !c.allow(from) {
		return b, metrics.SyncDropRate
	}
	return b, ""
}

// warnDuplicateID logs, at most once a minute, that another process
// publishes under this replica's id: the connection asks NATS for no
// echoes, so the message is not this replica's own. The two replicas then
// ignore each other's picks, load and ejections.
func (c *Client) warnDuplicateID() {
	if !c.dupWarn.allow() {
		return
	}
	c.log.Warn().Str("replica", c.ID()).Msg("fleet sync: another process publishes under this replica's id; " +
		"give every replica its own [gateway.sync] replica_id (and its own NATS user), or the two ignore each other's picks, load and ejections")
}

// warnSpoofed logs, at most once a minute, a batch that names another
// replica than the one whose subject it came on.
func (c *Client) warnSpoofed(from, claimed string) {
	if !c.spoofWarn.allow() {
		return
	}
	c.log.Warn().Str("subject_replica", from).Str("claimed_replica", claimed).Msg("fleet sync: a batch names another replica than its subject's; dropped " +
		"(give each replica a NATS user that may publish only on its own subjects: docs/DEPLOYMENT.md)")
}

// allow takes one message of replica from its rate limit. Limits are kept
// for at most 2 × max_peers replicas; beyond, the map starts afresh (a
// flood of invented ids costs the router's own max_peers bound, no more).
func (c *Client) allow(replica string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.limits[replica]
	if l == nil {
		if len(c.limits) >= 2*c.cfg.MaxPeers {
			clear(c.limits)
		}
		l = rate.NewLimiter(rate.Limit(c.cfg.PeerRate), max(1, int(c.cfg.PeerRate)))
		c.limits[replica] = l
	}
	return l.Allow()
}

// maxInboxEvents bounds the events waiting in the inbox for the router;
// a batch beyond is dropped (SyncDropBacklog).
const maxInboxEvents = 4 * MaxEvents

// inbox holds the peers' batches until the router takes them, coalesced
// per peer: a peer's batches that arrive while the router is busy reach it
// as one, in one message, so they take one turn of its mailbox rather
// than one each beside the local picks.
type inbox struct {
	mu      sync.Mutex
	batches []router.PeerBatch
	last    map[string]int // a peer's batch in batches that more may join
	events  int
	armed   bool // a SyncInbox is on its way to the router
}

// put adds b (its events, to the peer's batch waiting when the chunking
// is the same); false: the inbox is full, and b is dropped.
func (q *inbox) put(b *router.PeerBatch) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.events+len(b.Events) > maxInboxEvents {
		return false
	}
	q.events += len(b.Events)
	if i, ok := q.last[b.Replica]; ok && q.batches[i].ChunkBytes == b.ChunkBytes {
		w := &q.batches[i]
		w.Events = append(w.Events, b.Events...)
		if b.Sent.Before(w.Sent) {
			w.Sent = b.Sent // the lag is the oldest's
		}
		return true
	}
	if q.last == nil {
		q.last = map[string]int{}
	}
	q.last[b.Replica] = len(q.batches)
	q.batches = append(q.batches, *b)
	return true
}

// arm reports whether the router must be told that batches wait: none is
// on its way yet.
func (q *inbox) arm() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.armed || len(q.batches) == 0 {
		return false
	}
	q.armed = true
	return true
}

// take returns the batches waiting and empties the inbox (the router's
// SyncInbox.Take).
func (q *inbox) take() []router.PeerBatch {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.batches
	q.batches, q.events, q.armed = nil, 0, false
	clear(q.last)
	return out
}

// throttle allows one thing at most once a minute.
type throttle struct {
	mu   sync.Mutex
	last time.Time
}

func (t *throttle) allow() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if !t.last.IsZero() && now.Sub(t.last) < time.Minute {
		return false
	}
	t.last = now
	return true
}
