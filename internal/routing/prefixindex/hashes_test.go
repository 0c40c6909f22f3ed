package prefixindex

import (
	"reflect"
	"testing"
)

// TestLookupHashedKeepsHashes: a memo is hashed into once per namespace
// (the last one), its lookups find what LookupIn finds, and lookups of
// other prompts in between, without a memo, leave it whole.
func TestLookupHashedKeepsHashes(t *testing.T) {
	x := New(Config{ChunkBytes: 64, BytesPerToken: 4})
	prompt, other := text("p", 1000), text("o", 1000)
	for _, id := range []string{"a", "b"} {
		x.Observe(fw(id, 1000))
	}
	x.Record(x.Lookup("m", prompt[:500]), "a")
	x.Record(x.LookupIn("m", "lora:l1", prompt), "b")

	var memo PromptHashes
	steps := []struct {
		ns   string
		runs int // memo.Runs() after the lookup
	}{
		{"", 1}, {"", 1}, {"lora:l1", 2}, {"lora:l1", 2}, {"", 3},
	}
	for i, st := range steps {
		want := hitsOf(x.LookupIn("m", st.ns, prompt))
		x.LookupIn("m", st.ns, other) // scratch hashing of another prompt
		q := x.LookupHashed("m", st.ns, prompt, &memo)
		if got := hitsOf(q); !reflect.DeepEqual(got, want) || len(got) != 1 {
			t.Fatalf("step %d (ns %q): hits %v, want %v (one worker)", i, st.ns, got, want)
		}
		if h := x.HashesIn(nil, st.ns, prompt); !reflect.DeepEqual(q.Hashes(), h) {
			t.Fatalf("step %d (ns %q): the memo's hashes are not the prompt's", i, st.ns)
		}
		if memo.Runs() != st.runs {
			t.Fatalf("step %d (ns %q): hashed %d times, want %d", i, st.ns, memo.Runs(), st.runs)
		}
	}
}
