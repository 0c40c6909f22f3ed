package flowqueue

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// op is one step of a scripted run: push an entry named name ("p:key/flow
// @dueMs" style fields), pop n, remove name, or shed below a priority.
type op struct {
	push   *spec
	pop    int
	remove string
	shed   *int
}

type spec struct {
	name      string
	prio      int
	key, flow string
	dueMs     int
}

func push(name string, prio int, key, flow string, dueMs int) op {
	return op{push: &spec{name, prio, key, flow, dueMs}}
}
func pop(n int) op          { return op{pop: n} }
func remove(name string) op { return op{remove: name} }
func shedBelow(p int) op    { return op{shed: &p} }
func names(es []*Entry[string]) string {
	var s []string
	for _, e := range es {
		s = append(s, e.Value)
	}
	return strings.Join(s, " ")
}

// run applies ops and returns the names popped (and shed, in brackets).
func run(t *testing.T, ops []op) (string, *Queue[string]) {
	t.Helper()
	q := New[string]()
	byName := map[string]*Entry[string]{}
	var seq uint64
	var out []string
	for _, o := range ops {
		switch {
		case o.push != nil:
			seq++
			p := o.push
			byName[p.name] = q.Push(Item{Priority: p.prio, Key: p.key, Flow: p.flow,
				Due: t0.Add(time.Duration(p.dueMs) * time.Millisecond), Arrived: t0, Seq: seq}, p.name)
		case o.remove != "":
			if !q.Remove(byName[o.remove]) {
				t.Fatalf("remove %s: not queued", o.remove)
			}
		case o.shed != nil:
			out = append(out, "["+names(q.ShedBelow(*o.shed))+"]")
		default:
			for range o.pop {
				e := q.Peek()
				if e == nil {
					out = append(out, "-")
					continue
				}
				q.Served(e)
				out = append(out, e.Value)
			}
		}
	}
	return strings.Join(out, " "), q
}

func TestOrder(t *testing.T) {
	cases := []struct {
		name string
		ops  []op
		want string
	}{
		{"higher band always first",
			[]op{push("lo1", 0, "a", "", 1), push("lo2", 0, "b", "", 2), push("hi1", 5, "c", "", 9), push("neg", -1, "a", "", 0), pop(4)},
			"hi1 lo1 lo2 neg"},
		{"keys take turns, a new key after those waiting",
			[]op{push("a1", 0, "a", "", 1), push("a2", 0, "a", "", 2), push("a3", 0, "a", "", 3), push("a4", 0, "a", "", 4),
				push("b1", 0, "b", "", 5), push("b2", 0, "b", "", 6), pop(2), push("c1", 0, "c", "", 7), pop(5)},
			"a1 b1 a2 b2 c1 a3 a4"},
		{"deadline order inside a flow",
			[]op{push("late", 0, "a", "", 900), push("soon", 0, "a", "", 100), push("mid", 0, "a", "", 500), pop(3)},
			"soon mid late"},
		{"equal deadlines by arrival",
			[]op{push("x", 0, "a", "", 100), push("y", 0, "a", "", 100), pop(2)},
			"x y"},
		{"fairness ids take turns inside a key, the key keeps its share",
			[]op{push("u1", 0, "a", "u", 1), push("u2", 0, "a", "u", 2), push("u3", 0, "a", "u", 3), push("v1", 0, "a", "v", 4),
				push("w1", 0, "a", "w", 5), push("b1", 0, "b", "", 6), push("b2", 0, "b", "", 7), push("b3", 0, "b", "", 8), pop(8)},
			"u1 b1 v1 b2 w1 b3 u2 u3"},
		{"a higher band arriving goes before the lower band's turn",
			[]op{push("a1", 0, "a", "", 1), push("a2", 0, "a", "", 2), pop(1), push("h", 3, "z", "", 50), pop(2)},
			"a1 h a2"},
		{"remove passes no turn",
			[]op{push("a1", 0, "a", "", 1), push("b1", 0, "b", "", 2), push("a2", 0, "a", "", 3), remove("a1"), pop(3)},
			"a2 b1 -"},
		{"shed takes the sheddable bands below the priority",
			[]op{push("n2", -2, "a", "", 1), push("n1", -1, "b", "", 2), push("z", 0, "c", "", 3), shedBelow(0), pop(2)},
			"[n2 n1] z -"},
		{"shed below a sheddable priority keeps it",
			[]op{push("n2", -2, "a", "", 1), push("n1", -1, "b", "", 2), shedBelow(-1), pop(2)},
			"[n2] n1 -"},
		{"shed keeps non-negative bands whatever p",
			[]op{push("z", 0, "c", "", 3), shedBelow(10), pop(1)},
			"[] z"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got, _ := run(t, c.ops); got != c.want {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
}

func TestEmptyQueue(t *testing.T) {
	q := New[string]()
	if q.Peek() != nil || q.Turn(4) != nil || q.Len() != 0 || q.Victim(Item{}) != nil {
		t.Fatal("empty queue has entries")
	}
	if _, ok := q.Oldest(); ok {
		t.Fatal("empty queue has an oldest")
	}
	if _, ok := q.Highest(); ok {
		t.Fatal("empty queue has a band")
	}
	e := q.Push(Item{Key: "a", Seq: 1, Arrived: t0}, "x")
	q.Served(e)
	if q.Remove(e) || e.Queued() || q.Len() != 0 || len(q.Bands()) != 0 {
		t.Fatalf("entry still queued: %+v", q)
	}
}

func TestTurnAndServedOutOfOrder(t *testing.T) {
	q := New[string]()
	var es []*Entry[string]
	for i, k := range []string{"a", "a", "a", "b"} {
		es = append(es, q.Push(Item{Key: k, Due: t0.Add(time.Duration(i) * time.Second), Seq: uint64(i + 1)}, fmt.Sprintf("%s%d", k, i)))
	}
	if got := names(q.Turn(2)); got != "a0 a1" {
		t.Fatalf("turn %q", got)
	}
	// Serving a later entry of the flow whose turn it is passes the turn.
	q.Served(es[2])
	if got := q.Peek().Value; got != "b3" {
		t.Fatalf("after serving a2 in a's turn, next %q, want b3", got)
	}
}

func TestAhead(t *testing.T) {
	q := New[string]()
	var seq uint64
	add := func(prio int, key, flow string, due int) *Entry[string] {
		seq++
		return q.Push(Item{Priority: prio, Key: key, Flow: flow, Due: t0.Add(time.Duration(due) * time.Millisecond), Seq: seq}, fmt.Sprint(seq))
	}
	add(5, "h", "", 0)
	add(5, "h", "", 1)
	a := []*Entry[string]{add(0, "a", "", 10), add(0, "a", "", 20), add(0, "a", "", 30)}
	add(0, "b", "", 5)
	b2 := add(0, "b", "", 6)
	add(0, "c", "", 1)
	add(-1, "s", "", 0)
	cases := []struct {
		e    *Entry[string]
		want int
	}{
		{a[0], 2 + 0 + 1 + 1}, // the high band, then one of b and one of c
		{a[2], 2 + 2 + 2 + 1}, // b has only 2, c only 1
		{b2, 2 + 1 + 2 + 1},
	}
	for i, c := range cases {
		if got := q.Ahead(c.e); got != c.want {
			t.Errorf("case %d: ahead %d, want %d", i, got, c.want)
		}
	}
	// AheadOf an entry not yet pushed agrees with Ahead once it is.
	for _, it := range []Item{
		{Priority: 0, Key: "a", Due: t0.Add(15 * time.Millisecond), Seq: 100},
		{Priority: 0, Key: "d", Due: t0, Seq: 101},
		{Priority: 5, Key: "h", Due: t0.Add(time.Second), Seq: 102},
		{Priority: 9, Key: "x", Seq: 103},
		{Priority: -3, Key: "x", Seq: 104},
		{Priority: 0, Key: "a", Flow: "u", Due: t0, Seq: 105},
	} {
		want := q.AheadOf(it)
		e := q.Push(it, "probe")
		if got := q.Ahead(e); got != want {
			t.Errorf("%+v: AheadOf %d, Ahead once pushed %d", it, want, got)
		}
		q.Remove(e)
	}
}

func TestVictim(t *testing.T) {
	q := New[string]()
	var seq uint64
	add := func(prio int, key string, due int) *Entry[string] {
		seq++
		return q.Push(Item{Priority: prio, Key: key, Due: t0.Add(time.Duration(due) * time.Millisecond), Seq: seq}, fmt.Sprint(key, due))
	}
	add(0, "a", 1)
	add(0, "a", 3)
	add(0, "a", 2)
	add(0, "b", 1)
	neg := add(-1, "s", 1)
	// A higher priority than the lowest band: the lowest gives way.
	if v := q.Victim(Item{Priority: 0, Key: "a"}); v != neg {
		t.Fatalf("victim %v, want the sheddable entry", v)
	}
	q.Remove(neg)
	// Same band: only a key with two fewer than the heaviest displaces,
	// the heaviest key's latest due.
	if v := q.Victim(Item{Priority: 0, Key: "b"}); v == nil || v.Value != "a3" {
		t.Fatalf("b (1 waiting against 3) displaces a's latest: got %v", v)
	}
	add(0, "b", 4)
	if v := q.Victim(Item{Priority: 0, Key: "b"}); v != nil {
		t.Fatalf("b (2 waiting against 3) displaced %v", v.Value)
	}
	if v := q.Victim(Item{Priority: 0, Key: "c"}); v == nil || v.Value != "a3" {
		t.Fatalf("victim for c: %v", v)
	}
	if v := q.Victim(Item{Priority: 0, Key: "a"}); v != nil {
		t.Fatal("a key displaced its own entry")
	}
	if v := q.Victim(Item{Priority: -5, Key: "z"}); v != nil {
		t.Fatal("a lower priority than every band displaced an entry")
	}
	if v := q.Victim(Item{Priority: 1, Key: "a"}); v == nil || v.Value != "a3" {
		t.Fatalf("higher priority, same key: %v", v)
	}
}

func TestCountsAndOldest(t *testing.T) {
	q := New[string]()
	q.Push(Item{Priority: 0, Key: "b", Arrived: t0.Add(time.Second), Seq: 1}, "1")
	q.Push(Item{Priority: 0, Key: "a", Arrived: t0.Add(2 * time.Second), Seq: 2}, "2")
	q.Push(Item{Priority: 3, Key: "b", Arrived: t0.Add(3 * time.Second), Seq: 3}, "3")
	q.Push(Item{Priority: 0, Key: "b", Arrived: t0, Seq: 4}, "4")
	got := fmt.Sprint(q.Counts())
	if want := "[{3 b 1} {0 a 1} {0 b 2}]"; got != want {
		t.Fatalf("counts %s, want %s", got, want)
	}
	if o, ok := q.Oldest(); !ok || !o.Equal(t0) {
		t.Fatalf("oldest %v", o)
	}
	if fmt.Sprint(q.Bands()) != "[3 0]" {
		t.Fatalf("bands %v", q.Bands())
	}
	if h, _ := q.Highest(); h != 3 {
		t.Fatalf("highest %d", h)
	}
}
