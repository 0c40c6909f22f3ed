package fleetsync

import (
	"math"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tlgate/tlgate/internal/adapter/metrics"
)

// Fleet-wide key limits: every load_interval a replica publishes its
// demand per limited API key on P.keys.<replica> (its own subject, beside
// its events), and hands its peers' to Options.Keys, which splits each
// key's limits between the replicas (ratelimit.Limiter's fleet sharing).
// A message of its own kind on a subject of its own: a replica that does
// not share keys' limits neither subscribes nor drops it.
//
//	keys = 'K' version replica:str sent:varint(unix ns)
//	       n:uvarint (key:str per_minute_milli:uvarint)*n

// KeyDemand is one replica's demand for one API key: the requests asked
// for it per minute lately.
type KeyDemand struct {
	Key       string
	PerMinute float64
}

// KeyShares splits API keys' limits between the replicas.
type KeyShares interface {
	// Tick recomputes this replica's shares at now and returns its demand
	// to tell the peers (every load_interval).
	Tick(now time.Time) []KeyDemand
	// Peer records replica's demand, heard at now.
	Peer(replica string, ds []KeyDemand, now time.Time)
}

const magicKeys = 'K'

// Bounds of a keys message.
const (
	// MaxKeys bounds the keys of one message.
	MaxKeys = 1 << 14
	// MaxPerMinuteMilli bounds a key's demand, in thousandths of a
	// request per minute.
	MaxPerMinuteMilli = 1 << 50
)

// EncodeKeys encodes replica's demand per key, sent at sent; keys beyond
// MaxKeys are cut.
func EncodeKeys(dst []byte, replica string, sent time.Time, ds []KeyDemand) []byte {
	w := &writer{b: append(dst, magicKeys, version)}
	w.str(replica)
	w.varint(sent.UnixNano())
	ds = ds[:min(len(ds), MaxKeys)]
	w.uvarint(uint64(len(ds)))
	for _, d := range ds {
		w.str(d.Key)
		milli := d.PerMinute * 1000
		if math.IsNaN(milli) {
			milli = 0
		}
		w.bounded(int64(min(milli, MaxPerMinuteMilli)), MaxPerMinuteMilli)
	}
	return w.b
}

// DecodeKeys decodes a keys message: the replica, when it was sent, its
// demand per key.
func DecodeKeys(data []byte) (string, time.Time, []KeyDemand, error) {
	r := &reader{b: data}
	r.header(magicKeys)
	replica := r.str("replica")
	sent := time.Unix(0, r.varint())
	n := r.count(MaxKeys, 2, "keys")
	var ds []KeyDemand
	for i := 0; i < n && r.err == nil; i++ {
		d := KeyDemand{Key: r.str("key")}
		d.PerMinute = float64(r.uvarint(MaxPerMinuteMilli, "per minute")) / 1000
		ds = append(ds, d)
	}
	if err := r.done(); err != nil {
		return "", time.Time{}, nil, err
	}
	return replica, sent, ds, nil
}

// tickKeys publishes this replica's demand per key, when it shares keys'
// limits.
func (c *Client) tickKeys(now time.Time) {
	if c.o.Keys == nil {
		return
	}
	ds := c.o.Keys.Tick(now)
	c.mu.Lock()
	nc, id := c.nc, c.id
	c.mu.Unlock()
	if nc == nil {
		return
	}
	if err := nc.Publish(c.subject(subjectKeys+"."+id), EncodeKeys(nil, id, now, ds)); err != nil {
		c.m.Dropped(metrics.SyncKeys, metrics.SyncDropDisconnected, 1)
		return
	}
	c.m.Sent(metrics.SyncKeys, 1)
}

// onKeys takes a peer's demand per key: bounded, decoded and checked like
// a batch (its subject, its age, the peer's rate), then given to Keys.
func (c *Client) onKeys(msg *nats.Msg) {
	from, ok := subjectToken(msg.Subject, c.subject(subjectKeys))
	reason := ""
	var (
		replica string
		sent    time.Time
		ds      []KeyDemand
		err     error
	)
	switch {
	case !ok:
		reason = metrics.SyncDropMalformed
	case len(msg.Data) > c.cfg.MaxMessageBytes:
		reason = metrics.SyncDropOversized
	case from == c.ID():
		c.warnDuplicateID()
		reason = metrics.SyncDropDuplicateID
	default:
		replica, sent, ds, err = DecodeKeys(msg.Data)
		switch age := time.Since(sent); {
		case err != nil:
			reason = metrics.SyncDropMalformed
		case replica != from:
			reason = metrics.SyncDropSpoofed
			c.warnSpoofed(from, replica)
		case age > c.cfg.StaleAfter.Duration || -age > c.cfg.StaleAfter.Duration:
			reason = metrics.SyncDropStale
		case !c.allow(from):
			reason = metrics.SyncDropRate
		}
	}
	if reason != "" {
		c.m.Dropped(metrics.SyncKeys, reason, 1)
		return
	}
	c.m.Received(metrics.SyncKeys, 1)
	c.o.Keys.Peer(replica, ds, time.Now())
}
