package tlbench

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

func TestFrameIs(t *testing.T) {
	cases := []struct {
		name, fn string
		want     bool
	}{
		{"github.com/tlgate/tlgate/internal/adapter/fleetsync.(*Client).run", "fleetsync.(*Client).run", true},
		{"github.com/tlgate/tlgate/internal/adapter/fleetsync.(*Client).run.func1", "fleetsync.(*Client).run", true},
		{"github.com/tlgate/tlgate/internal/adapter/fleetsync.(*Client).runner", "fleetsync.(*Client).run", false},
		{"github.com/nats-io/nats%2ego.(*Conn).readLoop", "nats.go.(*Conn).readLoop", true},
		{"github.com/nats-io/nats.go.(*Conn).readLoop", "nats.go.(*Conn).readLoop", true},
		{"runtime.schedule", "runtime.schedule", true},
		{"runtime.scheduleX", "runtime.schedule", false},
		{"github.com/other/fleetsync.(*Client).enqueue", "fleetsync.(*Client).enqueue", true},
	}
	for _, tc := range cases {
		if got := frameIs(tc.name, tc.fn); got != tc.want {
			t.Errorf("frameIs(%q, %q) = %v, want %v", tc.name, tc.fn, got, tc.want)
		}
	}
}

// cpuProfileOf builds a Go-shaped CPU profile: one sample of each stack
// (leaf first), each of ns nanoseconds.
func cpuProfileOf(t *testing.T, ns int64, stacks ...[]string) []byte {
	t.Helper()
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     10_000_000,
	}
	fns := map[string]*profile.Function{}
	for _, stack := range stacks {
		s := &profile.Sample{Value: []int64{1, ns}}
		for _, name := range stack {
			f := fns[name]
			if f == nil {
				f = &profile.Function{ID: uint64(len(fns) + 1), Name: name}
				fns[name] = f
				p.Function = append(p.Function, f)
			}
			loc := &profile.Location{ID: uint64(len(p.Location) + 1), Line: []profile.Line{{Function: f}}}
			p.Location = append(p.Location, loc)
			s.Location = append(s.Location, loc)
		}
		p.Sample = append(p.Sample, s)
	}
	var b bytes.Buffer
	if err := p.Write(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func bucketIndex(t *testing.T, label string) int {
	t.Helper()
	for i, b := range profileBuckets {
		if b.label == label {
			return i
		}
	}
	t.Fatalf("no bucket %q", label)
	return -1
}

func TestClassify(t *testing.T) {
	const tlg = "github.com/tlgate/tlgate/"
	data := cpuProfileOf(t, 10_000_000,
		// RecordPeer under ApplyPeer: the first bucket that takes it.
		[]string{tlg + "internal/routing/prefixindex.(*Index).record", tlg + "internal/routing/prefixindex.(*Index).RecordPeer", tlg + "actors/router.(*State).ApplyPeer", tlg + "actors/router.(*routerActor).Receive"},
		[]string{"runtime.mapaccess1_fast64", tlg + "actors/router.(*State).ApplyPeer"},
		[]string{"syscall.Syscall", "github.com/nats-io/nats%2ego.(*Conn).readLoop"},
		[]string{"syscall.Syscall", "github.com/nats-io/nats%2ego.(*Conn).flusher"},
		[]string{"runtime.futex", "runtime.notewakeup", "runtime.wakep", tlg + "internal/adapter/fleetsync.(*Client).enqueue"},
		[]string{"runtime.futex", "runtime.stopm", "runtime.findRunnable", "runtime.schedule"},
		[]string{"runtime.scanobject", "runtime.gcBgMarkWorker"},
		[]string{"net/http.(*conn).serve"},
		[]string{"net/http.(*conn).serve"},
	)
	p, err := classify(data)
	if err != nil {
		t.Fatal(err)
	}
	if p.total() != 90*time.Millisecond {
		t.Fatalf("total %v, want 90ms", p.total())
	}
	want := map[string]time.Duration{
		"prefix index: recording peers' hashes":               10 * time.Millisecond,
		"router: applying peers' batches, the rest":           10 * time.Millisecond,
		"NATS client: reading":                                10 * time.Millisecond,
		"NATS client: writing":                                10 * time.Millisecond,
		"fleet sync: publishing (queue and batcher)":          10 * time.Millisecond,
		"Go scheduler: finding work, parking, waking threads": 10 * time.Millisecond,
		"Go garbage collector, in the background":             10 * time.Millisecond,
		"everything else: serving, proxying, routing":         20 * time.Millisecond,
	}
	for _, b := range profileBuckets {
		if got := p.by[bucketIndex(t, b.label)]; got != want[b.label] {
			t.Errorf("%s: %v, want %v", b.label, got, want[b.label])
		}
	}

	heap := &profile.Profile{SampleType: []*profile.ValueType{{Type: "inuse_space", Unit: "bytes"}}}
	var hb bytes.Buffer
	if err := heap.Write(&hb); err != nil {
		t.Fatal(err)
	}
	if _, err := classify(hb.Bytes()); err == nil {
		t.Error("a heap profile classified as a CPU profile")
	}
	if _, err := classify([]byte("<html>not a profile</html>")); err == nil {
		t.Error("garbage classified as a CPU profile")
	}
}

func TestProfileTable(t *testing.T) {
	ms := time.Millisecond
	prof := func(other, record time.Duration, requests int64) *cpuProfile {
		p := &cpuProfile{by: make([]time.Duration, len(profileBuckets)), requests: requests}
		p.by[len(profileBuckets)-1] = other
		p.by[0] = record
		return p
	}
	runs := []costRun{
		{sync: false, profile: prof(500*ms, 0, 500)},
		{sync: true, profile: prof(500*ms, 100*ms, 500)},
		{sync: false, profile: prof(300*ms, 0, 500)},
		{sync: true, profile: prof(300*ms, 60*ms, 500)},
		{sync: true}, // a run without a profile counts for nothing
	}
	tab := profileTable(runs)
	if len(tab.rows) != len(profileBuckets)+1 {
		t.Fatalf("%d rows, want a bucket each and the total", len(tab.rows))
	}
	record := tab.rows[0]
	// 160 ms over 1000 requests: 160 µs each, 160/960 of the profile.
	if want := []string{profileBuckets[0].label, "0.0", "0.0%", "160.0", "16.7%", "+160.0"}; !slices.Equal(record, want) {
		t.Errorf("record row %q, want %q", record, want)
	}
	total := tab.rows[len(tab.rows)-1]
	if want := []string{"all of the profile", "800.0", "100.0%", "960.0", "100.0%", "+160.0"}; !slices.Equal(total, want) {
		t.Errorf("total row %q, want %q", total, want)
	}
	empty := profileTable(nil)
	if got := empty.rows[len(empty.rows)-1]; got[2] != "–" || got[1] != "0.0" {
		t.Errorf("no profiles: total row %q", got)
	}
}

func TestProfileSeconds(t *testing.T) {
	cases := []struct {
		window time.Duration
		want   int
	}{{6 * time.Second, 5}, {2 * time.Second, 1}, {1500 * time.Millisecond, 1}, {5999 * time.Millisecond, 5}}
	for _, tc := range cases {
		if got, err := profileSeconds(tc.window); err != nil || got != tc.want {
			t.Errorf("profileSeconds(%v) = %d, %v; want %d", tc.window, got, err, tc.want)
		}
	}
	if _, err := profileSeconds(time.Second); !errors.Is(err, errWindowTooShort) {
		t.Errorf("a 1s window: %v, want errWindowTooShort", err)
	}
}

// TestShareProfileWindowCheckedFirst: a window too short to profile is
// refused before any run starts, not after the whole fleet's runs.
func TestShareProfileWindowCheckedFirst(t *testing.T) {
	c := Preset(true)
	c.ShareProfile, c.OpenDuration, c.OpenWarmup = true, 1500*time.Millisecond, time.Second
	spec := func(int, bool, string) replicaSpec {
		t.Fatal("a run started")
		return replicaSpec{}
	}
	if _, _, err := syncCostReport(t.Context(), c, spec, io.Discard); !errors.Is(err, errWindowTooShort) {
		t.Fatalf("err %v, want errWindowTooShort", err)
	}
}
