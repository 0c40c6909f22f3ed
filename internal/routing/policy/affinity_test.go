package policy

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/tlgate/tlgate/internal/routing/ring"
)

// prefixKey returns the 64-byte affinity key of a chat whose system prompt
// is sys, rendered as role\ncontent\n.
func prefixKey(sys, user string) []byte {
	k := []byte("system\n" + sys + "\nuser\n" + user + "\n")
	return k[:min(len(k), 64)]
}

func fourWorkers() (*ring.Ring, []Candidate) {
	r := ring.New()
	cands := make([]Candidate, 4)
	for i := range cands {
		cands[i] = Candidate{ID: fmt.Sprintf("worker-%d", i), Weight: 1024}
		r.Add(cands[i].ID)
	}
	return r, cands
}

func TestAffinityKeepsPrefixTogether(t *testing.T) {
	const c = 1.25
	sys := "You are a careful assistant for the tlgate project. Answer briefly and cite sources."

	t.Run("shared prefix on one worker", func(t *testing.T) {
		r, cands := fourWorkers()
		for i := range cands {
			cands[i].Load = 2 // background load elsewhere keeps the cap above the owner's load
		}
		first := ""
		for i := range 20 {
			key := prefixKey(sys, "question "+strconv.Itoa(i))
			idx, reason := Affinity(r, key, cands, c)
			if idx < 0 {
				t.Fatalf("request %d: no pick", i)
			}
			if first == "" {
				first = cands[idx].ID
			}
			if cands[idx].ID != first || reason != ReasonAffinity {
				t.Fatalf("request %d: %s (%s), want %s (affinity)", i, cands[idx].ID, reason, first)
			}
			// The request runs and completes before the next: the load stays
			// below the cap.
		}
	})

	t.Run("concurrent requests stay until the cap", func(t *testing.T) {
		r, cands := fourWorkers()
		key := prefixKey(sys, "")
		owner, _ := Affinity(r, key, cands, c)
		for i := range cands {
			if i != owner {
				cands[i].Load = 3
			}
		}
		// In flight accumulate on the owner while it is below the cap.
		for k := 0; ; k++ {
			limit := ring.Cap(4, 9+k, c)
			idx, reason := Affinity(r, key, cands, c)
			if cands[owner].Load < limit {
				if idx != owner || reason != ReasonAffinity {
					t.Fatalf("owner at %d below cap %d: picked %s (%s)", cands[owner].Load, limit, cands[idx].ID, reason)
				}
				cands[owner].Load++
				continue
			}
			if idx == owner || reason != ReasonLoad {
				t.Fatalf("owner at %d, cap %d: picked %s (%s), want another worker (load)", cands[owner].Load, limit, cands[idx].ID, reason)
			}
			if k != 5 { // ⌈1.25·(9+5+1)/4⌉ = 5 is the first cap the owner reaches
				t.Fatalf("owner skipped after %d requests, want 5", k)
			}
			break
		}
	})

	t.Run("distinct prefixes spread", func(t *testing.T) {
		r, cands := fourWorkers()
		used := map[string]int{}
		for i := range 40 {
			key := prefixKey(fmt.Sprintf("You are assistant number %d of the evaluation suite.", i), "hi")
			idx, reason := Affinity(r, key, cands, c)
			if reason != ReasonAffinity {
				t.Fatalf("idle workers: reason %q, want affinity", reason)
			}
			used[cands[idx].ID]++
		}
		if len(used) < 3 {
			t.Fatalf("40 distinct prefixes used %d workers (%v), want at least 3 of 4", len(used), used)
		}
	})

	// Design section 2.3: 4 workers, c = 1.25, 3 in flight on the owner and
	// none elsewhere: the cap is ⌈1.25·4/4⌉ = 2, so the owner is skipped.
	t.Run("overloaded owner skipped", func(t *testing.T) {
		r, cands := fourWorkers()
		key := prefixKey(sys, "")
		owner, reason := Affinity(r, key, cands, c)
		if reason != ReasonAffinity {
			t.Fatalf("idle: reason %q, want affinity", reason)
		}
		cands[owner].Load = 3
		idx, reason := Affinity(r, key, cands, c)
		if idx == owner || idx < 0 || reason != ReasonLoad {
			t.Fatalf("owner with 3 in flight: picked %d (%s), want another worker with reason load", idx, reason)
		}
	})
}

func TestAffinityCandidates(t *testing.T) {
	r, all := fourWorkers()
	key := prefixKey("a shared system prompt for the candidate tests of affinity", "")
	owner, _ := Affinity(r, key, all, 1.25)

	without := make([]Candidate, 0, 3)
	for i, c := range all {
		if i != owner {
			without = append(without, c)
		}
	}
	offRing := []Candidate{{ID: "elsewhere"}}
	// With the owner excluded, the key belongs to the next worker clockwise:
	// its owner on a ring without the excluded one.
	rest := ring.New()
	for _, c := range without {
		rest.Add(c.ID)
	}

	tests := []struct {
		name       string
		r          *ring.Ring
		cands      []Candidate
		wantID     string
		wantReason string
	}{
		{"nil ring", nil, all, "", ""},
		{"no candidates", r, nil, "", ""},
		{"none on the ring", r, offRing, "", ""},
		{"owner", r, all, all[owner].ID, ReasonAffinity},
		// An excluded owner is not eligible: the first candidate clockwise
		// owns the key among the rest, and it was not skipped for load.
		{"owner excluded", r, without, rest.Get(key), ReasonAffinity},
		{"off-ring candidate ignored", r, append([]Candidate{{ID: "elsewhere", Load: 0}}, all...), all[owner].ID, ReasonAffinity},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx, reason := Affinity(tt.r, key, tt.cands, 1.25)
			if reason != tt.wantReason {
				t.Fatalf("reason %q, want %q", reason, tt.wantReason)
			}
			if tt.wantReason == "" {
				if idx != -1 {
					t.Fatalf("index %d, want -1", idx)
				}
				return
			}
			if got := tt.cands[idx].ID; got != tt.wantID {
				t.Fatalf("picked %s, want %s", got, tt.wantID)
			}
		})
	}
}

func BenchmarkAffinity(b *testing.B) {
	for _, n := range []int{4, 64, 1024} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			cands := candidates(n, func(i int) int { return i % 3 }, func(int) int { return 1024 })
			cands[0].Load = 50
			r := ring.New()
			for _, c := range cands {
				r.Add(c.ID)
			}
			keys := make([][]byte, 256)
			for i := range keys {
				keys[i] = prefixKey(fmt.Sprintf("system prompt variant %d for the benchmark of affinity", i), "")
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				Affinity(r, keys[i&255], cands, 1.25)
				i++
			}
		})
	}
}
