package echo

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestQuoteAndClip(t *testing.T) {
	long := strings.Repeat("a", 5000)
	for _, tc := range []struct {
		in, quote, clip string
	}{
		{"resp_1", `"resp_1"`, "resp_1"},
		{"", `""`, ""},
		{"a\"b\n", `"a\"b\n"`, "a\"b\n"},
		{strings.Repeat("x", MaxBytes), `"` + strings.Repeat("x", MaxBytes) + `"`, strings.Repeat("x", MaxBytes)},
		{long, `"` + long[:MaxBytes] + `"… (5000 bytes)`, long[:MaxBytes] + "… (5000 bytes)"},
		// A cut never splits a character: é is 2 bytes, the last one
		// would straddle MaxBytes.
		{strings.Repeat("x", MaxBytes-1) + "é" + "zz", `"` + strings.Repeat("x", MaxBytes-1) + `"… (131 bytes)`, strings.Repeat("x", MaxBytes-1) + "… (131 bytes)"},
	} {
		if got := Quote(tc.in); got != tc.quote {
			t.Errorf("Quote(%.20q…) = %q, want %q", tc.in, got, tc.quote)
		}
		if got := Clip(tc.in); got != tc.clip || !utf8.ValidString(got) {
			t.Errorf("Clip(%.20q…) = %q, want %q", tc.in, got, tc.clip)
		}
	}
}
