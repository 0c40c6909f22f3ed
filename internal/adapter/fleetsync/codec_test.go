package fleetsync

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func sampleBatch() *router.PeerBatch {
	return &router.PeerBatch{Replica: "gw-0:8080", Sent: time.Unix(0, 1_700_000_000_123_456_789), ChunkBytes: 128, Events: []router.PeerEvent{
		{Kind: router.PeerPick, Model: "smol-v3", Worker: "a", Hashes: []uint64{1, 2, 1 << 63}},
		{Kind: router.PeerPick, Model: "smol-v3", Worker: "b"},
		{Kind: router.PeerRelease, Worker: "a"},
		{Kind: router.PeerLoad, Loads: []router.WorkerLoad{{Worker: "a", N: 3}, {Worker: "b", N: 1}}},
		{Kind: router.PeerEject, Model: "smol-v3", Worker: "b", Reason: "refused", For: 10 * time.Second},
		{Kind: router.PeerStored, ID: "0123456789abcdef", Owner: "owner-tag-16byte", Worker: "a", For: time.Hour},
		{Kind: router.PeerForget, ID: "fedcba9876543210"},
		{Kind: router.PeerIndex, Model: "smol-v3", Worker: "b", Hashes: []uint64{3, 4}},
		{Kind: router.PeerLift, Worker: "b"},
		{Kind: router.PeerSpeculate, Worker: "a", Hashes: []uint64{5, 6, 7}},
	}}
}

func sampleSnapshot() *router.Snapshot {
	return &router.Snapshot{ChunkBytes: 128,
		Index:     []router.SnapshotEntry{{Model: "m", Worker: "a", Hashes: []uint64{7, 8}}, {Model: "m", Worker: "b", Hashes: []uint64{9}}},
		InFlight:  []router.WorkerLoad{{Worker: "a", N: 2}},
		Ejections: []router.SnapshotEjection{{Worker: "b", Model: "m", Reason: "reset", For: 1500 * time.Millisecond}},
	}
}

func sampleRecords() []router.StoredRecord {
	return []router.StoredRecord{
		{ID: "digest-of-resp-1", Owner: "owner-of-resp-1.", Worker: "a", For: 59 * time.Minute},
		{ID: "digest-of-resp-2", Owner: "owner-of-resp-2.", Worker: "b", For: 1234 * time.Millisecond},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	b := sampleBatch()
	got, err := DecodeBatch(EncodeBatch(nil, b))
	if err != nil {
		t.Fatal(err)
	}
	if !got.Sent.Equal(b.Sent) {
		t.Fatalf("sent %v, want %v", got.Sent, b.Sent)
	}
	got.Sent = b.Sent
	if !reflect.DeepEqual(got, b) {
		t.Fatalf("batch\n got %+v\nwant %+v", got, b)
	}
	s := sampleSnapshot()
	id, gs, err := DecodeSnapshot(EncodeSnapshot(nil, "gw-1", s))
	if err != nil || id != "gw-1" || !reflect.DeepEqual(gs, s) {
		t.Fatalf("snapshot %q %+v %v, want gw-1 %+v", id, gs, err, s)
	}
	rs := sampleRecords()
	id, grs, err := DecodeRecords(EncodeRecords(nil, "gw-1", rs))
	if err != nil || id != "gw-1" || !reflect.DeepEqual(grs, rs) {
		t.Fatalf("records %q %+v %v, want gw-1 %+v", id, grs, err, rs)
	}
}

// TestCodecStoredNeverInClear: a stored response's id and owner travel
// as fixed-length digests: whatever the encoder is handed, it writes
// DigestBytes of it, never more.
func TestCodecStoredNeverInClear(t *testing.T) {
	id := "resp_" + strings.Repeat("secret", 10)
	data := EncodeBatch(nil, &router.PeerBatch{Replica: "r", Events: []router.PeerEvent{{Kind: router.PeerStored, ID: id, Owner: "alice", Worker: "a", For: time.Hour}}})
	if bytes.Contains(data, []byte(id[:DigestBytes+1])) {
		t.Fatalf("the encoded batch holds more than %d bytes of the id", DigestBytes)
	}
	b, err := DecodeBatch(data)
	if err != nil || len(b.Events[0].ID) != DigestBytes || len(b.Events[0].Owner) != DigestBytes {
		t.Fatalf("decoded %+v %v", b, err)
	}
}

func TestCodecRejects(t *testing.T) {
	good := EncodeBatch(nil, sampleBatch())
	huge := EncodeBatch(nil, &router.PeerBatch{Replica: "r", Events: []router.PeerEvent{{Kind: router.PeerPick, Model: "m", Worker: "a", Hashes: make([]uint64, 10)}}})
	// Claim more hashes than the message holds.
	lying := append([]byte(nil), huge...)
	lying[len(lying)-81] = 0x7f
	tests := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"garbage", []byte("hello, world")},
		{"a snapshot where a batch goes", EncodeSnapshot(nil, "r", sampleSnapshot())},
		{"another version", append([]byte{'B', 9}, good[2:]...)},
		{"truncated", good[:len(good)-3]},
		{"bytes left over", append(append([]byte(nil), good...), 0)},
		{"unknown kind", append(EncodeBatch(nil, &router.PeerBatch{Replica: "r"})[:len(EncodeBatch(nil, &router.PeerBatch{Replica: "r"}))-1], 1, 42)},
		{"a count longer than the message", lying},
		{"a stored response's time above the bound", func() []byte {
			w := &writer{b: []byte{magicBatch, version}}
			w.str("r")
			w.varint(0)
			w.uvarint(0)
			w.uvarint(1)
			w.b = append(w.b, byte(router.PeerStored))
			w.digest("digest")
			w.digest("owner")
			w.str("a")
			w.uvarint(uint64(MaxStoredFor.Milliseconds()) + 1)
			return w.b
		}()},
		{"a forget cut short", EncodeBatch(nil, &router.PeerBatch{Replica: "r", Events: []router.PeerEvent{
			{Kind: router.PeerForget, ID: "digest"}}})[:20]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if b, err := DecodeBatch(tt.data); !errors.Is(err, ErrMalformed) || b != nil {
				t.Fatalf("DecodeBatch = %+v, %v; want ErrMalformed", b, err)
			}
			if tt.name == "a snapshot where a batch goes" {
				return
			}
			if _, s, err := DecodeSnapshot(tt.data); !errors.Is(err, ErrMalformed) || s != nil {
				t.Fatalf("DecodeSnapshot = %+v, %v; want ErrMalformed", s, err)
			}
		})
	}
}

// FuzzDecodeSync feeds arbitrary bytes to both decoders: they never panic,
// never allocate beyond the message's own bounds, and whatever decodes
// encodes back to a message that decodes the same.
func FuzzDecodeSync(f *testing.F) {
	f.Add(EncodeBatch(nil, sampleBatch()))
	f.Add(EncodeSnapshot(nil, "gw", sampleSnapshot()))
	f.Add(EncodeRecords(nil, "gw", sampleRecords()))
	f.Add([]byte("B\x02\x01r\x00\x00\x01\x01\x01m\x01a\xff\xff\x03"))
	f.Add([]byte("B\x02\x01r\x00\x00\x01\x050123456789abcdefowner-tag-16byte\x01a\xff\xff\xff\xff\x0f"))  // a stored ttl far above the bound
	f.Add(append(EncodeRecords(nil, "gw", nil)[:len(EncodeRecords(nil, "gw", nil))-1], 0xff, 0xff, 0x03)) // a lying stored count
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if b, err := DecodeBatch(data); err == nil {
			again, err := DecodeBatch(EncodeBatch(nil, b))
			if err != nil {
				t.Fatalf("re-encoded batch does not decode: %v", err)
			}
			if !again.Sent.Equal(b.Sent) || again.Replica != b.Replica || len(again.Events) != len(b.Events) {
				t.Fatalf("re-encoded batch differs: %+v vs %+v", again, b)
			}
		} else if !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		if id, s, err := DecodeSnapshot(data); err == nil {
			id2, s2, err := DecodeSnapshot(EncodeSnapshot(nil, id, s))
			if err != nil || id2 != id || !reflect.DeepEqual(s2, s) {
				t.Fatalf("re-encoded snapshot differs: %q %+v %v", id2, s2, err)
			}
		} else if !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		if id, rs, err := DecodeRecords(data); err == nil {
			id2, rs2, err := DecodeRecords(EncodeRecords(nil, id, rs))
			if err != nil || id2 != id || !reflect.DeepEqual(rs2, rs) {
				t.Fatalf("re-encoded records differ: %q %+v %v", id2, rs2, err)
			}
		} else if !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
	})
}

// TestSyncCodecAtBounds: every value exactly at its decoding bound makes
// the round trip unchanged, and one past it is clamped by the encoder to
// the bound (never a message the peers refuse).
func TestSyncCodecAtBounds(t *testing.T) {
	long := func(c byte) string { return string(bytes.Repeat([]byte{c}, MaxString)) }
	hashes := make([]uint64, MaxHashes)
	for i := range hashes {
		hashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	loads := make([]router.WorkerLoad, MaxLoads)
	for i := range loads {
		loads[i] = router.WorkerLoad{Worker: fmt.Sprintf("w%d", i), N: MaxInFlight}
	}
	b := &router.PeerBatch{Replica: long('r'), Sent: time.Unix(0, 1), ChunkBytes: MaxChunkBytes, Events: []router.PeerEvent{
		{Kind: router.PeerPick, Model: long('m'), Worker: long('w'), Hashes: hashes},
		{Kind: router.PeerLoad, Loads: loads},
		{Kind: router.PeerEject, Model: long('m'), Worker: long('w'), Reason: long('x'), For: MaxFor},
		{Kind: router.PeerStored, ID: strings.Repeat("i", DigestBytes), Owner: strings.Repeat("o", DigestBytes), Worker: long('w'), For: MaxStoredFor},
		{Kind: router.PeerForget, ID: strings.Repeat("i", DigestBytes)},
	}}
	got, err := DecodeBatch(EncodeBatch(nil, b))
	if err != nil {
		t.Fatalf("a batch at the bounds: %v", err)
	}
	if !reflect.DeepEqual(got, b) {
		t.Fatalf("a batch at the bounds came back changed")
	}
	events := make([]router.PeerEvent, MaxEvents)
	for i := range events {
		events[i] = router.PeerEvent{Kind: router.PeerRelease, Worker: "w"}
	}
	if got, err := DecodeBatch(EncodeBatch(nil, &router.PeerBatch{Replica: "r", Events: events})); err != nil || len(got.Events) != MaxEvents {
		t.Fatalf("MaxEvents events: %v", err)
	}
	s := &router.Snapshot{ChunkBytes: MaxChunkBytes,
		Index:     []router.SnapshotEntry{{Model: long('m'), Worker: long('w'), Hashes: hashes}},
		InFlight:  loads,
		Ejections: []router.SnapshotEjection{{Worker: long('w'), Model: long('m'), Reason: long('x'), For: MaxFor}},
	}
	id, gs, err := DecodeSnapshot(EncodeSnapshot(nil, long('r'), s))
	if err != nil || id != long('r') || !reflect.DeepEqual(gs, s) {
		t.Fatalf("a snapshot at the bounds: %v", err)
	}
	rs := []router.StoredRecord{{ID: strings.Repeat("i", DigestBytes), Owner: strings.Repeat("o", DigestBytes), Worker: long('w'), For: MaxStoredFor}}
	if id, grs, err := DecodeRecords(EncodeRecords(nil, long('r'), rs)); err != nil || id != long('r') || !reflect.DeepEqual(grs, rs) {
		t.Fatalf("records at the bounds: %v", err)
	}

	// One past each bound: clamped to it.
	over := &router.PeerBatch{Replica: long('r') + "r", Sent: time.Unix(0, 1), ChunkBytes: MaxChunkBytes + 1, Events: []router.PeerEvent{
		{Kind: router.PeerPick, Model: long('m') + "m", Worker: "w", Hashes: append(hashes, 1)},
		{Kind: router.PeerLoad, Loads: append(loads, router.WorkerLoad{Worker: "extra", N: 1})},
		{Kind: router.PeerLoad, Loads: []router.WorkerLoad{{Worker: "w", N: MaxInFlight + 1}, {Worker: "v", N: -1}}},
		{Kind: router.PeerEject, Model: "m", Worker: "w", Reason: "r", For: MaxFor + time.Millisecond},
		{Kind: router.PeerEject, Model: "m", Worker: "w", Reason: "r", For: -time.Second},
		{Kind: router.PeerStored, ID: "i", Owner: "o", Worker: "w", For: MaxStoredFor + time.Millisecond},
		{Kind: 99},
	}}
	got, err = DecodeBatch(EncodeBatch(nil, over))
	if err != nil {
		t.Fatalf("a batch past the bounds does not decode: %v", err)
	}
	if got.Replica != long('r') || got.ChunkBytes != MaxChunkBytes || len(got.Events) != 6 ||
		len(got.Events[0].Hashes) != MaxHashes || got.Events[0].Model != long('m') ||
		len(got.Events[1].Loads) != MaxLoads || got.Events[2].Loads[0].N != MaxInFlight || got.Events[2].Loads[1].N != 0 ||
		got.Events[3].For != MaxFor || got.Events[4].For != 0 || got.Events[5].For != MaxStoredFor {
		t.Fatalf("a batch past the bounds was not clamped to them")
	}
}

// FuzzSyncEncodeDecode: whatever batch or snapshot the encoders are given,
// what they write decodes, and encodes again to the same bytes.
func FuzzSyncEncodeDecode(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x05\x01\x08\x03abc\xff\xff\xff\xff\xff\xff\xff\x7f\x04\x02\xff"))
	f.Add(bytes.Repeat([]byte{0xff}, 64))
	f.Add(bytes.Repeat([]byte{0x81, 0x03, 0xfe}, 40))
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &gen{b: data}
		b := g.batch()
		enc := EncodeBatch(nil, b)
		got, err := DecodeBatch(enc)
		if err != nil {
			t.Fatalf("EncodeBatch wrote what DecodeBatch refuses: %v", err)
		}
		if again := EncodeBatch(nil, got); !bytes.Equal(again, enc) {
			t.Fatalf("a decoded batch encodes differently")
		}
		replica, s := g.str(), g.snapshot()
		enc = EncodeSnapshot(nil, replica, s)
		id, gs, err := DecodeSnapshot(enc)
		if err != nil {
			t.Fatalf("EncodeSnapshot wrote what DecodeSnapshot refuses: %v", err)
		}
		if again := EncodeSnapshot(nil, id, gs); !bytes.Equal(again, enc) {
			t.Fatalf("a decoded snapshot encodes differently")
		}
		replica, rs := g.str(), g.records()
		enc = EncodeRecords(nil, replica, rs)
		id, grs, err := DecodeRecords(enc)
		if err != nil {
			t.Fatalf("EncodeRecords wrote what DecodeRecords refuses: %v", err)
		}
		if again := EncodeRecords(nil, id, grs); !bytes.Equal(again, enc) {
			t.Fatalf("decoded records encode differently")
		}
	})
}

// gen draws messages from fuzz bytes: values past every bound included
// (long strings, long lists, huge and negative numbers, unknown kinds).
type gen struct{ b []byte }

func (g *gen) byte() byte {
	if len(g.b) == 0 {
		return 0
	}
	c := g.b[0]
	g.b = g.b[1:]
	return c
}

func (g *gen) i64() int64 {
	var v uint64
	for range 8 {
		v = v<<8 | uint64(g.byte())
	}
	return int64(v)
}

// count is a list's length: mostly short, 0xff: one past limit.
func (g *gen) count(limit int) int {
	if c := g.byte(); c == 0xff {
		return limit + 1
	} else {
		return int(c % 5)
	}
}

func (g *gen) str() string {
	c := g.byte()
	if c >= 0xf0 {
		return string(bytes.Repeat([]byte{c}, MaxString+int(c&0x0f)))
	}
	return string(bytes.Repeat([]byte{'a' + c%26}, int(c%12)))
}

func (g *gen) hashes() []uint64 {
	hs := make([]uint64, g.count(MaxHashes))
	for i := range hs {
		hs[i] = uint64(i)
	}
	return hs
}

func (g *gen) loads() []router.WorkerLoad {
	ls := make([]router.WorkerLoad, g.count(MaxLoads))
	for i := range ls {
		ls[i] = router.WorkerLoad{Worker: "w", N: int(g.i64())}
	}
	return ls
}

func (g *gen) batch() *router.PeerBatch {
	b := &router.PeerBatch{Replica: g.str(), Sent: time.Unix(0, g.i64()), ChunkBytes: int(g.i64())}
	for range g.count(MaxEvents) % 16 {
		ev := router.PeerEvent{Kind: router.PeerEventKind(g.byte() % 10)}
		ev.Model, ev.Worker, ev.Reason, ev.ID, ev.Owner = g.str(), g.str(), g.str(), g.str(), g.str()
		ev.Hashes, ev.Loads, ev.For = g.hashes(), g.loads(), time.Duration(g.i64())
		b.Events = append(b.Events, ev)
	}
	if g.byte() == 0xff {
		for range MaxEvents + 1 {
			b.Events = append(b.Events, router.PeerEvent{Kind: router.PeerForget, ID: "x"})
		}
	}
	return b
}

func (g *gen) snapshot() *router.Snapshot {
	s := &router.Snapshot{ChunkBytes: int(g.i64()), InFlight: g.loads()}
	for range g.count(MaxLoads) % 4 {
		s.Index = append(s.Index, router.SnapshotEntry{Model: g.str(), Worker: g.str(), Hashes: g.hashes()})
		s.Ejections = append(s.Ejections, router.SnapshotEjection{Worker: g.str(), Model: g.str(), Reason: g.str(), For: time.Duration(g.i64())})
	}
	return s
}

func (g *gen) records() []router.StoredRecord {
	n := g.count(router.MaxSnapshotStored)
	if n > 16 {
		n = router.MaxSnapshotStored + 1
	}
	rs := make([]router.StoredRecord, n)
	for i := range rs {
		if i < 4 {
			rs[i] = router.StoredRecord{ID: g.str(), Owner: g.str(), Worker: g.str(), For: time.Duration(g.i64())}
		}
	}
	return rs
}

// TestDefaultIDIsASubjectToken: the default replica id is one NATS
// subject token, whatever the host name holds.
func TestDefaultIDIsASubjectToken(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:8080", "[::]:8080", "127.0.0.1:0", "nonsense"} {
		if id := DefaultID(addr); !ValidReplicaID(id) {
			t.Fatalf("DefaultID(%q) = %q: not a replica id", addr, id)
		}
	}
}

func TestKeysRoundTrip(t *testing.T) {
	sent := time.Unix(1_700_000_000, 123)
	ds := []KeyDemand{{Key: "team-a", PerMinute: 12.5}, {Key: "batch", PerMinute: 0.001}, {Key: "nan", PerMinute: math.NaN()}}
	b := EncodeKeys(nil, "gw-1", sent, ds)
	replica, at, got, err := DecodeKeys(b)
	if err != nil || replica != "gw-1" || !at.Equal(sent) {
		t.Fatalf("decode: %q %v %v", replica, at, err)
	}
	want := []KeyDemand{{Key: "team-a", PerMinute: 12.5}, {Key: "batch", PerMinute: 0.001}, {Key: "nan", PerMinute: 0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range [][]byte{
		nil,
		b[:len(b)-1],                  // truncated
		append(slices.Clone(b), 0),    // left over
		append([]byte{'B'}, b[1:]...), // another kind of message
		{magicKeys, version, 1, 'x', 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, // more keys than bytes
	} {
		if _, _, _, err := DecodeKeys(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("%x: %v, want malformed", bad, err)
		}
	}
}
