package ring

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestHash64Golden(t *testing.T) {
	// Reference values of XXH64 with seed 0.
	tests := []struct {
		in   string
		want uint64
	}{
		{"", 0xef46db3751d8e999},
		{"a", 0xd24ec4f1a98c6e5b},
		{"abc", 0x44bc2cf5ad770999},
	}
	for _, tt := range tests {
		if got := Hash64([]byte(tt.in)); got != tt.want {
			t.Errorf("Hash64(%q) = %#x, want %#x", tt.in, got, tt.want)
		}
		if got := Hash64String(tt.in); got != tt.want {
			t.Errorf("Hash64String(%q) = %#x, want %#x", tt.in, got, tt.want)
		}
	}
}

func TestUniform(t *testing.T) {
	if got, want := Uniform(""), float64(uint64(0xef46db3751d8e999)>>11)/(1<<53); got != want {
		t.Fatalf("Uniform(\"\") = %v, want %v", got, want)
	}
	// Over 10000 request ids the mean is 1/2 within 4 standard deviations
	// (σ = 1/√(12·10000)), and every value lies in [0, 1).
	const n = 10000
	sum := 0.0
	for i := range n {
		u := Uniform("req-" + strconv.Itoa(i))
		if u < 0 || u >= 1 {
			t.Fatalf("Uniform = %v, outside [0, 1)", u)
		}
		sum += u
	}
	if mean, sd := sum/n, 1/math.Sqrt(12*n); math.Abs(mean-0.5) > 4*sd {
		t.Fatalf("mean %v, want 0.5 ± %v", mean, 4*sd)
	}
}

// workers returns the ids w00, w01, ... of n members.
func workers(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("w%02d", i)
	}
	return out
}

func newRing(ids []string, opts ...Option) *Ring {
	r := New(opts...)
	for _, id := range ids {
		r.Add(id)
	}
	return r
}

// keys returns n deterministic 64-byte keys.
func keys(n int, seed uint64) [][]byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([][]byte, n)
	for i := range out {
		k := make([]byte, 0, 64)
		for range 8 {
			k = binary.LittleEndian.AppendUint64(k, rng.Uint64())
		}
		out[i] = k
	}
	return out
}

// refPoint and refRing are a brute-force model of the ring: every point
// listed, sorted by (position, id), walked linearly.
type refPoint struct {
	hash uint64
	id   string
}

func refRing(ids []string, vnodes int) []refPoint {
	var pts []refPoint
	for _, id := range ids {
		for i := range vnodes {
			pts = append(pts, refPoint{Hash64String(id + "#" + strconv.Itoa(i)), id})
		}
	}
	slices.SortFunc(pts, func(a, b refPoint) int {
		if c := cmp.Compare(a.hash, b.hash); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return pts
}

func refStart(pts []refPoint, key []byte) int {
	h := Hash64(key)
	for i, p := range pts {
		if p.hash >= h {
			return i
		}
	}
	return 0
}

func refGet(pts []refPoint, key []byte) string {
	if len(pts) == 0 {
		return ""
	}
	return pts[refStart(pts, key)].id
}

func refGetBounded(pts []refPoint, key []byte, loads map[string]int, c float64) (string, bool) {
	onRing := map[string]bool{}
	for _, p := range pts {
		onRing[p.id] = true
	}
	n, m := 0, 0
	for id, l := range loads {
		if onRing[id] {
			n++
			m += max(l, 0)
		}
	}
	if n == 0 {
		return "", false
	}
	limit := Cap(n, m, c)
	owner := ""
	start := refStart(pts, key)
	for k := range pts {
		p := pts[(start+k)%len(pts)]
		l, ok := loads[p.id]
		if !ok {
			continue
		}
		if owner == "" {
			owner = p.id
		}
		if max(l, 0) < limit {
			return p.id, p.id != owner
		}
	}
	return "", false
}

func TestMembership(t *testing.T) {
	tests := []struct {
		name    string
		add     []string
		remove  []string
		members []string
	}{
		{"empty", nil, nil, []string{}},
		{"sorted", []string{"c", "a", "b"}, nil, []string{"a", "b", "c"}},
		{"duplicate add", []string{"a", "a", "b"}, nil, []string{"a", "b"}},
		{"empty id ignored", []string{"", "a"}, nil, []string{"a"}},
		{"remove", []string{"a", "b", "c"}, []string{"b"}, []string{"a", "c"}},
		{"remove absent", []string{"a"}, []string{"z"}, []string{"a"}},
		{"remove all", []string{"a", "b"}, []string{"a", "b"}, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := New(WithVirtualNodes(8))
			for _, id := range tt.add {
				r.Add(id)
			}
			for _, id := range tt.remove {
				r.Remove(id)
			}
			if got := r.Members(); !slices.Equal(got, tt.members) {
				t.Errorf("Members() = %v, want %v", got, tt.members)
			}
			if r.Len() != len(tt.members) {
				t.Errorf("Len() = %d, want %d", r.Len(), len(tt.members))
			}
			if got, want := len(r.hashes), 8*len(tt.members); got != want {
				t.Errorf("%d points, want %d", got, want)
			}
			for _, id := range tt.members {
				if !r.Has(id) {
					t.Errorf("Has(%q) = false", id)
				}
			}
			for _, id := range tt.remove {
				if r.Has(id) {
					t.Errorf("Has(%q) = true after Remove", id)
				}
			}
		})
	}
}

func TestGetEmptyRing(t *testing.T) {
	var zero Ring
	for _, r := range []*Ring{New(), &zero} {
		if got := r.Get([]byte("k")); got != "" {
			t.Errorf("Get on an empty ring = %q, want \"\"", got)
		}
		if got, skipped := r.GetBounded([]byte("k"), map[string]int{"a": 0}, 1.25); got != "" || skipped {
			t.Errorf("GetBounded on an empty ring = %q, %v", got, skipped)
		}
	}
}

func TestZeroValueUsesDefaultVirtualNodes(t *testing.T) {
	var r Ring
	r.Add("a")
	if got := len(r.hashes); got != DefaultVirtualNodes {
		t.Fatalf("zero Ring has %d points per member, want %d", got, DefaultVirtualNodes)
	}
	if got := r.Get([]byte("k")); got != "a" {
		t.Fatalf("Get = %q, want a", got)
	}
}

// TestGetMatchesReference checks Get, through adds, removes and slot reuse,
// against the brute-force ring.
func TestGetMatchesReference(t *testing.T) {
	const vnodes = 16
	rng := rand.New(rand.NewPCG(7, 7))
	r := New(WithVirtualNodes(vnodes))
	live := map[string]bool{}
	ks := keys(300, 1)
	for step := range 60 {
		id := fmt.Sprintf("m%d", rng.IntN(20))
		if live[id] {
			r.Remove(id)
			delete(live, id)
		} else {
			r.Add(id)
			live[id] = true
		}
		ids := make([]string, 0, len(live))
		for id := range live {
			ids = append(ids, id)
		}
		pts := refRing(ids, vnodes)
		for _, k := range ks {
			if got, want := r.Get(k), refGet(pts, k); got != want {
				t.Fatalf("step %d: Get = %q, want %q", step, got, want)
			}
		}
	}
}

func TestDeterministicAcrossInsertionOrder(t *testing.T) {
	ids := workers(16)
	a := newRing(ids)
	rev := slices.Clone(ids)
	slices.Reverse(rev)
	b := newRing(rev)
	// c reaches the same membership through removals (slots reused).
	c := newRing(append(workers(20), "x", "y"))
	for _, id := range []string{"w17", "x", "w16", "w19", "y", "w18"} {
		c.Remove(id)
	}
	if !slices.Equal(a.hashes, b.hashes) || !slices.Equal(a.hashes, c.hashes) {
		t.Fatal("point positions depend on insertion order")
	}
	for _, k := range keys(2000, 2) {
		ga, gb, gc := a.Get(k), b.Get(k), c.Get(k)
		if ga != gb || ga != gc {
			t.Fatalf("Get differs by insertion order: %q %q %q", ga, gb, gc)
		}
	}
}

func TestBalance(t *testing.T) {
	tests := []struct {
		members int
		keys    int
	}{
		{4, 20000},
		{16, 40000},
		{64, 32000},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.members), func(t *testing.T) {
			r := newRing(workers(tt.members))
			count := map[string]int{}
			for _, k := range keys(tt.keys, 3) {
				count[r.Get(k)]++
			}
			mean := float64(tt.keys) / float64(tt.members)
			for _, id := range workers(tt.members) {
				if f := float64(count[id]) / mean; f < 0.6 || f > 1.5 {
					t.Errorf("%s holds %.2f× the mean share of keys, want within [0.6, 1.5]", id, f)
				}
			}
		})
	}
}

func TestMinimalMovement(t *testing.T) {
	const n = 10
	ks := keys(20000, 4)
	before := newRing(workers(n))
	owner := make([]string, len(ks))
	for i, k := range ks {
		owner[i] = before.Get(k)
	}

	t.Run("add", func(t *testing.T) {
		r := newRing(workers(n))
		r.Add("new")
		moved := 0
		for i, k := range ks {
			if got := r.Get(k); got != owner[i] {
				moved++
				if got != "new" {
					t.Fatalf("key moved from %s to %s, not to the added member", owner[i], got)
				}
			}
		}
		checkFraction(t, moved, len(ks), 1.0/(n+1))
	})
	t.Run("remove", func(t *testing.T) {
		r := newRing(workers(n))
		r.Remove("w03")
		moved := 0
		for i, k := range ks {
			if got := r.Get(k); got != owner[i] {
				moved++
				if owner[i] != "w03" {
					t.Fatalf("key of %s moved to %s though only w03 left", owner[i], got)
				}
			} else if got == "w03" {
				t.Fatal("a key is still owned by the removed member")
			}
		}
		checkFraction(t, moved, len(ks), 1.0/n)
	})
}

func checkFraction(t *testing.T, moved, total int, ideal float64) {
	t.Helper()
	f := float64(moved) / float64(total)
	if f < ideal/2 || f > ideal*1.5 {
		t.Errorf("%.3f of keys moved, want about %.3f", f, ideal)
	}
}

func TestCap(t *testing.T) {
	tests := []struct {
		name string
		n, m int
		c    float64
		want int
	}{
		{"design 2.3 worked example", 4, 3, 1.25, 2},
		{"all idle", 4, 0, 1.25, 1},
		{"exact", 4, 7, 1, 2},
		{"decimal factor", 11, 9, 1.1, 1},
		{"factor below 1 counts as 1", 4, 7, 0.5, 2},
		{"NaN counts as 1", 4, 7, math.NaN(), 2},
		{"unbounded", 4, 7, math.Inf(1), math.MaxInt},
		{"no members", 0, 5, 1.25, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Cap(tt.n, tt.m, tt.c); got != tt.want {
				t.Errorf("Cap(%d, %d, %v) = %d, want %d", tt.n, tt.m, tt.c, got, tt.want)
			}
		})
	}
}

// TestGetBoundedWorkedExample is design section 2.3: 4 workers, c = 1.25,
// 3 requests in flight on the owner and none elsewhere give the cap
// ⌈1.25·4/4⌉ = 2, so the owner is skipped for the next member clockwise.
func TestGetBoundedWorkedExample(t *testing.T) {
	ids := workers(4)
	r := newRing(ids)
	key := []byte("system: you are a helpful assistant\nuser: hello there, how are y")
	owner := r.Get(key)
	loads := map[string]int{}
	for _, id := range ids {
		loads[id] = 0
	}

	got, skipped := r.GetBounded(key, loads, 1.25)
	if got != owner || skipped {
		t.Fatalf("idle: GetBounded = %q, skipped=%v; want the owner %q, not skipped", got, skipped, owner)
	}

	loads[owner] = 3
	if c := Cap(4, 3, 1.25); c != 2 {
		t.Fatalf("cap = %d, want 2", c)
	}
	got, skipped = r.GetBounded(key, loads, 1.25)
	if got == owner || !skipped {
		t.Fatalf("owner loaded 3: GetBounded = %q, skipped=%v; want another member, skipped", got, skipped)
	}
	// The next member clockwise is the owner of the key once the owner is
	// gone from the ring.
	r2 := newRing(ids)
	r2.Remove(owner)
	if want := r2.Get(key); got != want {
		t.Fatalf("skipped to %q, want the next member clockwise %q", got, want)
	}

	// Around the cap: the owner is taken exactly while its load is below it.
	tests := []struct {
		ownerLoad int
		c         float64
		wantOwner bool
	}{
		{0, 1, true},     // cap ⌈1·1/4⌉ = 1
		{1, 1.25, false}, // cap ⌈1.25·2/4⌉ = 1
		{1, 3, true},     // cap ⌈3·2/4⌉ = 2
		{2, 1.25, false}, // cap ⌈1.25·3/4⌉ = 1
		{2, 3, true},     // cap ⌈3·3/4⌉ = 3
		{3, 3, false},    // cap ⌈3·4/4⌉ = 3
	}
	for _, tt := range tests {
		loads[owner] = tt.ownerLoad
		got, skipped := r.GetBounded(key, loads, tt.c)
		if (got == owner) != tt.wantOwner || skipped == tt.wantOwner {
			t.Errorf("owner load %d, c=%v: GetBounded = %q, skipped=%v; want owner=%v",
				tt.ownerLoad, tt.c, got, skipped, tt.wantOwner)
		}
	}
}
