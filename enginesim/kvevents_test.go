package enginesim

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/tlgate/tlgate/enginesim/kvevents"
	"github.com/tlgate/tlgate/enginesim/tokenizer"
)

// kvMsg is one message of the PUB socket.
type kvMsg struct {
	topic   string
	seq     int64
	payload []byte
}

// kvSub is a SUB socket connected to an engine's KV events.
type kvSub struct {
	sock zmq4.Socket
	msgs chan kvMsg
}

// subscribe connects a subscriber to e's KV events and returns once the
// engine's PUB socket knows of it (batches sent before are lost to a
// subscriber, as on any PUB socket).
func subscribe(t testing.TB, e *Engine, topic string) *kvSub {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &kvSub{sock: zmq4.NewSub(ctx), msgs: make(chan kvMsg, 4096)}
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		s.sock.Close()
		<-done
	})
	if err := s.sock.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		t.Fatal(err)
	}
	if err := s.sock.Dial(e.KVEventsAddr()); err != nil {
		t.Fatalf("dial %s: %v", e.KVEventsAddr(), err)
	}
	go func() {
		defer close(done)
		for {
			m, err := s.sock.Recv()
			if err != nil {
				return
			}
			if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
				t.Errorf("KV event message of %d frames, want [topic, 8-byte seq, payload]", len(m.Frames))
				continue
			}
			s.msgs <- kvMsg{string(m.Frames[0]), int64(binary.BigEndian.Uint64(m.Frames[1])), m.Frames[2]}
		}
	}()
	waitFor(t, "the subscription", func() bool { return e.kvpub.Subscribed(topic) })
	return s
}

// next returns the next message, failing after a long wait: the engine
// publishes a batch as soon as the request that caused it is answered.
func (s *kvSub) next(t testing.TB) kvMsg {
	t.Helper()
	select {
	case m := <-s.msgs:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no KV event batch")
		return kvMsg{}
	}
}

// waitFor polls cond until it holds, failing after a long wait.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Field order of the events, as vLLM's msgspec structs declare them.
var eventFields = map[string][]string{
	"BlockStored": {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
		"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"},
	"BlockRemoved":     {"block_hashes", "medium", "group_idx"},
	"AllBlocksCleared": {},
}

// wireEvent is a decoded event: its type, its fields by name and, for a
// map, the keys in the order sent.
type wireEvent struct {
	typ    string
	fields map[string]any
	keys   []string
	array  bool
}

// decodeBatch decodes an EventBatch as a subscriber that tolerates both
// encodings would, checking the batch is [ts, events, data_parallel_rank].
func decodeBatch(t testing.TB, payload []byte) (ts float64, events []wireEvent) {
	t.Helper()
	dec := msgpack.NewDecoder(bytes.NewReader(payload))
	n, err := dec.DecodeArrayLen()
	if err != nil || n != 3 {
		t.Fatalf("batch is not a 3-element array: %d, %v", n, err)
	}
	if ts, err = dec.DecodeFloat64(); err != nil {
		t.Fatalf("batch ts: %v", err)
	}
	ne, err := dec.DecodeArrayLen()
	if err != nil {
		t.Fatalf("batch events: %v", err)
	}
	for range ne {
		events = append(events, decodeEvent(t, dec))
	}
	if rank, err := dec.DecodeInt(); err != nil || rank != 0 {
		t.Fatalf("data_parallel_rank %d, %v", rank, err)
	}
	return ts, events
}

func decodeEvent(t testing.TB, dec *msgpack.Decoder) wireEvent {
	t.Helper()
	code, err := dec.PeekCode()
	if err != nil {
		t.Fatal(err)
	}
	ev := wireEvent{fields: map[string]any{}}
	if msgpcode.IsFixedArray(code) || code == msgpcode.Array16 || code == msgpcode.Array32 {
		n, err := dec.DecodeArrayLen()
		if err != nil {
			t.Fatal(err)
		}
		ev.array = true
		if ev.typ, err = dec.DecodeString(); err != nil {
			t.Fatalf("array event tag: %v", err)
		}
		names := eventFields[ev.typ]
		if n-1 != len(names) {
			t.Fatalf("%s has %d positional fields, want %d", ev.typ, n-1, len(names))
		}
		for _, name := range names {
			if ev.fields[name], err = dec.DecodeInterface(); err != nil {
				t.Fatal(err)
			}
		}
		return ev
	}
	n, err := dec.DecodeMapLen()
	if err != nil {
		t.Fatalf("event is neither an array nor a map (code %#x): %v", code, err)
	}
	for range n {
		k, err := dec.DecodeString()
		if err != nil {
			t.Fatal(err)
		}
		v, err := dec.DecodeInterface()
		if err != nil {
			t.Fatal(err)
		}
		ev.keys = append(ev.keys, k)
		if k == "type" {
			ev.typ = v.(string)
			continue
		}
		ev.fields[k] = v
	}
	return ev
}

// hashKey reads a block hash in either format as the pool's key: an
// integer is the key, 32 bytes are the digest whose low 64 bits are.
func hashKey(t testing.TB, v any) uint64 {
	t.Helper()
	if n, ok := wireInt(v); ok {
		return n
	}
	switch h := v.(type) {
	case []byte:
		if len(h) != 32 {
			t.Fatalf("hash of %d bytes", len(h))
		}
		return binary.BigEndian.Uint64(h[24:])
	}
	t.Fatalf("hash %T %v", v, v)
	return 0
}

func hashKeys(t testing.TB, v any) []uint64 {
	t.Helper()
	var out []uint64
	for _, h := range v.([]any) {
		out = append(out, hashKey(t, h))
	}
	return out
}

func asInts(t testing.TB, v any) []uint32 {
	t.Helper()
	var out []uint32
	for _, x := range v.([]any) {
		n, ok := wireInt(x)
		if !ok {
			t.Fatalf("token %T", x)
		}
		out = append(out, uint32(n))
	}
	return out
}

// wireInt reads a msgpack integer of any width.
func wireInt(v any) (uint64, bool) {
	rv := reflect.ValueOf(v)
	switch {
	case rv.CanUint():
		return rv.Uint(), true
	case rv.CanInt():
		return uint64(rv.Int()), true
	}
	return 0, false
}

// words returns a prompt of n distinct space-words from offset.
func words(offset, n int) []uint32 {
	sw := tokenizer.Default().SpaceWords()
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = sw[(offset+i)%len(sw)]
	}
	return ids
}

func kvEngine(t testing.TB, enc kvevents.Encoding, hashes kvevents.HashFormat, cfg Config) *Engine {
	cfg.Model = "m"
	cfg.KVEvents.Endpoint = "tcp://127.0.0.1:0"
	cfg.KVEvents.Topic = "kv@m"
	cfg.KVEvents.Encoder = kvevents.Encoder{Encoding: enc, Hashes: hashes}
	return startEngine(t, cfg)
}

// kvScenario runs requests that store, extend, evict and clear blocks
// on a 4-block engine and returns each batch's events in order, checking
// the frames on the way.
func kvScenario(t *testing.T, e *Engine) [][]wireEvent {
	sub := subscribe(t, e, "kv@m")
	c := newClient(t)
	var out [][]wireEvent
	wantSeq := int64(0)
	batch := func(what string) {
		t.Helper()
		m := sub.next(t)
		if m.topic != "kv@m" || m.seq != wantSeq {
			t.Fatalf("%s: topic %q seq %d, want kv@m %d", what, m.topic, m.seq, wantSeq)
		}
		wantSeq++
		ts, events := decodeBatch(t, m.payload)
		if now := float64(time.Now().UnixNano()) / 1e9; ts < now-60 || ts > now+1 {
			t.Fatalf("%s: batch ts %v, now %v", what, ts, now)
		}
		out = append(out, events)
	}
	run := func(model string, prompt []uint32, extra map[string]any) {
		t.Helper()
		body := map[string]any{"model": model, "prompt": prompt, "max_tokens": 1}
		for k, v := range extra {
			body[k] = v
		}
		complete(t, c, e.URL(), false, body)
	}
	// 1: two full blocks (and a partial one), salted: one BlockStored.
	run("m", words(0, 40), map[string]any{"cache_salt": "tenant-a"})
	batch("salted prompt")
	// 2: the same first block plus one more, on the adapter: new chain.
	run("sql", words(0, 33), nil)
	batch("adapter prompt")
	// 3: a prompt that shares the salted chain's first block: extends it
	// with one block (parent set), evicting one.
	run("m", append(words(0, 16), words(500, 17)...), map[string]any{"cache_salt": "tenant-a"})
	batch("extension")
	// 4: idle now; reset the cache.
	if r := post(t, c, e.URL()+"/reset_prefix_cache", map[string]any{}); r.status != http.StatusOK {
		t.Fatalf("reset: %d %s", r.status, r.body)
	}
	batch("reset")
	return out
}

// checkScenario checks the events of kvScenario, in either encoding.
func checkScenario(t *testing.T, e *Engine, batches [][]wireEvent, bytesHashes bool) {
	h := e.hash
	salted := h.blocks(words(0, 40), "", "tenant-a")
	lora := h.blocks(words(0, 33), "sql", "")
	ext := h.blocks(append(words(0, 16), words(500, 17)...), "", "tenant-a")
	keysOf := func(bs []*kvBlock) []uint64 {
		var out []uint64
		for _, b := range bs {
			out = append(out, b.key)
		}
		return out
	}
	stored := func(ev wireEvent, blocks []*kvBlock, parent *kvBlock, loraName any, extra []any) {
		t.Helper()
		f := ev.fields
		if ev.typ != "BlockStored" {
			t.Fatalf("%s, want BlockStored", ev.typ)
		}
		if got := hashKeys(t, f["block_hashes"]); !slices.Equal(got, keysOf(blocks)) {
			t.Fatalf("block_hashes %v, want %v", got, keysOf(blocks))
		}
		if bytesHashes {
			if b := f["block_hashes"].([]any)[0].([]byte); !bytes.Equal(b, blocks[0].hash[:]) {
				t.Fatalf("hash bytes %x, want the digest %x", b, blocks[0].hash)
			}
		}
		switch {
		case parent == nil && f["parent_block_hash"] != nil:
			t.Fatalf("parent_block_hash %v, want nil", f["parent_block_hash"])
		case parent != nil && (f["parent_block_hash"] == nil || hashKey(t, f["parent_block_hash"]) != parent.key):
			t.Fatalf("parent_block_hash %v, want %d", f["parent_block_hash"], parent.key)
		}
		var tokens []uint32
		for _, b := range blocks {
			tokens = append(tokens, b.tokens...)
		}
		if got := asInts(t, f["token_ids"]); !slices.Equal(got, tokens) {
			t.Fatalf("token_ids %v, want %v", got, tokens)
		}
		if bs, _ := wireInt(f["block_size"]); bs != BlockTokens || f["lora_id"] != nil || f["medium"] != "GPU" ||
			f["lora_name"] != loraName || f["group_idx"] != int8(0) || f["kv_cache_spec_kind"] != "full_attention" {
			t.Fatalf("fields %v", f)
		}
		if got := fmt.Sprint(f["extra_keys"]); got != fmt.Sprint(extra) {
			t.Fatalf("extra_keys %s, want %s", got, fmt.Sprint(extra))
		}
	}
	removed := func(ev wireEvent, b *kvBlock) {
		t.Helper()
		if ev.typ != "BlockRemoved" || !slices.Equal(hashKeys(t, ev.fields["block_hashes"]), []uint64{b.key}) ||
			ev.fields["medium"] != "GPU" || ev.fields["group_idx"] != int8(0) {
			t.Fatalf("%s %v, want BlockRemoved of %d", ev.typ, ev.fields, b.key)
		}
	}
	if len(batches) != 4 {
		t.Fatalf("%d batches", len(batches))
	}
	// 1: salted chain stored.
	if len(batches[0]) != 1 {
		t.Fatalf("batch 1: %d events", len(batches[0]))
	}
	stored(batches[0][0], salted, nil, nil, []any{[]any{"tenant-a"}, nil})
	// 2: 4 blocks: 2 cached idle, 1 partial tail and 1 for the token
	// were free. The adapter's 2 full blocks and 1 partial need 3: one
	// eviction, the salted chain's tail first (vLLM frees tails first).
	if len(batches[1]) != 2 {
		t.Fatalf("batch 2: %d events", len(batches[1]))
	}
	removed(batches[1][0], salted[1])
	stored(batches[1][1], lora, nil, "sql", []any{[]any{"sql"}, []any{"sql"}})
	// 3: shares the salted first block (a hit), stores its second block
	// under it; a third block for the tail needs another eviction: the
	// adapter chain's tail.
	if len(batches[2]) != 2 {
		t.Fatalf("batch 3: %d events", len(batches[2]))
	}
	removed(batches[2][0], lora[1])
	stored(batches[2][1], ext[1:], ext[0], nil, []any{nil})
	if ext[0].key != salted[0].key {
		t.Fatal("the extension does not share the salted first block")
	}
	// 4: cleared.
	if len(batches[3]) != 1 || batches[3][0].typ != "AllBlocksCleared" || len(batches[3][0].fields) != 0 {
		t.Fatalf("batch 4: %+v", batches[3])
	}
}

// TestKVEventsArrayEncoding checks the tagged positional arrays of older
// vLLM and SGLang, with integer hashes: ["BlockStored", block_hashes,
// parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
// extra_keys, group_idx, kv_cache_spec_kind], ["BlockRemoved",
// block_hashes, medium, group_idx], ["AllBlocksCleared"], each batch
// [ts, events, data_parallel_rank] under [topic, seq, payload].
func TestKVEventsArrayEncoding(t *testing.T) {
	e := kvEngine(t, kvevents.EncodingArray, kvevents.HashInt, Config{KVBlocks: 4, Adapters: []string{"sql"}})
	batches := kvScenario(t, e)
	for _, b := range batches {
		for _, ev := range b {
			if !ev.array {
				t.Fatalf("%s is not an array", ev.typ)
			}
			hs, _ := ev.fields["block_hashes"].([]any)
			for _, h := range hs {
				if _, ok := h.([]byte); ok {
					t.Fatal("a hash sent as bytes, want an integer")
				}
			}
		}
	}
	checkScenario(t, e, batches, false)
}

// TestKVEventsMapEncoding checks vLLM's maps with a "type" key (fields in
// the declaration order) with byte-string hashes (the 32-byte digest).
func TestKVEventsMapEncoding(t *testing.T) {
	e := kvEngine(t, kvevents.EncodingMap, kvevents.HashBytes, Config{KVBlocks: 4, Adapters: []string{"sql"}})
	batches := kvScenario(t, e)
	for _, b := range batches {
		for _, ev := range b {
			if ev.array {
				t.Fatalf("%s is an array", ev.typ)
			}
			if want := append([]string{"type"}, eventFields[ev.typ]...); !slices.Equal(ev.keys, want) {
				t.Fatalf("%s keys %v, want %v", ev.typ, ev.keys, want)
			}
		}
	}
	checkScenario(t, e, batches, true)
}

// replayClient asks a replay socket for the batches from start and
// returns them, up to the end marker.
func replayClient(t testing.TB, addr string) func(frames ...[]byte) []kvMsg {
	ctx, cancel := context.WithCancel(context.Background())
	d := zmq4.NewDealer(ctx)
	t.Cleanup(func() {
		cancel()
		d.Close()
	})
	if err := d.Dial(addr); err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	return func(frames ...[]byte) []kvMsg {
		t.Helper()
		if err := d.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
			t.Fatal(err)
		}
		var out []kvMsg
		for {
			m, err := d.Recv()
			if err != nil {
				t.Fatalf("replay: %v", err)
			}
			if len(m.Frames) != 3 || len(m.Frames[0]) != 0 || len(m.Frames[1]) != 8 {
				t.Fatalf("replay answer of %d frames, want [\"\", seq, payload]", len(m.Frames))
			}
			seq := int64(binary.BigEndian.Uint64(m.Frames[1]))
			if seq == -1 {
				if len(m.Frames[2]) != 0 {
					t.Fatal("end marker with a payload")
				}
				return out
			}
			out = append(out, kvMsg{seq: seq, payload: m.Frames[2]})
		}
	}
}

func seqStart(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

// TestKVEventsReplay checks the ROUTER replay socket: a start sequence is
// answered with every buffered batch from it (the payloads the PUB socket
// sent), then the end marker -1; the buffer keeps BufferSteps batches; a
// malformed request is ignored.
func TestKVEventsReplay(t *testing.T) {
	cfg := Config{KVBlocks: 64}
	cfg.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:0"
	cfg.KVEvents.BufferSteps = 4
	e := kvEngine(t, kvevents.EncodingMap, kvevents.HashInt, cfg)
	sub := subscribe(t, e, "kv@m")
	c := newClient(t)
	var sent []kvMsg
	for i := range 6 { // a new chain each: one batch each
		complete(t, c, e.URL(), false, map[string]any{"model": "m", "prompt": words(40*i, 20), "max_tokens": 1})
		m := sub.next(t)
		if m.seq != int64(i) {
			t.Fatalf("batch %d has seq %d", i, m.seq)
		}
		sent = append(sent, m)
	}
	replay := replayClient(t, e.KVEventsReplayAddr())
	check := func(start uint64, want []kvMsg) {
		t.Helper()
		got := replay(nil, seqStart(start))
		if len(got) != len(want) {
			t.Fatalf("replay from %d: %d batches, want %d", start, len(got), len(want))
		}
		for i := range got {
			if got[i].seq != want[i].seq || !bytes.Equal(got[i].payload, want[i].payload) {
				t.Fatalf("replay from %d: batch %d is seq %d, want %d with the payload sent", start, i, got[i].seq, want[i].seq)
			}
		}
	}
	check(3, sent[3:])
	check(0, sent[2:]) // the buffer holds the last 4
	check(6, nil)
	check(1<<63, nil)
	// A request of the wrong shape is ignored; the socket still serves.
	d := replayClient(t, e.KVEventsReplayAddr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bad := zmq4.NewDealer(ctx)
	defer bad.Close()
	if err := bad.Dial(e.KVEventsReplayAddr()); err != nil {
		t.Fatal(err)
	}
	if err := bad.Send(zmq4.NewMsg(seqStart(0))); err != nil {
		t.Fatal(err)
	}
	if got := d(nil, seqStart(5)); len(got) != 1 || got[0].seq != 5 {
		t.Fatalf("after a malformed request: %d batches", len(got))
	}
	// Sent counts a batch once its send returns, which may be after the
	// subscriber has read it.
	waitFor(t, "the sixth batch counted sent", func() bool { return e.kvpub.Stats().Sent == 6 })
	if st := e.kvpub.Stats(); st.Replays != 5 || st.Published != 6 || st.Sent != 6 {
		t.Fatalf("stats %+v", st)
	}
}

// TestKVEventsMatchCacheState runs random requests (shared prefixes,
// salts, an adapter, concurrency, evictions, resets) and checks that the
// blocks stored minus those removed, applied in sequence order, are
// exactly the engine's prefix cache; each event is consistent with the
// view before it (never a stored hash stored again, never an unknown one
// removed).
func TestKVEventsMatchCacheState(t *testing.T) {
	for _, enc := range []kvevents.Encoding{kvevents.EncodingArray, kvevents.EncodingMap} {
		t.Run(enc.String(), func(t *testing.T) {
			e := kvEngine(t, enc, kvevents.HashInt, Config{KVBlocks: 24, Adapters: []string{"sql"}})
			sub := subscribe(t, e, "kv@m")
			c := newClient(t)
			rng := rand.New(rand.NewPCG(42, uint64(enc)))
			view := map[uint64]bool{}
			applied := int64(0)
			apply := func() {
				t.Helper()
				waitFor(t, "the batches sent", func() bool { return e.kvpub.Stats().Queued == 0 })
				last := e.kvpub.Stats().NextSeq
				for applied < last {
					m := sub.next(t)
					if m.seq != applied {
						t.Fatalf("seq %d, want %d", m.seq, applied)
					}
					applied++
					_, events := decodeBatch(t, m.payload)
					for _, ev := range events {
						switch ev.typ {
						case "BlockStored":
							for _, k := range hashKeys(t, ev.fields["block_hashes"]) {
								if view[k] {
									t.Fatalf("seq %d stores %d again", m.seq, k)
								}
								view[k] = true
							}
						case "BlockRemoved":
							for _, k := range hashKeys(t, ev.fields["block_hashes"]) {
								if !view[k] {
									t.Fatalf("seq %d removes %d, not stored", m.seq, k)
								}
								delete(view, k)
							}
						case "AllBlocksCleared":
							clear(view)
						default:
							t.Fatalf("event %q", ev.typ)
						}
					}
				}
				keys := e.core.cachedKeys()
				slices.Sort(keys)
				var got []uint64
				for k := range view {
					got = append(got, k)
				}
				slices.Sort(got)
				if !slices.Equal(got, keys) {
					t.Fatalf("after seq %d: events say %d blocks %v, the cache holds %d %v", applied-1, len(got), got, len(keys), keys)
				}
			}
			prefixes := [][]uint32{words(0, 48), words(100, 32), words(200, 64)}
			for round := range 12 {
				var wg sync.WaitGroup
				for range 1 + rng.IntN(4) {
					p := prefixes[rng.IntN(len(prefixes))]
					prompt := slices.Clone(p[:min(len(p), 16*(1+rng.IntN(3)))])
					prompt = append(prompt, words(300+rng.IntN(400), rng.IntN(40))...)
					body := map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1 + rng.IntN(20)}
					if rng.IntN(4) == 0 {
						body["cache_salt"] = fmt.Sprint("tenant-", rng.IntN(2))
					}
					if rng.IntN(4) == 0 {
						body["model"] = "sql"
					}
					wg.Go(func() {
						r, err := tryPost(c, e.URL()+"/v1/completions", body)
						if err != nil || r.status != http.StatusOK {
							t.Errorf("completion: %v %d %s", err, r.status, r.body)
						}
					})
				}
				wg.Wait()
				if round == 7 {
					if r := post(t, c, e.URL()+"/reset_prefix_cache", map[string]any{}); r.status != http.StatusOK {
						t.Fatalf("reset: %d %s", r.status, r.body)
					}
				}
				apply()
			}
			if applied < 10 || e.Stats().PrefixHits == 0 {
				t.Fatalf("only %d batches, %d prefix hits: the scenario does not exercise the cache", applied, e.Stats().PrefixHits)
			}
		})
	}
}

// TestKVEventsFaults checks the KV event faults: dropped batches keep
// their numbers (a gap) and replay fills it; a refused replay answers only
// the end marker; delayed batches come in order; a sequence restart
// numbers the next batch 0 and empties the replay buffer.
func TestKVEventsFaults(t *testing.T) {
	cfg := Config{KVBlocks: 256}
	cfg.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:0"
	e := kvEngine(t, kvevents.EncodingMap, kvevents.HashInt, cfg)
	sub := subscribe(t, e, "kv@m")
	replay := replayClient(t, e.KVEventsReplayAddr())
	c := newClient(t)
	n := 0
	request := func() {
		t.Helper()
		complete(t, c, e.URL(), false, map[string]any{"model": "m", "prompt": words(40*n, 20), "max_tokens": 1})
		n++
	}
	set := func(f Faults) {
		t.Helper()
		if err := e.SetFaults(f); err != nil {
			t.Fatal(err)
		}
	}
	request()
	if m := sub.next(t); m.seq != 0 {
		t.Fatalf("seq %d", m.seq)
	}
	set(Faults{KVEventsDrop: true})
	request()
	request()
	waitFor(t, "the dropped batches", func() bool { st := e.kvpub.Stats(); return st.Dropped == 2 && st.Queued == 0 })
	set(Faults{})
	request()
	if m := sub.next(t); m.seq != 3 {
		t.Fatalf("after two dropped batches, seq %d, want 3 (a gap)", m.seq)
	}
	if got := replay(nil, seqStart(1)); len(got) != 3 || got[0].seq != 1 || got[1].seq != 2 {
		t.Fatalf("replay of the gap: %d batches", len(got))
	}
	set(Faults{KVEventsRefuseReplay: true})
	if got := replay(nil, seqStart(0)); len(got) != 0 {
		t.Fatalf("a refused replay sent %d batches", len(got))
	}
	set(Faults{KVEventsDelayMS: 20})
	request()
	request()
	for want := int64(4); want <= 5; want++ {
		if m := sub.next(t); m.seq != want {
			t.Fatalf("delayed batch seq %d, want %d", m.seq, want)
		}
	}
	set(Faults{KVEventsRestartSeq: true})
	request()
	if m := sub.next(t); m.seq != 0 {
		t.Fatalf("after a restart, seq %d, want 0", m.seq)
	}
	if got := replay(nil, seqStart(0)); len(got) != 1 || got[0].seq != 0 {
		t.Fatalf("after a restart the replay buffer holds %d batches, want the one since", len(got))
	}
	set(Faults{})
	set(Faults{KVEventsRestartSeq: true}) // off and on again: another restart
	request()
	if m := sub.next(t); m.seq != 0 {
		t.Fatalf("after a second restart, seq %d, want 0", m.seq)
	}
}
