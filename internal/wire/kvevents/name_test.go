package kvevents

import "testing"

// TestKnownNames: every tag and field name the decoder reads is known,
// as itself; anything else is not.
func TestKnownNames(t *testing.T) {
	names := []string{"type", tagStored, tagRemoved, tagCleared, "metadata"}
	names = append(names, storedFields...)
	names = append(names, removedFields...)
	for _, n := range names {
		if got := knownNames[n]; got != n {
			t.Errorf("knownNames[%q] = %q", n, got)
		}
	}
	for _, n := range []string{"", "Type", "block_hash", "token_ids "} {
		if got, ok := knownNames[n]; ok {
			t.Errorf("knownNames[%q] = %q, want none", n, got)
		}
	}
}
