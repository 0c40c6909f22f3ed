package kvevents

import "testing"

// TestKnownNames: every tag and field name the decoder reads is known,
// as itself; anything else is not.
func TestKnownNames(t *testing.T) {
	names := []string{"type", tagStored, tagRemoved, tagCleared, "metadata"}
	names = append(names, storedFields...)
	names = append(names, removedFields...)
	for _, n := range names {
		switch n {
		case "kv_cache_spec_kind", "kv_cache_spec_sliding_window": // read by no field: skipped
			if knownName([]byte(n)) != "" {
				t.Errorf("knownName(%q) = %q, want \"\"", n, knownName([]byte(n)))
			}
			continue
		}
		if got := knownName([]byte(n)); got != n {
			t.Errorf("knownName(%q) = %q", n, got)
		}
	}
	for _, n := range []string{"", "Type", "block_hash", "token_ids "} {
		if got := knownName([]byte(n)); got != "" {
			t.Errorf("knownName(%q) = %q, want \"\"", n, got)
		}
	}
}
