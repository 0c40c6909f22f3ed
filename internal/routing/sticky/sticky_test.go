package sticky

import (
	"fmt"
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
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{TTL: 10 * time.Minute, MaxEntries: 3})
			got, ok := tc.run(m)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("got %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
			if m.Len() > 3 {
				t.Fatalf("Len %d over MaxEntries", m.Len())
			}
		})
	}
}
