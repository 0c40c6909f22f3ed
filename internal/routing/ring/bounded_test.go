package ring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

func TestGetBoundedEligibility(t *testing.T) {
	ids := workers(4)
	r := newRing(ids)
	key := []byte("a prompt")
	owner := r.Get(key)
	others := map[string]int{}
	for _, id := range ids {
		if id != owner {
			others[id] = 0
		}
	}

	tests := []struct {
		name        string
		loads       map[string]int
		wantOwner   bool
		wantNone    bool
		wantSkipped bool
	}{
		{name: "nil loads", loads: nil, wantNone: true},
		{name: "only ids off the ring", loads: map[string]int{"ghost": 0}, wantNone: true},
		{name: "owner only", loads: map[string]int{owner: 5}, wantOwner: true},
		{name: "owner absent is not eligible and not skipped", loads: others},
		{name: "ids off the ring do not lower the cap", loads: map[string]int{owner: 1, "g1": 0, "g2": 0, "g3": 0}, wantOwner: true},
		{name: "more ids than members", loads: map[string]int{owner: 1, "g1": 0, "g2": 0, "g3": 0, "g4": 0}, wantOwner: true},
		{name: "negative load counts as 0", loads: map[string]int{owner: -4}, wantOwner: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, skipped := r.GetBounded(key, tt.loads, 1.25)
			switch {
			case tt.wantNone:
				if got != "" || skipped {
					t.Fatalf("GetBounded = %q, %v; want none", got, skipped)
				}
				return
			case tt.wantOwner:
				if got != owner {
					t.Fatalf("GetBounded = %q, want owner %q", got, owner)
				}
			default:
				if _, ok := tt.loads[got]; !ok {
					t.Fatalf("GetBounded = %q, which is not eligible", got)
				}
			}
			if skipped != tt.wantSkipped {
				t.Fatalf("skipped = %v, want %v", skipped, tt.wantSkipped)
			}
		})
	}
}

// TestGetBoundedNeverExceedsCap assigns keys one by one on a ring whose
// loads only grow between occasional releases, and checks every pick
// against the cap of that moment and against the brute-force model.
func TestGetBoundedNeverExceedsCap(t *testing.T) {
	tests := []struct {
		members int
		vnodes  int
		c       float64
		hot     int // number of distinct keys requests draw from
	}{
		{4, 16, 1.25, 1},
		{4, 16, 1.25, 3},
		{7, 8, 1.1, 50},
		{16, 32, 1.5, 5},
		{16, 32, 1, 2000},
		{5, 4, 2, 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("n=%d,c=%v,hot=%d", tt.members, tt.c, tt.hot), func(t *testing.T) {
			ids := workers(tt.members)
			r := newRing(ids, WithVirtualNodes(tt.vnodes))
			pts := refRing(ids, tt.vnodes)
			ks := keys(tt.hot, uint64(tt.members))
			rng := rand.New(rand.NewPCG(uint64(tt.hot), 9))
			loads := map[string]int{}
			for _, id := range ids {
				loads[id] = 0
			}
			total := 0
			skips := 0
			for step := range 3000 {
				if total > 0 && rng.IntN(4) == 0 {
					// Release one request from a random loaded member.
					for {
						id := ids[rng.IntN(len(ids))]
						if loads[id] > 0 {
							loads[id]--
							total--
							break
						}
					}
					continue
				}
				k := ks[rng.IntN(len(ks))]
				limit := Cap(len(ids), total, tt.c)
				got, skipped := r.GetBounded(k, loads, tt.c)
				want, wantSkipped := refGetBounded(pts, k, loads, tt.c)
				if got != want || skipped != wantSkipped {
					t.Fatalf("step %d: GetBounded = %q, %v; model says %q, %v", step, got, skipped, want, wantSkipped)
				}
				if loads[got] >= limit {
					t.Fatalf("step %d: picked %s with load %d at cap %d", step, got, loads[got], limit)
				}
				if skipped {
					skips++
				}
				loads[got]++
				total++
			}
			if tt.hot < tt.members && skips == 0 {
				t.Fatal("a few hot keys never caused a skip: the bound is not applied")
			}
		})
	}
}

// TestGetBoundedFuncMatchesGetBounded checks the slice form against the map
// form, including ids off the ring, repeated ids and missing members.
func TestGetBoundedFuncMatchesGetBounded(t *testing.T) {
	type cand struct {
		id   string
		load int
	}
	r := newRing(workers(12), WithVirtualNodes(32))
	rng := rand.New(rand.NewPCG(11, 11))
	ks := keys(200, 5)
	for i, k := range ks {
		var cands []cand
		loads := map[string]int{}
		for j := range 14 {
			if rng.IntN(3) == 0 {
				continue
			}
			id := fmt.Sprintf("w%02d", j) // w12, w13 are not on the ring
			l := rng.IntN(6)
			cands = append(cands, cand{id, l})
			loads[id] = l
		}
		if len(cands) > 0 && i%3 == 0 {
			// A repeated id counts once, as its first entry.
			cands = append(cands, cand{cands[0].id, 100})
		}
		idx, skipped := r.GetBoundedFunc(k, len(cands), func(i int) (string, int) { return cands[i].id, cands[i].load }, 1.25)
		want, wantSkipped := r.GetBounded(k, loads, 1.25)
		got := ""
		if idx >= 0 {
			got = cands[idx].id
			for _, c := range cands[:idx] {
				if c.id == got {
					t.Fatalf("key %d: returned index %d, not the first entry of %s", i, idx, got)
				}
			}
		}
		if got != want || skipped != wantSkipped {
			t.Fatalf("key %d: GetBoundedFunc = %q, %v; GetBounded = %q, %v", i, got, skipped, want, wantSkipped)
		}
	}
	if idx, _ := r.GetBoundedFunc([]byte("k"), 0, nil, 1.25); idx != -1 {
		t.Fatalf("no candidates: index %d, want -1", idx)
	}
}

// TestGetBoundedPartialLoadsMatchesReference checks a larger ring where a
// quarter of the members are not eligible at each pick.
// TestGetBoundedFuncHintsFollowChanges reorders the candidates and changes
// the ring between calls, so that the slots remembered from the previous
// call are stale, and checks every pick against GetBounded.
func TestGetBoundedFuncHintsFollowChanges(t *testing.T) {
	r := newRing(workers(6), WithVirtualNodes(16))
	cands := workers(6)
	loads := map[string]int{}
	for i, id := range cands {
		loads[id] = i % 2
	}
	steps := []struct {
		name   string
		change func()
	}{
		{"first call", func() {}},
		{"same order", func() {}},
		{"reversed", func() { slices.Reverse(cands) }},
		{"member removed", func() { r.Remove("w03") }},
		{"slot reused by a new member", func() { r.Add("zz") }},
		{"new member becomes a candidate", func() { cands = append(cands, "zz"); loads["zz"] = 0 }},
		{"removed member added back", func() { r.Add("w03") }},
		{"fewer candidates", func() { cands = cands[2:]; delete(loads, "w05"); delete(loads, "w04") }},
	}
	ks := keys(64, 12)
	for _, st := range steps {
		st.change()
		for i, k := range ks {
			idx, skipped := r.GetBoundedFunc(k, len(cands), func(i int) (string, int) { return cands[i], loads[cands[i]] }, 1.25)
			want, wantSkipped := r.GetBounded(k, loads, 1.25)
			got := ""
			if idx >= 0 {
				got = cands[idx]
			}
			if got != want || skipped != wantSkipped {
				t.Fatalf("%s, key %d: GetBoundedFunc = %q, %v; GetBounded = %q, %v", st.name, i, got, skipped, want, wantSkipped)
			}
		}
	}
}

func TestGetBoundedPartialLoadsMatchesReference(t *testing.T) {
	n := 170
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "m" + strconv.Itoa(i)
	}
	r := newRing(ids, WithVirtualNodes(8))
	pts := refRing(ids, 8)
	rng := rand.New(rand.NewPCG(3, 3))
	for i, k := range keys(300, 6) {
		loads := map[string]int{}
		for _, id := range ids {
			if rng.IntN(4) != 0 {
				loads[id] = rng.IntN(3)
			}
		}
		got, skipped := r.GetBounded(k, loads, 1.25)
		want, wantSkipped := refGetBounded(pts, k, loads, 1.25)
		if got != want || skipped != wantSkipped {
			t.Fatalf("key %d: GetBounded = %q, %v; model says %q, %v", i, got, skipped, want, wantSkipped)
		}
	}
}

// benchSetup builds a ring of n members, a load map with every member
// eligible and a few over the cap, and 1024 keys to cycle through.
func benchSetup(n int) (*Ring, []string, map[string]int, [][]byte) {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("worker-%04d", i)
	}
	r := newRing(ids)
	loads := make(map[string]int, n)
	for i, id := range ids {
		loads[id] = i % 3
	}
	loads[ids[0]] = 50
	return r, ids, loads, keys(1024, 8)
}

func BenchmarkGetBounded(b *testing.B) {
	for _, n := range []int{4, 64, 1024} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			r, _, loads, ks := benchSetup(n)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.GetBounded(ks[i&1023], loads, 1.25)
				i++
			}
		})
	}
}

func BenchmarkGetBoundedFunc(b *testing.B) {
	for _, n := range []int{4, 64, 1024} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			r, ids, loads, ks := benchSetup(n)
			ls := make([]int, n)
			for i, id := range ids {
				ls[i] = loads[id]
			}
			cand := func(i int) (string, int) { return ids[i], ls[i] }
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.GetBoundedFunc(ks[i&1023], n, cand, 1.25)
				i++
			}
		})
	}
}

func BenchmarkGet(b *testing.B) {
	for _, n := range []int{4, 64, 1024} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			r, _, _, ks := benchSetup(n)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.Get(ks[i&1023])
				i++
			}
		})
	}
}
