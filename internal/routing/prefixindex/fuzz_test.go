package prefixindex

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/wire/openai"
)

// FuzzChunkingAndRendering renders a chat of two turns as the gateway does
// (openai.ParseRequest), first without and then with its second turn, and
// checks what the index relies on: the first rendering is a prefix of the
// second, its chunk hashes are a prefix of the second's, every prompt has
// len/ChunkBytes chunks, and after recording the first prompt a lookup of
// the second finds exactly the first's chunks (never more, never panics).
func FuzzChunkingAndRendering(f *testing.F) {
	f.Add("You are terse.", "hello", "hi there", "and then?", 64)
	f.Add("", "", "", "", 1)
	f.Add(strings.Repeat("é", 70), "\x00\n", "\"quoted\"", "🙂", 7)
	f.Fuzz(func(t *testing.T, sys, user, answer, next string, chunk int) {
		chunk = 1 + (chunk%512+512)%512
		x := New(Config{ChunkBytes: chunk, BytesPerToken: 4})
		msgs := []map[string]string{{"role": "system", "content": sys}, {"role": "user", "content": user}}
		first, ok := render(t, msgs)
		if !ok {
			return
		}
		msgs = append(msgs, map[string]string{"role": "assistant", "content": answer}, map[string]string{"role": "user", "content": next})
		second, ok := render(t, msgs)
		if !ok {
			t.Fatalf("the longer chat is refused, the shorter was not")
		}
		if !strings.HasPrefix(second, first) {
			t.Fatalf("rendering %q is not a prefix of %q", first, second)
		}
		h1, h2 := x.Hashes(nil, first), x.Hashes(nil, second)
		if len(h1) != len(first)/chunk || len(h2) != len(second)/chunk {
			t.Fatalf("chunks %d and %d of %d and %d bytes at %d a chunk", len(h1), len(h2), len(first), len(second), chunk)
		}
		for i := range h1 {
			if h1[i] != h2[i] {
				t.Fatalf("chunk %d of the shared prefix hashes differently", i)
			}
		}
		x.Observe(fw("a", 1<<20))
		x.Record(x.Lookup("m", first), "a")
		hits := x.Lookup("m", second).Hits()
		switch {
		case len(h1) == 0 && len(hits) != 0:
			t.Fatalf("hits %v for a prompt without whole chunks", hits)
		case len(h1) > 0 && (len(hits) != 1 || hits[0].Chunks != len(h1)):
			t.Fatalf("hits %v, want a: %d", hits, len(h1))
		}
	})
}

func render(t *testing.T, msgs []map[string]string) (string, bool) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	if err != nil {
		t.Fatal(err)
	}
	req, err := openai.ParseRequest(body, true)
	if err != nil {
		return "", false
	}
	return req.Prompt, true
}
