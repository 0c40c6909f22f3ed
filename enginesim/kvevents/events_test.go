package kvevents

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// TestEncodeBatchGolden pins the bytes of small batches in both encodings.
func TestEncodeBatchGolden(t *testing.T) {
	var h Hash
	h[31] = 7
	ts := time.Unix(2, 500_000_000)
	for _, tc := range []struct {
		name string
		enc  Encoder
		ev   []Event
		want []byte
	}{
		{"array cleared", Encoder{Encoding: EncodingArray}, []Event{&AllBlocksCleared{}},
			// [2.5, [["AllBlocksCleared"]], 0]
			append(append([]byte{0x93, 0xcb, 0x40, 0x04, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xb0}, "AllBlocksCleared"...), 0x00)},
		{"map cleared", Encoder{Encoding: EncodingMap}, []Event{&AllBlocksCleared{}},
			// [2.5, [{"type": "AllBlocksCleared"}], 0]
			append(append(append([]byte{0x93, 0xcb, 0x40, 0x04, 0, 0, 0, 0, 0, 0, 0x91, 0x81, 0xa4}, "type"...), append([]byte{0xb0}, "AllBlocksCleared"...)...), 0x00)},
		{"array removed, int hash", Encoder{Encoding: EncodingArray}, []Event{&BlockRemoved{BlockHashes: []Hash{h}, Medium: MediumGPU}},
			// [2.5, [["BlockRemoved", [7], "GPU", 0]], 0]
			append(append(append([]byte{0x93, 0xcb, 0x40, 0x04, 0, 0, 0, 0, 0, 0, 0x91, 0x94, 0xac}, "BlockRemoved"...), append([]byte{0x91, 0x07, 0xa3}, "GPU"...)...), 0x00, 0x00)},
		{"array removed, bytes hash", Encoder{Encoding: EncodingArray, Hashes: HashBytes}, []Event{&BlockRemoved{BlockHashes: []Hash{h}}},
			// [2.5, [["BlockRemoved", [bin(32)], nil, 0]], 0]
			append(append(append([]byte{0x93, 0xcb, 0x40, 0x04, 0, 0, 0, 0, 0, 0, 0x91, 0x94, 0xac}, "BlockRemoved"...), append([]byte{0x91, 0xc4, 0x20}, h[:]...)...), 0xc0, 0x00, 0x00)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.enc.EncodeBatch(ts, tc.ev, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("got  %x\nwant %x", got, tc.want)
			}
		})
	}
}

func TestHashUint64IsLow64BitsBigEndian(t *testing.T) {
	var h Hash
	for i := range h {
		h[i] = byte(i)
	}
	if got, want := h.Uint64(), binary.BigEndian.Uint64(h[24:]); got != want || got != 0x18191a1b1c1d1e1f {
		t.Fatalf("Uint64 %#x", got)
	}
}

func TestParseOptions(t *testing.T) {
	if e, err := ParseEncoding("array"); err != nil || e != EncodingArray || e.String() != "array" {
		t.Fatal("array")
	}
	if e, err := ParseEncoding("map"); err != nil || e != EncodingMap || e.String() != "map" {
		t.Fatal("map")
	}
	if _, err := ParseEncoding("json"); err == nil {
		t.Fatal("json accepted")
	}
	if f, err := ParseHashFormat("bytes"); err != nil || f != HashBytes || f.String() != "bytes" {
		t.Fatal("bytes")
	}
	if f, err := ParseHashFormat("int"); err != nil || f != HashInt || f.String() != "int" {
		t.Fatal("int")
	}
	if _, err := ParseHashFormat("hex"); err == nil {
		t.Fatal("hex accepted")
	}
}

func TestParseReplayRequest(t *testing.T) {
	seq := binary.BigEndian.AppendUint64(nil, 42)
	for _, tc := range []struct {
		name   string
		frames [][]byte
		ok     bool
	}{
		{"valid", [][]byte{[]byte("id"), {}, seq}, true},
		{"no delimiter", [][]byte{[]byte("id"), seq}, false},
		{"non-empty delimiter", [][]byte{[]byte("id"), {1}, seq}, false},
		{"short sequence", [][]byte{[]byte("id"), {}, seq[:7]}, false},
		{"extra frame", [][]byte{[]byte("id"), {}, seq, {}}, false},
	} {
		start, ok := ParseReplayRequest(tc.frames)
		if ok != tc.ok || ok && start != 42 {
			t.Errorf("%s: %d %v", tc.name, start, ok)
		}
	}
}

func FuzzParseReplayRequest(f *testing.F) {
	f.Add([]byte("id"), []byte{}, binary.BigEndian.AppendUint64(nil, 7), 3)
	f.Add([]byte{}, []byte{0}, []byte{1, 2}, 2)
	f.Fuzz(func(t *testing.T, id, delim, seq []byte, n int) {
		frames := [][]byte{id, delim, seq}
		if n >= 0 && n < len(frames) {
			frames = frames[:n]
		}
		start, ok := ParseReplayRequest(frames)
		if ok != (len(frames) == 3 && len(delim) == 0 && len(seq) == 8) {
			t.Fatalf("ok %v for %d frames, delimiter %d bytes, sequence %d bytes", ok, len(frames), len(delim), len(seq))
		}
		if ok && start != binary.BigEndian.Uint64(seq) {
			t.Fatalf("start %d", start)
		}
	})
}
