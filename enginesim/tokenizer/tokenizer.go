// Package tokenizer is the reference engine's reversible toy tokenizer.
//
// The vocabulary is fixed: token ids 0..255 are the 256 bytes, then come
// common English words (bare, with a leading space, and capitalised) and
// sub-word and punctuation pieces. Encoding matches the longest piece at
// each position (falling back to the byte token), so Decode(Encode(s)) == s
// for every string, valid UTF-8 or not, at about 4 bytes per token on
// English prose.
package tokenizer

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// NumByteTokens is the number of byte tokens: ids 0..255 decode to one byte.
const NumByteTokens = 256

// ErrUnknownToken is returned by Decode for an id outside the vocabulary.
var ErrUnknownToken = errors.New("tokenizer: unknown token id")

// Tokenizer is an immutable vocabulary with its encoder; safe for concurrent
// use.
type Tokenizer struct {
	pieces []string          // id -> text
	ids    map[string]uint32 // text -> id, pieces of 2 or more bytes
	// maxLen[b] is the length of the longest piece starting with byte b.
	maxLen [256]int
	// spaceWords, capSpaceWords and capWords are the ids of " word",
	// " Word" and "Word" for every common word, most frequent first.
	spaceWords, capSpaceWords, capWords []uint32
}

// Default returns the shared default vocabulary (built once).
var Default = sync.OnceValue(newDefault)

func newDefault() *Tokenizer {
	t := &Tokenizer{ids: make(map[string]uint32)}
	for b := range NumByteTokens {
		t.pieces = append(t.pieces, string([]byte{byte(b)}))
	}
	words := strings.Fields(commonWords)
	seen := make(map[string]bool, len(words))
	for _, w := range words {
		if seen[w] {
			continue
		}
		seen[w] = true
		capital := capitalise(w)
		t.spaceWords = append(t.spaceWords, t.add(" "+w))
		t.capSpaceWords = append(t.capSpaceWords, t.add(" "+capital))
		t.capWords = append(t.capWords, t.add(capital))
		t.add(w)
	}
	for _, p := range pieces {
		t.add(p)
	}
	return t
}

// add registers piece (if new) and returns its id. Single bytes already
// have their byte token.
func (t *Tokenizer) add(piece string) uint32 {
	if len(piece) == 1 {
		return uint32(piece[0])
	}
	if id, ok := t.ids[piece]; ok {
		return id
	}
	id := uint32(len(t.pieces))
	t.pieces = append(t.pieces, piece)
	t.ids[piece] = id
	if first := piece[0]; len(piece) > t.maxLen[first] {
		t.maxLen[first] = len(piece)
	}
	return id
}

func capitalise(w string) string {
	r, size := utf8.DecodeRuneInString(w)
	return string(unicode.ToUpper(r)) + w[size:]
}

// VocabSize returns the number of token ids.
func (t *Tokenizer) VocabSize() int { return len(t.pieces) }

// Encode returns the token ids of s.
func (t *Tokenizer) Encode(s string) []uint32 {
	return t.AppendEncode(make([]uint32, 0, len(s)/3+1), s)
}

// AppendEncode appends the token ids of s to dst and returns the result.
func (t *Tokenizer) AppendEncode(dst []uint32, s string) []uint32 {
	for i := 0; i < len(s); {
		id, n := t.match(s[i:])
		dst = append(dst, id)
		i += n
	}
	return dst
}

// match returns the longest piece that prefixes s (s is not empty).
func (t *Tokenizer) match(s string) (id uint32, n int) {
	for l := min(t.maxLen[s[0]], len(s)); l >= 2; l-- {
		if id, ok := t.ids[s[:l]]; ok {
			return id, l
		}
	}
	return uint32(s[0]), 1
}

// Decode returns the text of ids.
func (t *Tokenizer) Decode(ids []uint32) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		if int(id) >= len(t.pieces) {
			return "", fmt.Errorf("%w: %d (vocabulary has %d)", ErrUnknownToken, id, len(t.pieces))
		}
		b.WriteString(t.pieces[id])
	}
	return b.String(), nil
}

// Piece returns the text of one token ("" for an unknown id). A byte token
// may be part of a multi-byte UTF-8 character.
func (t *Tokenizer) Piece(id uint32) string {
	if int(id) >= len(t.pieces) {
		return ""
	}
	return t.pieces[id]
}

// SpaceWords returns the ids of " word" for every common word, most frequent
// first. The slice is shared: do not modify it.
func (t *Tokenizer) SpaceWords() []uint32 { return t.spaceWords }

// CapSpaceWords returns the ids of " Word" in the order of SpaceWords.
func (t *Tokenizer) CapSpaceWords() []uint32 { return t.capSpaceWords }

// CapWords returns the ids of "Word" in the order of SpaceWords.
func (t *Tokenizer) CapWords() []uint32 { return t.capWords }

// ID returns the id of an exact piece or byte.
func (t *Tokenizer) ID(piece string) (uint32, bool) {
	if len(piece) == 1 {
		return uint32(piece[0]), true
	}
	id, ok := t.ids[piece]
	return id, ok
}
