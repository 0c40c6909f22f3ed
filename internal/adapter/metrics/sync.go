package metrics

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Kinds of fleet-sync message: the kind label of the tlgate_sync_* counters
// (a batch is one NATS message of events; a snapshot a warm start's).
const (
	SyncPick    = "pick"
	SyncRelease = "release"
	SyncLoad    = "load"
	SyncEject   = "eject"
	SyncStored  = "stored"
	SyncForget  = "forget"
	SyncIndex   = "index"
	SyncLift    = "lift"
	// SyncSpeculate: an exact pick's speculative blocks.
	SyncSpeculate = "speculate"
	SyncBatch     = "batch"
	SyncSnapshot  = "snapshot"
	// SyncKeys: a replica's demand per limited API key (fleet-wide key
	// limits), a message of its own every load_interval.
	SyncKeys = "keys"
	// SyncTraffic: a replica's traffic rings, asked for the console's
	// view of the fleet.
	SyncTraffic = "traffic"
)

// Reasons a fleet-sync message is dropped: the reason label of
// tlgate_sync_messages_dropped_total.
const (
	SyncDropMalformed = "malformed"
	SyncDropOversized = "oversized"
	SyncDropStale     = "stale"
	// SyncDropDuplicateID: a message under this replica's own id. The
	// connection asks NATS for no echoes, so another process publishes
	// under the id: two replicas share a replica_id (or one forges it).
	SyncDropDuplicateID   = "duplicate_id"
	SyncDropRate          = "rate"
	SyncDropQueueFull     = "queue_full"
	SyncDropDisconnected  = "disconnected"
	SyncDropSlowConsumer  = "slow_consumer"
	SyncDropUnknownWorker = "unknown_worker"
	SyncDropOtherModel    = "other_model"
	SyncDropTooManyPeers  = "too_many_peers"
	SyncDropCapped        = "capped"
	SyncDropChunkBytes    = "chunk_bytes"
	SyncDropUnknownKind   = "unknown_kind"
	SyncDropEjection      = "ejection_refused"
	SyncDropInvalid       = "invalid"
	// SyncDropSpoofed: a message that names another replica than the one
	// whose subject it came on.
	SyncDropSpoofed = "spoofed"
	// SyncDropBacklog: a batch the router has not taken room for (its
	// inbox is full).
	SyncDropBacklog = "backlog"
	// SyncDropUnasked: a snapshot that came when no warm start waited.
	SyncDropUnasked = "unasked"
	// SyncDropNoEvidence: a peer's ejection of a worker this replica saw
	// no failure of, too few peers reporting it: the worker is suspect
	// here, not ejected.
	SyncDropNoEvidence = "no_evidence"
	// SyncDropUnlisted: a lift of an ejection from a replica not listed in
	// [gateway.sync] peers.
	SyncDropUnlisted = "unlisted"
)

// Outcomes of a warm start's snapshot request: the outcome label of
// tlgate_sync_snapshots_total (served: one this replica answered).
const (
	SnapshotApplied = "applied"
	SnapshotNone    = "no_peer"
	SnapshotFailed  = "failed"
	SnapshotServed  = "served"
)

var (
	syncKinds       = fixedSet{SyncPick, SyncRelease, SyncLoad, SyncEject, SyncStored, SyncForget, SyncIndex, SyncLift, SyncSpeculate, SyncBatch, SyncSnapshot, SyncKeys, SyncTraffic}
	syncDropReasons = fixedSet{SyncDropMalformed, SyncDropOversized, SyncDropStale, SyncDropDuplicateID, SyncDropRate, SyncDropQueueFull,
		SyncDropDisconnected, SyncDropSlowConsumer, SyncDropUnknownWorker, SyncDropOtherModel, SyncDropTooManyPeers, SyncDropCapped,
		SyncDropChunkBytes, SyncDropUnknownKind, SyncDropEjection, SyncDropInvalid, SyncDropSpoofed, SyncDropBacklog, SyncDropUnasked, SyncDropNoEvidence, SyncDropUnlisted}
	snapshotOutcomes = fixedSet{SnapshotApplied, SnapshotNone, SnapshotFailed, SnapshotServed}
)

// SyncMetrics are fleet sync's metrics. Every label is a fixed set
// (anything else counts as Other); the methods are safe for concurrent use
// and do nothing on a nil *SyncMetrics.
type SyncMetrics struct {
	up        prometheus.Gauge
	peers     prometheus.Gauge
	uncorrob  prometheus.Gauge
	sent      *prometheus.CounterVec
	received  *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	bytesSent prometheus.Counter
	bytesRecv prometheus.Counter
	lag       prometheus.Histogram
	snapBytes prometheus.Histogram
	snapTime  prometheus.Histogram
	snapshots *prometheus.CounterVec
}

// NewSyncMetrics creates fleet sync's metrics and registers them on reg;
// it fails, registering nothing, when reg is nil or refuses one.
func NewSyncMetrics(reg prometheus.Registerer) (*SyncMetrics, error) {
	if reg == nil {
		return nil, ErrNilRegisterer
	}
	s := newSyncMetrics()
	cs := []prometheus.Collector{s.up, s.peers, s.uncorrob, s.sent, s.received, s.dropped, s.bytesSent, s.bytesRecv, s.lag, s.snapBytes, s.snapTime, s.snapshots}
	if err := registerAll(reg, cs...); err != nil {
		return nil, err
	}
	return s, nil
}

func newSyncMetrics() *SyncMetrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	}
	s := &SyncMetrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "sync_up",
			Help: "1 while fleet sync is connected to NATS, else 0 (the replica routes on its own view)."}),
		peers: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "sync_peers",
			Help: "Other replicas tracked (heard from within peer_timeout), at most max_peers."}),
		uncorrob: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "sync_peer_claims_uncorroborated",
			Help: "Requests in flight that peers claim on the workers beyond what the engines' reports bear out (plus peer_claim_margin picks since), summed over the workers: not counted in routing."}),
		sent: counter("sync_messages_sent_total",
			"Fleet-sync messages published, by kind (pick, release, load, eject: events; batch: the NATS messages that carry them; snapshot: snapshots served).", lKind),
		received: counter("sync_messages_received_total",
			"Fleet-sync messages received from peers and applied, by kind.", lKind),
		dropped: counter("sync_messages_dropped_total",
			"Fleet-sync messages dropped, by kind and reason (malformed, oversized, stale, rate, queue_full, disconnected, unknown_worker, ...).", lKind, lReason),
		bytesSent: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "sync_sent_bytes_total",
			Help: "Bytes of fleet-sync batches published."}),
		bytesRecv: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "sync_received_bytes_total",
			Help: "Bytes of fleet-sync batches received from peers."}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "sync_lag_seconds",
			Help:    "Time from a batch's sending on a peer (by the peer's clock) to its events applied here.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}),
		snapBytes: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "sync_snapshot_bytes",
			Help:    "Size of the warm-start snapshots received and served.",
			Buckets: prometheus.ExponentialBuckets(1024, 4, 9)}),
		snapTime: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "sync_snapshot_seconds",
			Help:    "Time from a warm start's snapshot request to the snapshot handed to the router.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}),
		snapshots: counter("sync_snapshots_total",
			"Warm-start snapshots, by outcome (applied, no_peer, failed: requested by this replica; served: answered to a peer).", lOutcome),
	}
	for _, k := range syncKinds {
		s.sent.WithLabelValues(k)
		s.received.WithLabelValues(k)
	}
	for _, o := range snapshotOutcomes {
		s.snapshots.WithLabelValues(o)
	}
	return s
}

func oneOf(set fixedSet, v string) string {
	if slices.Contains(set, v) {
		return v
	}
	return Other
}

// Up sets tlgate_sync_up.
func (s *SyncMetrics) Up(up bool) {
	if s == nil {
		return
	}
	if up {
		s.up.Set(1)
	} else {
		s.up.Set(0)
	}
}

// Peers sets tlgate_sync_peers.
func (s *SyncMetrics) Peers(n int) {
	if s != nil {
		s.peers.Set(float64(n))
	}
}

// Uncorroborated sets tlgate_sync_peer_claims_uncorroborated.
func (s *SyncMetrics) Uncorroborated(n int) {
	if s != nil {
		s.uncorrob.Set(float64(n))
	}
}

// Sent counts n messages of kind published.
func (s *SyncMetrics) Sent(kind string, n int) {
	if s == nil || n <= 0 {
		return
	}
	s.sent.WithLabelValues(oneOf(syncKinds, kind)).Add(float64(n))
}

// SentBytes counts the bytes of a batch published.
func (s *SyncMetrics) SentBytes(n int) {
	if s != nil {
		s.bytesSent.Add(float64(n))
	}
}

// Received counts n messages of kind applied from peers.
func (s *SyncMetrics) Received(kind string, n int) {
	if s == nil || n <= 0 {
		return
	}
	s.received.WithLabelValues(oneOf(syncKinds, kind)).Add(float64(n))
}

// ReceivedBytes counts the bytes of a batch received.
func (s *SyncMetrics) ReceivedBytes(n int) {
	if s != nil {
		s.bytesRecv.Add(float64(n))
	}
}

// Dropped counts n messages of kind dropped for reason.
func (s *SyncMetrics) Dropped(kind, reason string, n int) {
	if s == nil || n <= 0 {
		return
	}
	s.dropped.WithLabelValues(oneOf(syncKinds, kind), oneOf(syncDropReasons, reason)).Add(float64(n))
}

// Lag observes one batch's sync lag (negative lags, from clock skew, count
// as 0).
func (s *SyncMetrics) Lag(d time.Duration) {
	if s != nil {
		s.lag.Observe(max(0, d.Seconds()))
	}
}

// Snapshot counts a snapshot of outcome with its size (0: none) and, for
// one requested, the time it took.
func (s *SyncMetrics) Snapshot(outcome string, bytes int, took time.Duration) {
	if s == nil {
		return
	}
	s.snapshots.WithLabelValues(oneOf(snapshotOutcomes, outcome)).Inc()
	if bytes > 0 {
		s.snapBytes.Observe(float64(bytes))
	}
	if outcome != SnapshotServed && took > 0 {
		s.snapTime.Observe(took.Seconds())
	}
}
