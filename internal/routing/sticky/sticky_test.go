package sticky

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestMap(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name string
		run  func(m *Map) (string, bool)
		want string
		ok   bool
	}{
		{"put then get", func(m *Map) (string, bool) {
			m.Put("r1", "w1", t0)
			return m.Worker("r1", t0.Add(time.Minute))
		}, "w1", true},
		{"unknown id", func(m *Map) (string, bool) { return m.Worker("nope", t0) }, "", false},
		{"expired after the TTL", func(m *Map) (string, bool) {
			m.Put("r1", "w1", t0)
			return m.Worker("r1", t0.Add(10*time.Minute))
		}, "", false},
		{"a later put renews", func(m *Map) (string, bool) {
			m.Put("r1", "w1", t0)
			m.Put("r1", "w2", t0.Add(8*time.Minute))
			return m.Worker("r1", t0.Add(12*time.Minute))
		}, "w2", true},
		{"forgotten", func(m *Map) (string, bool) {
			m.Put("r1", "w1", t0)
			m.Forget("r1")
			return m.Worker("r1", t0)
		}, "", false},
		{"the oldest goes when full", func(m *Map) (string, bool) {
			for i := range 4 {
				m.Put(fmt.Sprintf("r%d", i), "w", t0.Add(time.Duration(i)*time.Second))
			}
			return m.Worker("r0", t0.Add(5*time.Second))
		}, "", false},
		{"the newest stays when full", func(m *Map) (string, bool) {
			for i := range 4 {
				m.Put(fmt.Sprintf("r%d", i), fmt.Sprintf("w%d", i), t0.Add(time.Duration(i)*time.Second))
			}
			return m.Worker("r3", t0.Add(5*time.Second))
		}, "w3", true},
		{"empty ids are not recorded", func(m *Map) (string, bool) {
			m.Put("", "w1", t0)
			return m.Worker("", t0)
		}, "", false},
		{"a peer's entry is found", func(m *Map) (string, bool) {
			m.PutPeer("r1", "w1", time.Minute, t0)
			return m.Worker("r1", t0.Add(59*time.Second))
		}, "w1", true},
		{"a peer's entry lives its own ttl", func(m *Map) (string, bool) {
			m.PutPeer("r1", "w1", time.Minute, t0)
			return m.Worker("r1", t0.Add(time.Minute))
		}, "", false},
		{"a peer's entry lives at most the TTL", func(m *Map) (string, bool) {
			m.PutPeer("r1", "w1", 24*time.Hour, t0)
			return m.Worker("r1", t0.Add(10*time.Minute))
		}, "", false},
		{"the own entry wins over a peer's", func(m *Map) (string, bool) {
			m.Put("r1", "w1", t0)
			m.PutPeer("r1", "liar", time.Minute, t0.Add(time.Second))
			return m.Worker("r1", t0.Add(2*time.Second))
		}, "w1", true},
		{"a peer's forget keeps the own entry", func(m *Map) (string, bool) {
			m.Put("r1", "w1", t0)
			m.PutPeer("r1", "w1", time.Minute, t0)
			m.ForgetPeer("r1")
			return m.Worker("r1", t0)
		}, "w1", true},
		{"a peer's forget drops the peer's entry", func(m *Map) (string, bool) {
			m.PutPeer("r1", "w1", time.Minute, t0)
			m.ForgetPeer("r1")
			return m.Worker("r1", t0)
		}, "", false},
		{"the own forget drops a peer's entry too", func(m *Map) (string, bool) {
			m.PutPeer("r1", "w1", time.Minute, t0)
			m.Forget("r1")
			return m.Worker("r1", t0)
		}, "", false},
		{"a flood of peers' entries keeps the own ones", func(m *Map) (string, bool) {
			m.Put("mine", "w1", t0)
			for i := range 100 {
				m.PutPeer(fmt.Sprintf("p%d", i), "w2", time.Minute, t0)
			}
			return m.Worker("mine", t0)
		}, "w1", true},
		{"the oldest peer's entry goes when its share is full", func(m *Map) (string, bool) {
			for i := range 4 {
				m.PutPeer(fmt.Sprintf("p%d", i), "w2", time.Minute, t0)
			}
			return m.Worker("p0", t0)
		}, "", false},
		{"a peer's id too long", func(m *Map) (string, bool) {
			id := strings.Repeat("x", MaxIDBytes+1)
			if m.PutPeer(id, "w1", time.Minute, t0) {
				return "recorded", true
			}
			return m.Worker(id, t0)
		}, "", false},
		{"a peer's ttl not positive", func(m *Map) (string, bool) {
			if m.PutPeer("r1", "w1", 0, t0) {
				return "recorded", true
			}
			return m.Worker("r1", t0)
		}, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{TTL: 10 * time.Minute, MaxEntries: 3})
			got, ok := tc.run(m)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("got %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
			if own, peer := m.Len(); own > 3 || peer > 3 {
				t.Fatalf("Len %d, %d over MaxEntries", own, peer)
			}
		})
	}
}

func TestExport(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := New(Config{TTL: 10 * time.Minute, MaxEntries: 3})
	m.Put("old", "w1", t0)
	m.Put("mine", "w1", t0.Add(6*time.Minute))
	m.Put("both", "w2", t0.Add(7*time.Minute))
	m.PutPeer("both", "liar", time.Hour, t0.Add(7*time.Minute))
	m.PutPeer("theirs", "w3", 5*time.Minute, t0.Add(7*time.Minute))
	m.PutPeer("gone", "w3", time.Minute, t0.Add(7*time.Minute))
	// Too long to share:
	m.Put(strings.Repeat("x", MaxIDBytes+1), "w1", t0.Add(7*time.Minute))
	// "old" and "gone" have lived their time:
	now := t0.Add(10 * time.Minute)
	type entry struct {
		id, worker string
		ttl        time.Duration
	}
	var got []entry
	export := func(id, worker string, ttl time.Duration) { got = append(got, entry{id, worker, ttl}) }
	m.Export(10, now, export)
	want := []entry{{"both", "w2", 7 * time.Minute}, {"mine", "w1", 6 * time.Minute}, {"theirs", "w3", 2 * time.Minute}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Export\n got %+v\nwant %+v", got, want)
	}
	got = nil
	m.Export(1, now, export)
	if len(got) != 1 || got[0].id != "both" {
		t.Fatalf("Export(1) = %+v, want the newest", got)
	}
}
