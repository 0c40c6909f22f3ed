package kvevents

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// SeqLen is the length of a sequence number frame: 8 bytes, big-endian.
const SeqLen = 8

// EndSeq is the sequence number of the replay socket's end marker (-1).
const EndSeq = ^uint64(0)

// ParseMessage reads one message of an engine's PUB socket: three frames,
// the topic, the batch's sequence number and the msgpack EventBatch. A
// message whose topic does not start with topic (ZMQ's prefix match) is
// refused.
func ParseMessage(frames [][]byte, topic string) (seq uint64, payload []byte, err error) {
	if len(frames) != 3 {
		return 0, nil, malformed("a message of %d frames, want [topic, seq, payload]", len(frames))
	}
	if !bytes.HasPrefix(frames[0], []byte(topic)) {
		return 0, nil, malformed("topic %q does not start with %q", clip(frames[0]), topic)
	}
	if len(frames[1]) != SeqLen {
		return 0, nil, malformed("a sequence number of %d bytes, want %d", len(frames[1]), SeqLen)
	}
	return binary.BigEndian.Uint64(frames[1]), frames[2], nil
}

// ReplayRequest is what a DEALER sends the replay (ROUTER) socket to ask
// for every buffered batch from sequence number from on: an empty
// delimiter frame, then from as 8 bytes big-endian.
func ReplayRequest(from uint64) [][]byte {
	b := make([]byte, SeqLen)
	binary.BigEndian.PutUint64(b, from)
	return [][]byte{{}, b}
}

// ParseReplay reads one answer of the replay socket as a DEALER receives
// it: an empty delimiter (optional), the sequence number and the batch;
// end is true for the end marker (sequence number -1).
func ParseReplay(frames [][]byte) (seq uint64, payload []byte, end bool, err error) {
	if len(frames) == 3 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	if len(frames) != 2 {
		return 0, nil, false, malformed("a replay answer of %d frames, want [\"\", seq, payload]", len(frames))
	}
	if len(frames[0]) != SeqLen {
		return 0, nil, false, malformed("a replay sequence number of %d bytes, want %d", len(frames[0]), SeqLen)
	}
	seq = binary.BigEndian.Uint64(frames[0])
	return seq, frames[1], seq == EndSeq, nil
}

// clip shortens b for an error message.
func clip(b []byte) string {
	if len(b) > 64 {
		return fmt.Sprintf("%s…", b[:64])
	}
	return string(b)
}
