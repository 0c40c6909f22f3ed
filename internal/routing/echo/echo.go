// Package echo bounds what an error message repeats of a value a client
// or an operator sent: a 5,000-character id comes back as its first
// MaxBytes bytes and its length, never whole.
package echo

import (
	"strconv"
	"unicode/utf8"
)

// MaxBytes is the most bytes of a value a message repeats.
const MaxBytes = 128

// Quote returns s quoted as %q quotes it when it is at most MaxBytes
// long; a longer s is cut there (at a character boundary) and followed by
// "…" and its length: "abc…" (5000 bytes).
func Quote(s string) string {
	head, cut := prefix(s)
	if !cut {
		return strconv.Quote(s)
	}
	return strconv.Quote(head) + "… (" + strconv.Itoa(len(s)) + " bytes)"
}

// Clip returns s as it is when it is at most MaxBytes long; a longer s is
// cut there (at a character boundary) and followed by "…" and its length.
func Clip(s string) string {
	head, cut := prefix(s)
	if !cut {
		return s
	}
	return head + "… (" + strconv.Itoa(len(s)) + " bytes)"
}

// prefix returns the first MaxBytes bytes of s, fewer to end on a
// character boundary, and whether s was longer.
func prefix(s string) (string, bool) {
	if len(s) <= MaxBytes {
		return s, false
	}
	n := MaxBytes
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}
