// Package kvevents decodes the KV cache events vLLM and SGLang publish over
// ZMQ (vLLM's vllm/distributed/kv_events.py, SGLang's
// sglang/srt/disaggregation/kv_events.py): the three frames of a published
// message, the replay socket's request and answers, and the msgpack
// EventBatch in both encodings engines have shipped.
//
// A batch is always positional, [ts, events, data_parallel_rank] (older
// vLLM and SGLang send no rank; a map with those keys is read too). Each
// event is either a tagged positional array, as older vLLM and SGLang send
// it:
//
//	["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//	 lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
//	 kv_cache_spec_sliding_window]
//	["BlockRemoved", block_hashes, medium, group_idx]
//	["AllBlocksCleared"]
//
// (SGLang puts a metadata map with cache_salt where vLLM has lora_name), or
// a map with a "type" key and the same fields by name, as vLLM sends since
// mid-2026. Trailing fields may be missing (msgspec omits defaults), extra
// trailing elements and unknown keys are skipped, block hashes may be
// unsigned or signed 64-bit integers or byte strings, and events of unknown
// types are counted and skipped. Whatever the bytes, decoding is bounded by
// Limits and never recurses deeper than MaxDepth.
//
// The decoder is written from the publishers' source, not from the
// reference engine's encoder, so that tests against the reference engine
// check wire compatibility.
package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/tlgate/tlgate/internal/routing/kvindex"
)

// Errors of Decode; each is wrapped with what was wrong and where.
var (
	// ErrMalformed: the payload is not an EventBatch.
	ErrMalformed = errors.New("kvevents: malformed batch")
	// ErrTooLarge: the payload is beyond Limits.
	ErrTooLarge = errors.New("kvevents: batch over limits")
)

// MaxDepth bounds the nesting of what the decoder reads or skips.
const MaxDepth = 8

// Limits bound what one batch may hold.
type Limits struct {
	// MaxEvents per batch, MaxBlocks and MaxTokens per event, MaxExtra
	// extra keys per block.
	MaxEvents, MaxBlocks, MaxTokens, MaxExtra int
}

// DefaultLimits are generous for any engine: a batch is one engine step's
// events.
func DefaultLimits() Limits {
	return Limits{MaxEvents: 1 << 16, MaxBlocks: 1 << 16, MaxTokens: 1 << 20, MaxExtra: 64}
}

// Decoder decodes batches, reusing its scratch between them. It is not
// safe for concurrent use.
type Decoder struct {
	lim Limits
	r   bytes.Reader
	d   *msgpack.Decoder
	sub bytes.Reader
	sd  *msgpack.Decoder
}

// NewDecoder returns a decoder with limits lim (zero fields take
// DefaultLimits').
func NewDecoder(lim Limits) *Decoder {
	def := DefaultLimits()
	if lim.MaxEvents <= 0 {
		lim.MaxEvents = def.MaxEvents
	}
	if lim.MaxBlocks <= 0 {
		lim.MaxBlocks = def.MaxBlocks
	}
	if lim.MaxTokens <= 0 {
		lim.MaxTokens = def.MaxTokens
	}
	if lim.MaxExtra <= 0 {
		lim.MaxExtra = def.MaxExtra
	}
	x := &Decoder{lim: lim}
	x.d = msgpack.NewDecoder(&x.r)
	x.sd = msgpack.NewDecoder(&x.sub)
	return x
}

// Decode decodes one EventBatch with the default limits.
func Decode(payload []byte) (kvindex.Batch, error) {
	return NewDecoder(Limits{}).Decode(payload)
}

// Decode decodes one EventBatch. The batch's slices are its own (nothing
// refers to payload).
func (x *Decoder) Decode(payload []byte) (kvindex.Batch, error) {
	x.r.Reset(payload)
	x.d.Reset(&x.r)
	p := parser{x: x, d: x.d, src: payload, r: &x.r}
	b, err := p.batch()
	if err != nil {
		return kvindex.Batch{}, err
	}
	return b, nil
}

// parser reads one msgpack value tree from src through d.
type parser struct {
	x   *Decoder
	d   *msgpack.Decoder
	src []byte
	r   *bytes.Reader
}

func (p *parser) pos() int { return len(p.src) - p.r.Len() }

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

func tooLarge(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrTooLarge, fmt.Sprintf(format, args...))
}

// bad reports err, met reading what: a truncated payload says so.
func (p *parser) bad(what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return malformed("truncated at byte %d (%s)", p.pos(), what)
	}
	return malformed("%s: %v", what, err)
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || c >= msgpcode.Uint8 && c <= msgpcode.Int64
}

func (p *parser) peek() (byte, error) {
	c, err := p.d.PeekCode()
	if err != nil {
		return 0, malformed("truncated at byte %d", p.pos())
	}
	return c, nil
}

// next peeks at the next value's code; a nil is read and reported.
func (p *parser) next() (c byte, null bool, err error) {
	if c, err = p.peek(); err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil {
		_ = p.d.DecodeNil()
		return c, true, nil
	}
	return c, false, nil
}

// skip skips one value, nested at most MaxDepth-depth deep.
func (p *parser) skip(depth int) error {
	c, err := p.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c), isMap(c):
		if depth >= MaxDepth {
			return malformed("nested deeper than %d at byte %d", MaxDepth, p.pos())
		}
		var n int
		if isArray(c) {
			n, err = p.d.DecodeArrayLen()
		} else {
			n, err = p.d.DecodeMapLen()
			n *= 2
		}
		if err != nil {
			return p.bad("byte "+strconv.Itoa(p.pos()), err)
		}
		for range n {
			if err := p.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	if err := p.d.Skip(); err != nil {
		return p.bad("byte "+strconv.Itoa(p.pos()), err)
	}
	return nil
}

// arrayLen reads an array header (nil reads as -1).
func (p *parser) arrayLen(what string) (int, error) {
	c, null, err := p.next()
	if err != nil {
		return 0, err
	}
	if null {
		return -1, nil
	}
	if !isArray(c) {
		return 0, malformed("%s is not an array (code 0x%02x)", what, c)
	}
	n, err := p.d.DecodeArrayLen()
	if err != nil {
		return 0, p.bad(what, err)
	}
	return n, nil
}

// MaxString bounds the strings the decoder reads (names, tags, salts,
// extra keys).
const MaxString = 1 << 16

// readBytes reads a string or bin value's bytes after checking its length
// against what is left of the payload and max (msgpack's own readers
// allocate whatever length a header claims).
func (p *parser) readBytes(what string, max int) ([]byte, error) {
	n, err := p.d.DecodeBytesLen()
	if err != nil {
		return nil, p.bad(what, err)
	}
	switch {
	case n < 0:
		return nil, nil
	case n > p.r.Len():
		return nil, malformed("truncated at byte %d (%s of %d bytes)", p.pos(), what, n)
	case n > max:
		return nil, tooLarge("%s of %d bytes, at most %d", what, n, max)
	}
	b := make([]byte, n)
	if err := p.d.ReadFull(b); err != nil {
		return nil, p.bad(what, err)
	}
	return b, nil
}

// name reads a string value as str does, an event's tag or a field's key:
// one the decoder knows reads as that name's constant, without copying it
// out of the payload (an event map's dozen keys would otherwise cost two
// allocations each).
func (p *parser) name(what string) (string, bool, error) {
	at := p.pos()
	if hdr, n, ok := shortBytes(p.src[at:]); ok && p.skipTo(at+hdr+n) {
		v := p.src[at+hdr : at+hdr+n]
		if k := knownNames[string(v)]; k != "" {
			return k, true, nil
		}
		return string(v), true, nil
	}
	return p.str(what)
}

// knownNames are the tags and field names the decoder reads, each its own
// constant (name).
var knownNames = func() map[string]string {
	m := map[string]string{}
	for _, names := range [][]string{{"type", "metadata", tagStored, tagRemoved, tagCleared}, storedFields, removedFields} {
		for _, n := range names {
			m[n] = n
		}
	}
	return m
}()

// shortBytes reads the header of a string or bin value at the start of b
// in its forms with a header of one to three bytes (fixstr, str 8 and 16,
// bin 8 and 16): the header's length and the value's. ok is false for any
// other value, and for one b does not hold whole.
func shortBytes(b []byte) (hdr, n int, ok bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	switch c := b[0]; {
	case msgpcode.IsFixedString(c):
		hdr, n = 1, int(c&msgpcode.FixedStrMask)
	case (c == msgpcode.Str8 || c == msgpcode.Bin8) && len(b) >= 2:
		hdr, n = 2, int(b[1])
	case (c == msgpcode.Str16 || c == msgpcode.Bin16) && len(b) >= 3:
		hdr, n = 3, int(binary.BigEndian.Uint16(b[1:]))
	default:
		return 0, 0, false
	}
	return hdr, n, hdr+n <= len(b)
}

// skipTo moves the decoder to byte at of the payload: it reads p.r
// directly (a bytes.Reader is its own ByteScanner), so moving p.r moves
// the decoder.
func (p *parser) skipTo(at int) bool {
	_, err := p.r.Seek(int64(at), io.SeekStart)
	return err == nil
}

// str reads a string (or bin) value; nil reads as "".
func (p *parser) str(what string) (string, bool, error) {
	c, null, err := p.next()
	if err != nil || null {
		return "", false, err
	}
	switch {
	case msgpcode.IsString(c), msgpcode.IsBin(c):
		b, err := p.readBytes(what, MaxString)
		if err != nil {
			return "", false, err
		}
		return string(b), true, nil
	}
	return "", false, malformed("%s is not a string (code 0x%02x)", what, c)
}

// integer reads an integer; nil reads as (0, false).
func (p *parser) integer(what string) (int64, bool, error) {
	c, null, err := p.next()
	if err != nil || null {
		return 0, false, err
	}
	switch {
	case c == msgpcode.Uint64:
		u, err := p.d.DecodeUint64()
		if err != nil || u > math.MaxInt64 {
			return 0, false, malformed("%s: %d is out of range", what, u)
		}
		return int64(u), true, nil
	case isInt(c):
		v, err := p.d.DecodeInt64()
		if err != nil {
			return 0, false, p.bad(what, err)
		}
		return v, true, nil
	}
	return 0, false, malformed("%s is not an integer (code 0x%02x)", what, c)
}

// hash reads one block hash: an integer (its 64 bits as they are) or a
// byte string (reduced by xxhash64); nil reads as (0, false).
func (p *parser) hash(what string) (uint64, bool, error) {
	c, null, err := p.next()
	if err != nil || null {
		return 0, false, err
	}
	switch {
	case isInt(c):
		u, err := p.d.DecodeUint64()
		if err != nil {
			return 0, false, p.bad(what, err)
		}
		return u, true, nil
	case msgpcode.IsString(c), msgpcode.IsBin(c):
		b, err := p.readBytes(what, 1<<10)
		if err != nil {
			return 0, false, err
		}
		return xxhash.Sum64(b), true, nil
	}
	return 0, false, malformed("%s is not a block hash (code 0x%02x)", what, c)
}

// hashes reads an array of block hashes.
func (p *parser) hashes(what string) ([]uint64, error) {
	n, err := p.arrayLen(what)
	if err != nil || n < 0 {
		return nil, err
	}
	if n > p.x.lim.MaxBlocks {
		return nil, tooLarge("%s: %d block hashes, at most %d", what, n, p.x.lim.MaxBlocks)
	}
	out := make([]uint64, 0, min(n, 1024))
	for i := range n {
		if h, ok := p.hashFast(); ok {
			out = append(out, h)
			continue
		}
		h, ok, err := p.hash(what + "[" + strconv.Itoa(i) + "]")
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, malformed("%s[%d] is null", what, i)
		}
		out = append(out, h)
	}
	return out, nil
}

// hashFast reads a block hash as hash does, straight from the payload,
// when it is an integer in an unsigned form (uintFast) or a string or bin
// of at most 1 KiB with a short header (shortBytes; vLLM's 32-byte
// hashes); ok is false, and nothing is read, for any other value.
func (p *parser) hashFast() (uint64, bool) {
	if v, ok := p.uintFast(); ok {
		return v, true
	}
	at := p.pos()
	hdr, n, ok := shortBytes(p.src[at:])
	if !ok || n > 1<<10 || !p.skipTo(at+hdr+n) {
		return 0, false
	}
	return xxhash.Sum64(p.src[at+hdr : at+hdr+n]), true
}

// uintFast reads a non-negative integer in one of msgpack's unsigned
// forms (positive fixint, uint 8 to 64), the forms engines write token
// ids and integer block hashes in, straight from the payload: a long
// prompt's event holds thousands of them, and the decoder's own readers
// cost several calls each. ok is false, and nothing is read, for any other
// value, which the caller reads the general way.
func (p *parser) uintFast() (v uint64, ok bool) {
	at := p.pos()
	if at >= len(p.src) {
		return 0, false
	}
	b := p.src[at:]
	n := 0
	switch c := b[0]; {
	case c <= 0x7f: // positive fixint
		v, n = uint64(c), 1
	case c == msgpcode.Uint8 && len(b) >= 2:
		v, n = uint64(b[1]), 2
	case c == msgpcode.Uint16 && len(b) >= 3:
		v, n = uint64(binary.BigEndian.Uint16(b[1:])), 3
	case c == msgpcode.Uint32 && len(b) >= 5:
		v, n = uint64(binary.BigEndian.Uint32(b[1:])), 5
	case c == msgpcode.Uint64 && len(b) >= 9:
		v, n = binary.BigEndian.Uint64(b[1:]), 9
	default:
		return 0, false
	}
	if !p.skipTo(at + n) {
		return 0, false
	}
	return v, true
}

// tokens reads an array of token ids.
func (p *parser) tokens() ([]uint32, error) {
	n, err := p.arrayLen("token_ids")
	if err != nil || n < 0 {
		return nil, err
	}
	if n > p.x.lim.MaxTokens {
		return nil, tooLarge("token_ids: %d tokens, at most %d", n, p.x.lim.MaxTokens)
	}
	out := make([]uint32, 0, min(n, 1<<14))
	for i := range n {
		if v, ok := p.uintFast(); ok {
			if v > math.MaxUint32 {
				return nil, malformed("token_ids[%d] is not a token id", i)
			}
			out = append(out, uint32(v))
			continue
		}
		v, ok, err := p.integer("token_ids")
		if err != nil {
			return nil, err
		}
		if !ok || v < 0 || v > math.MaxUint32 {
			return nil, malformed("token_ids[%d] is not a token id", i)
		}
		out = append(out, uint32(v))
	}
	return out, nil
}

// span is a value's bytes in src, read later.
type span struct{ from, to int }

// skipSpan skips one value and returns its span.
func (p *parser) skipSpan(depth int) (span, error) {
	from := p.pos()
	if err := p.skip(depth); err != nil {
		return span{}, err
	}
	return span{from, p.pos()}, nil
}

// fields are an event's, by name, whichever the encoding.
type fields struct {
	typ          string
	hashes       []uint64
	hasHashes    bool
	parent       uint64
	hasParent    bool
	tokens       []uint32
	hasTokens    bool
	blockSize    int64
	hasBlockSize bool
	loraID       int64
	hasLoraID    bool
	medium       string
	loraName     string
	salt         string
	extra        span // extra_keys, when given
	hasExtra     bool
	group        int64
}

// batch reads the whole EventBatch.
func (p *parser) batch() (kvindex.Batch, error) {
	var b kvindex.Batch
	c, err := p.peek()
	if err != nil {
		return b, err
	}
	switch {
	case isArray(c):
		n, _ := p.d.DecodeArrayLen()
		if n < 2 {
			return b, malformed("a batch of %d elements, want [ts, events, data_parallel_rank]", n)
		}
		if b.TS, err = p.ts(); err != nil {
			return b, err
		}
		if err = p.events(&b); err != nil {
			return b, err
		}
		if n >= 3 {
			if b.Rank, err = p.rank(); err != nil {
				return b, err
			}
		}
		for range n - 3 {
			if err := p.skip(1); err != nil {
				return b, err
			}
		}
	case isMap(c):
		n, _ := p.d.DecodeMapLen()
		seen := false
		for range n {
			k, _, err := p.str("batch key")
			if err != nil {
				return b, err
			}
			switch k {
			case "ts":
				b.TS, err = p.ts()
			case "events":
				err, seen = p.events(&b), true
			case "data_parallel_rank":
				b.Rank, err = p.rank()
			default:
				err = p.skip(1)
			}
			if err != nil {
				return b, err
			}
		}
		if !seen {
			return b, malformed("a batch with no events")
		}
	default:
		return b, malformed("a batch is not an array (code 0x%02x)", c)
	}
	return b, nil
}

func (p *parser) ts() (float64, error) {
	c, null, err := p.next()
	if err != nil || null {
		return 0, err
	}
	if c != msgpcode.Float && c != msgpcode.Double && !isInt(c) {
		return 0, malformed("ts is not a number (code 0x%02x)", c)
	}
	v, err := p.d.DecodeFloat64()
	if err != nil {
		return 0, malformed("ts: %v", err)
	}
	return v, nil
}

func (p *parser) rank() (int, error) {
	v, _, err := p.integer("data_parallel_rank")
	if err != nil {
		return 0, err
	}
	if v < 0 || v >= kvindex.MaxRanks {
		return 0, malformed("data_parallel_rank %d is out of [0, %d)", v, kvindex.MaxRanks)
	}
	return int(v), nil
}

// events reads the events array into b.
func (p *parser) events(b *kvindex.Batch) error {
	n, err := p.arrayLen("events")
	if err != nil {
		return err
	}
	if n > p.x.lim.MaxEvents {
		return tooLarge("%d events, at most %d", n, p.x.lim.MaxEvents)
	}
	if n > 0 {
		b.Events = make([]kvindex.Event, 0, min(n, 256))
	}
	for i := range n {
		var f fields
		c, err := p.peek()
		if err != nil {
			return err
		}
		switch {
		case isArray(c):
			err = p.positional(&f)
		case isMap(c):
			err = p.named(&f)
		default:
			err = malformed("events[%d] is neither an array nor a map (code 0x%02x)", i, c)
		}
		if err != nil {
			return fmt.Errorf("events[%d]: %w", i, err)
		}
		ev, known, err := p.event(&f)
		if err != nil {
			return fmt.Errorf("events[%d] (%s): %w", i, f.typ, err)
		}
		if !known {
			b.Unknown++
			continue
		}
		b.Events = append(b.Events, ev)
	}
	return nil
}

// Event type tags.
const (
	tagStored  = "BlockStored"
	tagRemoved = "BlockRemoved"
	tagCleared = "AllBlocksCleared"
)

// positional reads a tagged positional event.
func (p *parser) positional(f *fields) error {
	n, _ := p.d.DecodeArrayLen()
	if n < 1 {
		return malformed("an event with no type tag")
	}
	c, err := p.peek()
	if err != nil {
		return err
	}
	if !msgpcode.IsString(c) {
		// An integer or other tag is no type this decoder knows.
		for range n {
			if err := p.skip(1); err != nil {
				return err
			}
		}
		return nil
	}
	if f.typ, _, err = p.name("type"); err != nil {
		return err
	}
	var names []string
	switch f.typ {
	case tagStored:
		names = storedFields
	case tagRemoved:
		names = removedFields
	}
	for i := 1; i < n; i++ {
		name := ""
		if i-1 < len(names) {
			name = names[i-1]
		}
		if f.typ == tagStored && i == 7 {
			// vLLM's lora_name, or SGLang's metadata map, or an
			// extra_keys array appended after medium.
			c, err := p.peek()
			if err != nil {
				return err
			}
			switch {
			case isMap(c):
				name = "metadata"
			case isArray(c):
				name = "extra_keys"
			}
		}
		if err := p.field(f, name); err != nil {
			return err
		}
	}
	return nil
}

// The positional fields after the tag (vLLM's order).
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

// named reads an event map.
func (p *parser) named(f *fields) error {
	n, _ := p.d.DecodeMapLen()
	for range n {
		c, err := p.peek()
		if err != nil {
			return err
		}
		if !msgpcode.IsString(c) {
			if err := p.skip(1); err != nil { // the key
				return err
			}
			if err := p.skip(1); err != nil {
				return err
			}
			continue
		}
		k, _, err := p.name("key")
		if err != nil {
			return err
		}
		if k == "type" {
			s, ok, err := p.name("type")
			if err != nil {
				return err
			}
			if !ok {
				return malformed("a null type")
			}
			f.typ = s
			continue
		}
		if err := p.field(f, k); err != nil {
			return err
		}
	}
	if f.typ == "" {
		return malformed("an event map with no type")
	}
	return nil
}

// field reads the value of field name into f (an unknown name is
// skipped).
func (p *parser) field(f *fields, name string) error {
	var err error
	switch name {
	case "block_hashes":
		f.hashes, err = p.hashes("block_hashes")
		f.hasHashes = err == nil && f.hashes != nil
	case "parent_block_hash":
		f.parent, f.hasParent, err = p.hash("parent_block_hash")
	case "token_ids":
		f.tokens, err = p.tokens()
		f.hasTokens = err == nil && f.tokens != nil
	case "block_size":
		f.blockSize, f.hasBlockSize, err = p.integer("block_size")
	case "lora_id":
		f.loraID, f.hasLoraID, err = p.integer("lora_id")
	case "medium":
		f.medium, err = p.loose("medium")
	case "lora_name":
		f.loraName, err = p.loose("lora_name")
	case "extra_keys":
		c, perr := p.peek()
		if perr != nil {
			return perr
		}
		if c == msgpcode.Nil {
			return p.d.DecodeNil()
		}
		if !isArray(c) {
			return malformed("extra_keys is not an array (code 0x%02x)", c)
		}
		f.extra, err = p.skipSpan(1)
		f.hasExtra = err == nil
	case "metadata":
		err = p.metadata(f)
	case "group_idx":
		f.group, _, err = p.integer("group_idx")
	default:
		err = p.skip(1)
	}
	return err
}

// loose reads a string field, where any other type reads as "".
func (p *parser) loose(what string) (string, error) {
	c, err := p.peek()
	if err != nil {
		return "", err
	}
	if msgpcode.IsString(c) || c == msgpcode.Nil {
		s, _, err := p.str(what)
		return s, err
	}
	return "", p.skip(1)
}

// metadata reads SGLang's BlockStored metadata map (cache_salt).
func (p *parser) metadata(f *fields) error {
	c, null, err := p.next()
	if err != nil || null {
		return err
	}
	if !isMap(c) {
		return p.skip(1)
	}
	n, _ := p.d.DecodeMapLen()
	for range n {
		c, err := p.peek()
		if err != nil {
			return err
		}
		if !msgpcode.IsString(c) {
			if err := p.skip(2); err != nil {
				return err
			}
			if err := p.skip(2); err != nil {
				return err
			}
			continue
		}
		k, _, err := p.str("metadata key")
		if err != nil {
			return err
		}
		if k == "cache_salt" {
			if f.salt, err = p.loose("cache_salt"); err != nil {
				return err
			}
			continue
		}
		if err := p.skip(2); err != nil {
			return err
		}
	}
	return nil
}

// event checks f and builds the event; known is false for an event type
// the decoder does not know.
func (p *parser) event(f *fields) (ev kvindex.Event, known bool, err error) {
	switch f.typ {
	case tagStored:
		if !f.hasHashes || !f.hasTokens || !f.hasBlockSize {
			return ev, true, malformed("block_hashes, token_ids and block_size are required")
		}
		if f.blockSize < 1 || f.blockSize > kvindex.MaxBlockSize {
			return ev, true, malformed("block_size %d is out of [1, %d]", f.blockSize, kvindex.MaxBlockSize)
		}
		ev = kvindex.Event{Kind: kvindex.Stored, Hashes: f.hashes, Parent: f.parent, HasParent: f.hasParent,
			Tokens: f.tokens, BlockSize: int(f.blockSize), Medium: kvindex.MediumOf(f.medium),
			LoRA: f.loraName, Salt: f.salt, Group: int(f.group)}
		if ev.LoRA == "" && f.hasLoraID && f.loraID != 0 {
			ev.LoRA = "#lora-id:" + strconv.FormatInt(f.loraID, 10)
		}
		if f.hasExtra {
			if err := p.extraKeys(f, &ev); err != nil {
				return ev, true, err
			}
		}
		return ev, true, nil
	case tagRemoved:
		if !f.hasHashes {
			return ev, true, malformed("block_hashes is required")
		}
		return kvindex.Event{Kind: kvindex.Removed, Hashes: f.hashes, Medium: kvindex.MediumOf(f.medium), Group: int(f.group)}, true, nil
	case tagCleared:
		return kvindex.Event{Kind: kvindex.Cleared}, true, nil
	}
	return ev, false, nil
}

// extraKeys reads the extra_keys of a stored event (one entry per block,
// each null or an array of keys): the adapter's name is dropped where it
// leads a block's keys (vLLM puts it first in every block of an adapter's
// sequence), the last other string of a sequence's first block is its
// cache salt (vLLM appends cache_salt there), and every other key goes into
// the block's Extra digest.
func (p *parser) extraKeys(f *fields, ev *kvindex.Event) error {
	x := p.x
	x.sub.Reset(p.src[f.extra.from:f.extra.to])
	x.sd.Reset(&x.sub)
	q := parser{x: x, d: x.sd, src: p.src[f.extra.from:f.extra.to], r: &x.sub}
	n, err := q.arrayLen("extra_keys")
	if err != nil || n < 0 {
		return err
	}
	if n != len(ev.Hashes) {
		return malformed("extra_keys has %d entries for %d blocks", n, len(ev.Hashes))
	}
	var strs []string
	for i := range n {
		m, err := q.arrayLen("extra_keys entry")
		if err != nil {
			return err
		}
		if m > x.lim.MaxExtra {
			return tooLarge("extra_keys[%d]: %d keys, at most %d", i, m, x.lim.MaxExtra)
		}
		d := xxhash.New()
		hasAny := false
		strs = strs[:0]
		for j := range max(m, 0) {
			c, err := q.peek()
			if err != nil {
				return err
			}
			switch {
			case msgpcode.IsString(c):
				s, _, err := q.str("extra key")
				if err != nil {
					return err
				}
				if j == 0 && ev.LoRA != "" && s == ev.LoRA {
					continue
				}
				strs = append(strs, s)
			case isInt(c) && j == 0 && f.hasLoraID:
				v, _, err := q.integer("extra key")
				if err != nil {
					return err
				}
				if v == f.loraID {
					continue
				}
				writeDigest(d, "i", strconv.FormatInt(v, 10))
				hasAny = true
			default:
				sp, err := q.skipSpan(2)
				if err != nil {
					return err
				}
				writeDigest(d, "r", string(q.src[sp.from:sp.to]))
				hasAny = true
			}
		}
		if i == 0 && !ev.HasParent && len(strs) > 0 && ev.Salt == "" {
			ev.Salt = strs[len(strs)-1]
			strs = strs[:len(strs)-1]
		}
		for _, s := range strs {
			writeDigest(d, "s", s)
			hasAny = true
		}
		if hasAny {
			if ev.Extra == nil {
				ev.Extra = make([]uint64, n)
			}
			ev.Extra[i] = d.Sum64() | 1
		}
	}
	return nil
}

// writeDigest writes one extra key, kind-tagged and length-prefixed, to d.
func writeDigest(d *xxhash.Digest, kind, s string) {
	var l [8]byte
	binary.LittleEndian.PutUint64(l[:], uint64(len(s)))
	_, _ = d.WriteString(kind)
	_, _ = d.Write(l[:])
	_, _ = d.WriteString(s)
}
