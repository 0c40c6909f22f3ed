package fleetsync

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/routing/sticky"
)

// The wire format is compact binary, little-endian, every count and length
// bounded before anything is allocated:
//
//	batch    = 'B' version replica:str sent:varint(unix ns) chunk_bytes:uvarint
//	           n:uvarint event*n
//	event    = kind:byte body
//	pick     = model:str worker:str n:uvarint hash:u64*n
//	index    = model:str worker:str n:uvarint hash:u64*n
//
// A replica sends a pick's hashes in an index event beside it (n is 0 in
// its picks); a pick with hashes is indexed alike.
//	release  = worker:str
//	lift     = worker:str
//	load     = n:uvarint (worker:str count:uvarint)*n
//	eject    = model:str worker:str reason:str for_ms:uvarint
//	stored   = id:digest owner:digest worker:str ttl_ms:uvarint
//	forget   = id:digest
//	snapshot = 'S' version replica:str chunk_bytes:uvarint
//	           n:uvarint (model:str worker:str m:uvarint hash:u64*m)*n
//	           n:uvarint (worker:str count:uvarint)*n
//	           n:uvarint (worker:str model:str reason:str for_ms:uvarint)*n
//	records  = 'R' version replica:str
//	           n:uvarint (id:digest owner:digest worker:str ttl_ms:uvarint)*n
//	str      = len:uvarint byte*len (len <= MaxString)
//	digest   = byte*DigestBytes (a stored response's id and owner are
//	           digests, sticky.Digest and sticky.OwnerTag: never in clear)
//
// Anything else, or bytes left over, is malformed.

const (
	magicBatch    = 'B'
	magicSnapshot = 'S'
	magicRecords  = 'R'
	version       = 2
)

// DigestBytes is the length of a stored response's id and owner digests.
const DigestBytes = sticky.DigestBytes

// Bounds of a decoded message.
const (
	// MaxString bounds a replica id, model, worker id, reason or stored
	// response id.
	MaxString = routes.MaxIDLen
	// MaxHashes bounds the chunk hashes of one pick (a 1 MiB prompt at
	// 128-byte chunks) or one snapshot entry.
	MaxHashes = 1 << 16
	// MaxEvents bounds a batch's events, MaxLoads a load report's workers
	// and a snapshot's lists.
	MaxEvents = 1 << 16
	MaxLoads  = 1 << 14
	// MaxInFlight bounds one in-flight count, MaxChunkBytes a chunk size.
	MaxInFlight   = 1 << 20
	MaxChunkBytes = 1 << 20
	// MaxFor bounds an ejection's duration.
	MaxFor = 24 * time.Hour
	// MaxStoredFor bounds a stored response's time left (the longest
	// gateway.responses.store_ttl).
	MaxStoredFor = config.MaxResponsesStoreTTL
)

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("fleetsync: malformed message")

type writer struct{ b []byte }

func (w *writer) uvarint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *writer) varint(v int64)   { w.b = binary.AppendVarint(w.b, v) }

// bounded writes v clamped to [0, limit]: the decoder refuses a value
// above its bound, and one such value would make the whole message
// malformed at every peer.
func (w *writer) bounded(v int64, limit uint64) { w.uvarint(min(uint64(max(0, v)), limit)) }

func (w *writer) str(s string) {
	if len(s) > MaxString {
		s = s[:MaxString]
	}
	w.uvarint(uint64(len(s)))
	w.b = append(w.b, s...)
}

// digest writes exactly DigestBytes of d (cut, or padded with zeros).
func (w *writer) digest(d string) {
	var b [DigestBytes]byte
	copy(b[:], d)
	w.b = append(w.b, b[:]...)
}

func (w *writer) hashes(hs []uint64) {
	hs = hs[:min(len(hs), MaxHashes)]
	w.uvarint(uint64(len(hs)))
	for _, h := range hs {
		w.b = binary.LittleEndian.AppendUint64(w.b, h)
	}
}

func (w *writer) forMs(d time.Duration) { w.bounded(d.Milliseconds(), uint64(MaxFor.Milliseconds())) }
func (w *writer) ttlMs(d time.Duration) {
	w.bounded(d.Milliseconds(), uint64(MaxStoredFor.Milliseconds()))
}
func (w *writer) inFlight(n int)   { w.bounded(int64(n), MaxInFlight) }
func (w *writer) chunkBytes(n int) { w.bounded(int64(n), MaxChunkBytes) }

// knownKind reports whether the codec can write an event of kind k.
func knownKind(k router.PeerEventKind) bool {
	switch k {
	case router.PeerPick, router.PeerIndex, router.PeerRelease, router.PeerLoad, router.PeerEject, router.PeerStored, router.PeerForget, router.PeerLift, router.PeerSpeculate:
		return true
	}
	return false
}

// appendEvent encodes one event of a known kind.
func appendEvent(w *writer, ev *router.PeerEvent) {
	w.b = append(w.b, byte(ev.Kind))
	switch ev.Kind {
	case router.PeerPick, router.PeerIndex, router.PeerSpeculate:
		w.str(ev.Model)
		w.str(ev.Worker)
		w.hashes(ev.Hashes)
	case router.PeerRelease, router.PeerLift:
		w.str(ev.Worker)
	case router.PeerLoad:
		ls := ev.Loads[:min(len(ev.Loads), MaxLoads)]
		w.uvarint(uint64(len(ls)))
		for _, l := range ls {
			w.str(l.Worker)
			w.inFlight(l.N)
		}
	case router.PeerEject:
		w.str(ev.Model)
		w.str(ev.Worker)
		w.str(ev.Reason)
		w.forMs(ev.For)
	case router.PeerStored:
		w.digest(ev.ID)
		w.digest(ev.Owner)
		w.str(ev.Worker)
		w.ttlMs(ev.For)
	case router.PeerForget:
		w.digest(ev.ID)
	}
}

// eventSize is an upper bound of an event's encoded size.
func eventSize(ev *router.PeerEvent) int {
	n := 1 + 5*binary.MaxVarintLen64 // kind, string lengths, counts
	n += len(ev.Model) + len(ev.Worker) + len(ev.Reason) + 2*DigestBytes + 8*len(ev.Hashes) + binary.MaxVarintLen64
	for _, l := range ev.Loads {
		n += len(l.Worker) + 2*binary.MaxVarintLen64
	}
	return n
}

// EncodeBatch encodes a batch. Whatever it writes decodes: every value is
// clamped to its decoding bound, strings and lists cut to theirs, events
// of a kind the codec does not know and those beyond MaxEvents left out.
func EncodeBatch(dst []byte, b *router.PeerBatch) []byte {
	w := &writer{b: append(dst, magicBatch, version)}
	w.str(b.Replica)
	w.varint(b.Sent.UnixNano())
	w.chunkBytes(b.ChunkBytes)
	n := 0
	for i := range b.Events {
		if knownKind(b.Events[i].Kind) {
			n++
		}
	}
	n = min(n, MaxEvents)
	w.uvarint(uint64(n))
	for i := 0; i < len(b.Events) && n > 0; i++ {
		if knownKind(b.Events[i].Kind) {
			appendEvent(w, &b.Events[i])
			n--
		}
	}
	return w.b
}

// EncodeSnapshot encodes replica's snapshot, clamped and cut like
// EncodeBatch.
func EncodeSnapshot(dst []byte, replica string, s *router.Snapshot) []byte {
	w := &writer{b: append(dst, magicSnapshot, version)}
	w.str(replica)
	w.chunkBytes(s.ChunkBytes)
	index := s.Index[:min(len(s.Index), MaxLoads)]
	w.uvarint(uint64(len(index)))
	for _, e := range index {
		w.str(e.Model)
		w.str(e.Worker)
		w.hashes(e.Hashes)
	}
	inFlight := s.InFlight[:min(len(s.InFlight), MaxLoads)]
	w.uvarint(uint64(len(inFlight)))
	for _, l := range inFlight {
		w.str(l.Worker)
		w.inFlight(l.N)
	}
	ejections := s.Ejections[:min(len(s.Ejections), MaxLoads)]
	w.uvarint(uint64(len(ejections)))
	for _, e := range ejections {
		w.str(e.Worker)
		w.str(e.Model)
		w.str(e.Reason)
		w.forMs(e.For)
	}
	return w.b
}

// EncodeRecords encodes the stored responses replica relayed itself,
// cut to router.MaxSnapshotStored.
func EncodeRecords(dst []byte, replica string, rs []router.StoredRecord) []byte {
	w := &writer{b: append(dst, magicRecords, version)}
	w.str(replica)
	rs = rs[:min(len(rs), router.MaxSnapshotStored)]
	w.uvarint(uint64(len(rs)))
	for _, e := range rs {
		w.digest(e.ID)
		w.digest(e.Owner)
		w.str(e.Worker)
		w.ttlMs(e.For)
	}
	return w.b
}

// recordBytes bounds a stored response's encoded size beside its worker.
const recordBytes = 2*DigestBytes + 2*binary.MaxVarintLen32

type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
	r.b = nil
}

func (r *reader) byte() byte {
	if len(r.b) < 1 {
		r.fail("truncated")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) uvarint(limit uint64, what string) uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("bad varint (%s)", what)
		return 0
	}
	r.b = r.b[n:]
	if v > limit {
		r.fail("%s %d above %d", what, v, limit)
		return 0
	}
	return v
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) str(what string) string {
	n := r.uvarint(MaxString, what+" length")
	if r.err != nil {
		return ""
	}
	if uint64(len(r.b)) < n {
		r.fail("truncated %s", what)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// count reads a list's length, at most limit and at most what the bytes
// left could hold at minSize bytes an element.
func (r *reader) count(limit uint64, minSize int, what string) int {
	n := r.uvarint(limit, what)
	if r.err == nil && n*uint64(minSize) > uint64(len(r.b)) {
		r.fail("%s %d longer than the message", what, n)
		return 0
	}
	return int(n)
}

func (r *reader) digest(what string) string {
	if len(r.b) < DigestBytes {
		r.fail("truncated %s", what)
		return ""
	}
	d := string(r.b[:DigestBytes])
	r.b = r.b[DigestBytes:]
	return d
}

func (r *reader) hashes() []uint64 {
	n := r.count(MaxHashes, 8, "hashes")
	if r.err != nil || n == 0 {
		return nil
	}
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = binary.LittleEndian.Uint64(r.b[8*i:])
	}
	r.b = r.b[8*n:]
	return hs
}

func (r *reader) forMs() time.Duration {
	return time.Duration(r.uvarint(uint64(MaxFor.Milliseconds()), "ejection ms")) * time.Millisecond
}

func (r *reader) ttlMs() time.Duration {
	return time.Duration(r.uvarint(uint64(MaxStoredFor.Milliseconds()), "stored ms")) * time.Millisecond
}

func (r *reader) header(magic byte) {
	if m := r.byte(); r.err == nil && m != magic {
		r.fail("not a %q message (%q)", magic, m)
	}
	if v := r.byte(); r.err == nil && v != version {
		r.fail("version %d, want %d", v, version)
	}
}

func (r *reader) done() error {
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d bytes left over", len(r.b))
	}
	return r.err
}

// DecodeBatch decodes a batch; the error wraps ErrMalformed. Its replica
// id may be empty: the caller checks who sent it.
func DecodeBatch(data []byte) (*router.PeerBatch, error) {
	r := &reader{b: data}
	r.header(magicBatch)
	b := &router.PeerBatch{}
	b.Replica = r.str("replica")
	b.Sent = time.Unix(0, r.varint())
	b.ChunkBytes = int(r.uvarint(MaxChunkBytes, "chunk bytes"))
	n := r.count(MaxEvents, 2, "events")
	if r.err == nil {
		b.Events = make([]router.PeerEvent, 0, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		ev := router.PeerEvent{Kind: router.PeerEventKind(r.byte())}
		switch ev.Kind {
		case router.PeerPick, router.PeerIndex, router.PeerSpeculate:
			ev.Model, ev.Worker = r.str("model"), r.str("worker")
			ev.Hashes = r.hashes()
		case router.PeerRelease, router.PeerLift:
			ev.Worker = r.str("worker")
		case router.PeerLoad:
			m := r.count(MaxLoads, 2, "loads")
			for j := 0; j < m && r.err == nil; j++ {
				ev.Loads = append(ev.Loads, router.WorkerLoad{Worker: r.str("worker"), N: int(r.uvarint(MaxInFlight, "in flight"))})
			}
		case router.PeerEject:
			ev.Model, ev.Worker, ev.Reason = r.str("model"), r.str("worker"), r.str("reason")
			ev.For = r.forMs()
		case router.PeerStored:
			ev.ID, ev.Owner, ev.Worker = r.digest("id"), r.digest("owner"), r.str("worker")
			ev.For = r.ttlMs()
		case router.PeerForget:
			ev.ID = r.digest("id")
		default:
			r.fail("unknown event kind %d", ev.Kind)
		}
		b.Events = append(b.Events, ev)
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	return b, nil
}

// DecodeSnapshot decodes a snapshot and the replica that sent it.
func DecodeSnapshot(data []byte) (string, *router.Snapshot, error) {
	r := &reader{b: data}
	r.header(magicSnapshot)
	replica := r.str("replica")
	s := &router.Snapshot{ChunkBytes: int(r.uvarint(MaxChunkBytes, "chunk bytes"))}
	n := r.count(MaxLoads, 3, "index entries")
	for i := 0; i < n && r.err == nil; i++ {
		e := router.SnapshotEntry{Model: r.str("model"), Worker: r.str("worker")}
		e.Hashes = r.hashes()
		s.Index = append(s.Index, e)
	}
	n = r.count(MaxLoads, 2, "in flight")
	for i := 0; i < n && r.err == nil; i++ {
		s.InFlight = append(s.InFlight, router.WorkerLoad{Worker: r.str("worker"), N: int(r.uvarint(MaxInFlight, "in flight"))})
	}
	n = r.count(MaxLoads, 4, "ejections")
	for i := 0; i < n && r.err == nil; i++ {
		e := router.SnapshotEjection{Worker: r.str("worker"), Model: r.str("model"), Reason: r.str("reason")}
		e.For = r.forMs()
		s.Ejections = append(s.Ejections, e)
	}
	if err := r.done(); err != nil {
		return "", nil, err
	}
	return replica, s, nil
}

// DecodeRecords decodes a list of stored responses and the replica that
// sent it.
func DecodeRecords(data []byte) (string, []router.StoredRecord, error) {
	r := &reader{b: data}
	r.header(magicRecords)
	replica := r.str("replica")
	n := r.count(router.MaxSnapshotStored, 2*DigestBytes+2, "stored")
	var rs []router.StoredRecord
	if r.err == nil {
		rs = make([]router.StoredRecord, 0, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		e := router.StoredRecord{ID: r.digest("id"), Owner: r.digest("owner"), Worker: r.str("worker")}
		e.For = r.ttlMs()
		rs = append(rs, e)
	}
	if err := r.done(); err != nil {
		return "", nil, err
	}
	return replica, rs, nil
}
