package fleetsync

import (
	"context"
	"encoding/binary"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
)

// Warm starts: a replica that starts, or reconnects, publishes its id on
// P.snapshot; one replica of the queue group answers on its own subject
// P.snapshots.<replica>.<asker>, which only it may publish to under
// per-replica NATS users, so the asker knows whose view it applies. A
// replica first heard from is asked on P.stored.<replica> for the stored
// responses it relayed itself, and answers on the same subject of its own.

// onSnapshotRequest answers a peer's warm start with the router's view,
// sized to fit one message before the router copies anything.
func (c *Client) onSnapshotRequest(msg *nats.Msg) {
	asker, ok := c.askerToServe(msg, metrics.SyncSnapshot)
	if !ok {
		return
	}
	data := c.buildSnapshot()
	if data == nil || !c.answerAsker(asker, data, metrics.SyncSnapshot) {
		return
	}
	c.m.Sent(metrics.SyncSnapshot, 1)
	c.m.Snapshot(metrics.SnapshotServed, len(data), 0)
}

// askerToServe returns the replica id a request of kind (a snapshot, or
// stored records) on msg asks for, ok false when it is not answered: its
// id is this replica's own, malformed, or asks past the serving rate.
func (c *Client) askerToServe(msg *nats.Msg, kind string) (string, bool) {
	asker := string(msg.Data)
	switch {
	case asker == c.ID():
		c.warnDuplicateID()
		return "", false
	case !ValidReplicaID(asker):
		c.m.Dropped(kind, metrics.SyncDropMalformed, 1)
		return "", false
	case !c.serveLimit.Allow():
		c.m.Dropped(kind, metrics.SyncDropRate, 1)
		return "", false
	}
	return asker, true
}

// answerAsker publishes data of kind to asker on this replica's snapshot
// subject, and reports whether it went.
func (c *Client) answerAsker(asker string, data []byte, kind string) bool {
	c.mu.Lock()
	nc := c.nc
	c.mu.Unlock()
	if nc == nil || nc.Publish(c.subject(subjectSnapshots+"."+c.ID()+"."+asker), data) != nil {
		c.m.Dropped(kind, metrics.SyncDropDisconnected, 1)
		return false
	}
	return true
}

// snapshotLimit is the size a snapshot sent must fit: max_message_bytes,
// and the NATS server's max_payload.
func (c *Client) snapshotLimit() int {
	c.mu.Lock()
	nc := c.nc
	c.mu.Unlock()
	limit := c.cfg.MaxMessageBytes
	if nc != nil && nc.MaxPayload() > 0 {
		limit = min(limit, int(nc.MaxPayload()))
	}
	return limit
}

// buildSnapshot is this replica's snapshot, encoded within snapshotLimit:
// the router sizes its index to the bytes before copying it. nil: the
// router did not answer.
func (c *Client) buildSnapshot() []byte {
	limit := c.snapshotLimit()
	res, err := c.o.Root.RequestFuture(c.router, &router.SyncSnapshot{MaxChunks: c.cfg.SnapshotChunks, MaxBytes: limit},
		c.cfg.SnapshotTimeout.Duration).Result()
	if err != nil {
		c.log.Warn().Err(err).Msg("fleet sync: snapshot for a peer")
		return nil
	}
	snap, ok := res.(*router.Snapshot)
	if !ok {
		return nil
	}
	data := EncodeSnapshot(nil, c.ID(), snap)
	// The router's estimate errs on the large side; should it not, the
	// index gives way.
	for len(data) > limit && len(snap.Index) > 0 {
		snap.Index = snap.Index[:len(snap.Index)/2]
		data = EncodeSnapshot(data[:0], c.ID(), snap)
	}
	return data
}

// askRecords asks replica, just heard from, for the stored responses it
// relayed itself (it answers on its own subject: onSnapshot).
func (c *Client) askRecords(replica string) {
	c.mu.Lock()
	nc, id := c.nc, c.id
	c.mu.Unlock()
	if nc == nil || c.o.Stored == nil || !ValidReplicaID(replica) {
		return
	}
	c.mu.Lock()
	if len(c.recordsAsked) >= 2*c.cfg.MaxPeers {
		clear(c.recordsAsked) // answers never sent: ask anew
	}
	c.recordsAsked[replica] = true
	c.mu.Unlock()
	if err := nc.Publish(c.subject(subjectStored+"."+replica), []byte(id)); err != nil {
		c.m.Dropped(metrics.SyncStored, metrics.SyncDropDisconnected, 1)
	}
}

// onRecordsRequest answers a peer that asks for this replica's own stored
// responses (newest first, as many as fit one message): never a peer's.
func (c *Client) onRecordsRequest(msg *nats.Msg) {
	if c.o.Stored == nil {
		return
	}
	asker, ok := c.askerToServe(msg, metrics.SyncStored)
	if !ok {
		return
	}
	limit := c.snapshotLimit() - snapshotHeaderBytes
	var rs []router.StoredRecord
	size := 0
	c.o.Stored.ExportOwn(router.MaxSnapshotStored, time.Now(), func(digest, owner, worker string, ttl time.Duration) {
		if n := len(worker) + recordBytes; size+n <= limit {
			rs = append(rs, router.StoredRecord{ID: digest, Owner: owner, Worker: worker, For: ttl})
			size += n
		}
	})
	c.answerAsker(asker, EncodeRecords(nil, c.ID(), rs), metrics.SyncStored)
}

// snapshotHeaderBytes bounds a message's header and counts.
const snapshotHeaderBytes = 2 + 2*binary.MaxVarintLen32 + MaxString

// onSnapshot takes a peer's answer (its subject names the replica that
// sent it): a snapshot goes to the warm start waiting for one, a list of
// stored responses to the router.
func (c *Client) onSnapshot(msg *nats.Msg) {
	rest, ok := strings.CutPrefix(msg.Subject, c.subject(subjectSnapshots)+".")
	from, asker, found := strings.Cut(rest, ".")
	if !ok || !found || asker != c.ID() || !ValidReplicaID(from) || len(msg.Data) == 0 {
		c.m.Dropped(metrics.SyncSnapshot, metrics.SyncDropMalformed, 1)
		return
	}
	if len(msg.Data) > c.cfg.MaxMessageBytes {
		c.m.Dropped(metrics.SyncSnapshot, metrics.SyncDropOversized, 1)
		return
	}
	if msg.Data[0] == magicRecords {
		c.onRecords(from, msg.Data)
		return
	}
	replica, snap, err := DecodeSnapshot(msg.Data)
	switch {
	case err != nil:
		c.m.Dropped(metrics.SyncSnapshot, metrics.SyncDropMalformed, 1)
		return
	case replica != from:
		c.m.Dropped(metrics.SyncSnapshot, metrics.SyncDropSpoofed, 1)
		c.warnSpoofed(from, replica)
		return
	}
	c.mu.Lock()
	wait := c.snapWait
	c.mu.Unlock()
	select {
	case wait <- peerSnapshot{replica: replica, snap: snap, bytes: len(msg.Data)}:
	default:
		c.m.Dropped(metrics.SyncSnapshot, metrics.SyncDropUnasked, 1)
	}
}

// onRecords hands replica from's stored responses to the router: its one
// answer to this replica's request (askRecords); an answer not asked for
// is dropped before it is decoded.
func (c *Client) onRecords(from string, data []byte) {
	c.mu.Lock()
	asked := c.recordsAsked[from]
	delete(c.recordsAsked, from)
	c.mu.Unlock()
	if !asked {
		c.m.Dropped(metrics.SyncStored, metrics.SyncDropUnasked, 1)
		return
	}
	replica, rs, err := DecodeRecords(data)
	switch {
	case err != nil:
		c.m.Dropped(metrics.SyncStored, metrics.SyncDropMalformed, 1)
		return
	case replica != from:
		c.m.Dropped(metrics.SyncStored, metrics.SyncDropSpoofed, 1)
		c.warnSpoofed(from, replica)
		return
	}
	c.o.Root.Send(c.router, &router.ApplyStored{Replica: replica, Stored: rs})
}

// peerSnapshot is a peer's snapshot on its way to the warm start.
type peerSnapshot struct {
	replica string
	snap    *router.Snapshot
	bytes   int
}

// warmStart asks the fleet for a peer's view and hands it to the router
// (one at a time: a reconnection during one adds none); Close ends it
// (ctx).
func (c *Client) warmStart(ctx context.Context) {
	if !c.warming.CompareAndSwap(false, true) {
		return
	}
	defer c.warming.Store(false)
	wait := make(chan peerSnapshot, 1)
	c.mu.Lock()
	nc, id := c.nc, c.id
	c.snapWait = wait
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.snapWait = nil
		c.mu.Unlock()
	}()
	if nc == nil {
		return
	}
	start := time.Now()
	if err := nc.Publish(c.subject(subjectSnapshot), []byte(id)); err != nil {
		c.m.Snapshot(metrics.SnapshotFailed, 0, time.Since(start))
		c.log.Warn().Err(err).Msg("fleet sync: snapshot request")
		return
	}
	timer := time.NewTimer(c.cfg.SnapshotTimeout.Duration)
	defer timer.Stop()
	var got peerSnapshot
	select {
	case <-ctx.Done():
		return // closed
	case <-timer.C:
		c.m.Snapshot(metrics.SnapshotNone, 0, time.Since(start))
		c.log.Info().Msg("fleet sync: no peer answered a snapshot request; starting from the local view")
		return
	case got = <-wait:
	}
	c.o.Root.Send(c.router, &router.ApplySnapshot{Replica: got.replica, Snapshot: got.snap})
	c.m.Received(metrics.SyncSnapshot, 1)
	c.m.Snapshot(metrics.SnapshotApplied, got.bytes, time.Since(start))
	c.log.Info().Str("peer", got.replica).Int("bytes", got.bytes).Int("workers", len(got.snap.Index)).
		Dur("took", time.Since(start)).Msg("fleet sync: warm start from a peer's snapshot")
}
