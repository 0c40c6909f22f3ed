package tokenizer

import (
	"errors"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

const english = `The river ran through the valley, and the people of the town came down
to the water every morning. They would talk about the weather, the price of bread,
and the children who had grown up and moved to the city. Nobody remembered when the
old bridge was built, but everyone agreed it should be repaired before the winter.`

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{"empty", ""},
		{"one byte", "a"},
		{"english", english},
		{"chat template", RenderChat([]Message{{"system", "You are helpful."}, {"user", "Hi!"}})},
		{"utf-8", "naïve café — 東京 ünïcödé"},
		{"emoji", "🚀🔥 ok 👍🏽"},
		{"invalid utf-8", "ab\xff\xfe\x80c\xc3"},
		{"nul and controls", "\x00\x01\t\r\n\x7f"},
		{"long unknown word", "Pneumonoultramicroscopicsilicovolcanoconiosis"},
		{"whitespace runs", "   \n\n\t\t  x"},
	}
	tok := Default()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids := tok.Encode(tt.in)
			got, err := tok.Decode(ids)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got != tt.in {
				t.Fatalf("Decode(Encode(%q)) = %q", tt.in, got)
			}
		})
	}
}

func TestGreedyLongestMatch(t *testing.T) {
	tok := Default()
	ids := tok.Encode(" the")
	if len(ids) != 1 || tok.Piece(ids[0]) != " the" {
		t.Fatalf(`Encode(" the") = %v, want the single piece " the"`, ids)
	}
	tests := []struct{ in, want string }{
		{" there", " there"},
		{"The walking", "The| walk|ing"},
		{"Then", "Then"},
		{"thenx", "then|x"},
	}
	for _, tt := range tests {
		var parts []string
		for _, id := range tok.Encode(tt.in) {
			parts = append(parts, tok.Piece(id))
		}
		if got := strings.Join(parts, "|"); got != tt.want {
			t.Errorf("pieces of %q = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestBytesPerToken(t *testing.T) {
	tok := Default()
	ids := tok.Encode(english)
	ratio := float64(len(english)) / float64(len(ids))
	t.Logf("%d bytes, %d tokens: %.2f bytes/token; vocabulary %d", len(english), len(ids), ratio, tok.VocabSize())
	if ratio < 3 || ratio > 5.5 {
		t.Fatalf("%.2f bytes per token on English, want about 3-5", ratio)
	}
}

func TestDecodeUnknownID(t *testing.T) {
	tok := Default()
	if _, err := tok.Decode([]uint32{65, uint32(tok.VocabSize())}); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("Decode(out of range) error = %v, want ErrUnknownToken", err)
	}
	if p := tok.Piece(uint32(tok.VocabSize())); p != "" {
		t.Fatalf("Piece(out of range) = %q", p)
	}
}

func TestWordListsAligned(t *testing.T) {
	tok := Default()
	sw, csw, cw := tok.SpaceWords(), tok.CapSpaceWords(), tok.CapWords()
	if len(sw) < 500 || len(sw) != len(csw) || len(sw) != len(cw) {
		t.Fatalf("word lists %d, %d, %d", len(sw), len(csw), len(cw))
	}
	for i := range sw {
		w := tok.Piece(sw[i])
		if w[0] != ' ' || " "+tok.Piece(cw[i]) != tok.Piece(csw[i]) {
			t.Fatalf("word %d: %q %q %q", i, w, tok.Piece(csw[i]), tok.Piece(cw[i]))
		}
		if !strings.EqualFold(w, tok.Piece(csw[i])) {
			t.Fatalf("word %d: %q vs %q", i, w, tok.Piece(csw[i]))
		}
	}
}

func TestRenderChat(t *testing.T) {
	got := RenderChat([]Message{{"system", "Be brief."}, {"user", "Hello"}})
	if want := "system\nBe brief.\nuser\nHello\nassistant\n"; got != want {
		t.Fatalf("RenderChat = %q, want %q", got, want)
	}
	if got := RenderChat(nil); got != "assistant\n" {
		t.Fatalf("RenderChat(nil) = %q", got)
	}
	msgs := []Message{{"user", "Hi"}, {"assistant", "Hel"}}
	for _, c := range []struct {
		opts ChatOptions
		want string
	}{
		{ChatOptions{}, "user\nHi\nassistant\nHel\n"},
		{ChatOptions{AddGenerationPrompt: true}, "user\nHi\nassistant\nHel\nassistant\n"},
		{ChatOptions{ContinueFinalMessage: true}, "user\nHi\nassistant\nHel"},
	} {
		if got := RenderChatWith(msgs, c.opts); got != c.want {
			t.Errorf("RenderChatWith(%+v) = %q, want %q", c.opts, got, c.want)
		}
	}
}

func FuzzTokenizerRoundTrip(f *testing.F) {
	for _, s := range []string{"", english, "naïve 東京 🚀", "ab\xff\xfe", "   the the"} {
		f.Add(s)
	}
	tok := Default()
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		got, err := tok.Decode(ids)
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if got != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
		for _, id := range ids {
			if int(id) >= tok.VocabSize() {
				t.Fatalf("id %d outside the vocabulary", id)
			}
		}
	})
}
