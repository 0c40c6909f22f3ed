package fleetsync

import (
	"errors"
	"reflect"
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
		{Kind: router.PeerStored, ID: "resp_0123456789abcdef", Worker: "a", For: time.Hour},
		{Kind: router.PeerForget, ID: "resp_fedcba9876543210"},
		{Kind: router.PeerIndex, Model: "smol-v3", Worker: "b", Hashes: []uint64{3, 4}},
	}}
}

func sampleSnapshot() *router.Snapshot {
	return &router.Snapshot{ChunkBytes: 128,
		Index:     []router.SnapshotEntry{{Model: "m", Worker: "a", Hashes: []uint64{7, 8}}, {Model: "m", Worker: "b", Hashes: []uint64{9}}},
		InFlight:  []router.WorkerLoad{{Worker: "a", N: 2}},
		Ejections: []router.SnapshotEjection{{Worker: "b", Model: "m", Reason: "reset", For: 1500 * time.Millisecond}},
		Stored:    []router.SnapshotStored{{ID: "resp_1", Worker: "a", For: 59 * time.Minute}, {ID: "resp_2", Worker: "b", For: 1234 * time.Millisecond}},
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
		{"no replica", EncodeBatch(nil, &router.PeerBatch{})},
		{"unknown kind", append(EncodeBatch(nil, &router.PeerBatch{Replica: "r"})[:len(EncodeBatch(nil, &router.PeerBatch{Replica: "r"}))-1], 1, 42)},
		{"a count longer than the message", lying},
		{"a stored response's time above the bound", EncodeBatch(nil, &router.PeerBatch{Replica: "r", Events: []router.PeerEvent{
			{Kind: router.PeerStored, ID: "resp_1", Worker: "a", For: MaxStoredFor + time.Millisecond}}})},
		{"a forget cut short", EncodeBatch(nil, &router.PeerBatch{Replica: "r", Events: []router.PeerEvent{
			{Kind: router.PeerForget, ID: "resp_1"}}})[:20]},
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
	f.Add([]byte("B\x01\x01r\x00\x00\x01\x01\x01m\x01a\xff\xff\x03"))
	f.Add([]byte("B\x01\x01r\x00\x00\x01\x05\x06resp_1\x01a\xff\xff\xff\xff\x0f"))                                                        // a stored ttl far above the bound
	f.Add(append(EncodeSnapshot(nil, "gw", &router.Snapshot{})[:len(EncodeSnapshot(nil, "gw", &router.Snapshot{}))-1], 0xff, 0xff, 0x03)) // a lying stored count
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
	})
}
