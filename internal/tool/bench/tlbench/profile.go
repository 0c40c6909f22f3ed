package tlbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// profileSlack is the part of a run's recorded window a CPU profile
// leaves free at its end, so that it is fetched before the run stops.
const profileSlack = 500 * time.Millisecond

// errWindowTooShort: a run's recorded window cannot hold a profile of
// whole seconds.
var errWindowTooShort = errors.New("tlbench: the recorded window is too short to profile")

// profileSeconds is the length of the CPU profile taken over a recorded
// window of w: whole seconds, ending profileSlack before the window does.
func profileSeconds(w time.Duration) (int, error) {
	s := int((w - profileSlack) / time.Second)
	if s < 1 {
		return 0, fmt.Errorf("%w: %v, want at least %v (-open-duration minus -open-warmup)", errWindowTooShort, w, time.Second+profileSlack)
	}
	return s, nil
}

// fetchProfile takes a CPU profile of seconds from the gateway at base
// (its /debug/pprof/, served with pprof = true).
func fetchProfile(ctx context.Context, base string, seconds int) ([]byte, error) {
	b, err := fetch(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, seconds))
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return b, nil
}

// profileBucket is one place a gateway's CPU goes: the samples with any
// of funcs on their stack (see frameIs) that no earlier bucket took.
type profileBucket struct {
	label string
	funcs []string
}

// profileBuckets split a synced gateway's CPU the way docs/BENCHMARKS.md
// discusses it: sync's own paths first, then the Go runtime's scheduling
// and collection, then the rest. A sample goes to the first bucket that
// takes it.
var profileBuckets = []profileBucket{
	{"prefix index: recording peers' hashes", []string{"prefixindex.(*Index).RecordPeer"}},
	{"router: applying peers' batches, the rest", []string{"router.(*State).ApplyPeer", "router.(*State).ApplySnapshot"}},
	{"fleet sync: receiving (decoding, checks)", []string{"fleetsync.(*Client).onEvents", "fleetsync.(*Client).onSnapshotRequest"}},
	{"fleet sync: publishing (queue and batcher)", []string{"fleetsync.(*Client).run", "fleetsync.(*Client).enqueue", "fleetsync.(*Client).publish"}},
	{"NATS client: reading", []string{"nats.go.(*Conn).readLoop"}},
	{"NATS client: writing", []string{"nats.go.(*Conn).flusher"}},
	{"Go scheduler: finding work, parking, waking threads", []string{"runtime.schedule", "runtime.findRunnable", "runtime.park_m", "runtime.wakep", "runtime.stopm", "runtime.notewakeup"}},
	{"Go garbage collector, in the background", []string{"runtime.gcBgMarkWorker"}},
	{"everything else: serving, proxying, routing", nil},
}

// frameIs reports whether the function named name is fn or one of its
// closures, fn given from its package's last path element on
// ("fleetsync.(*Client).run"); an escaped dot of a package path
// (nats%2ego) counts as a dot.
func frameIs(name, fn string) bool {
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	name = strings.ReplaceAll(name, "%2e", ".")
	return name == fn || strings.HasPrefix(name, fn+".func")
}

// cpuProfile is one profiled run: CPU by bucket, and the requests the
// gateway served while it was taken.
type cpuProfile struct {
	by       []time.Duration // by profileBuckets' index
	requests int64
}

// total is the CPU of all the profile's samples.
func (p *cpuProfile) total() time.Duration {
	var sum time.Duration
	for _, d := range p.by {
		sum += d
	}
	return sum
}

// classify splits the CPU samples of a Go CPU profile among
// profileBuckets.
func classify(data []byte) (*cpuProfile, error) {
	p, err := profile.Parse(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	vi := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			vi = i
		}
	}
	if vi < 0 {
		return nil, fmt.Errorf("cpu profile: no cpu/nanoseconds samples (types %v)", p.SampleType)
	}
	out := &cpuProfile{by: make([]time.Duration, len(profileBuckets))}
	for _, s := range p.Sample {
		out.by[bucketOf(s)] += time.Duration(s.Value[vi])
	}
	return out, nil
}

// bucketOf is the index of the first of profileBuckets that takes s.
func bucketOf(s *profile.Sample) int {
	for bi, b := range profileBuckets {
		if b.funcs == nil {
			return bi
		}
		for _, loc := range s.Location {
			for _, line := range loc.Line {
				if line.Function == nil {
					continue
				}
				for _, fn := range b.funcs {
					if frameIs(line.Function.Name, fn) {
						return bi
					}
				}
			}
		}
	}
	return len(profileBuckets) - 1
}

// profileTable sums the profiled runs of each sync setting and gives each
// bucket's CPU per request the gateway served while profiled, and its
// share of the profile.
func profileTable(runs []costRun) *table {
	t := &table{header: []string{"where the gateway's CPU goes", "sync off: µs/req", "sync off: share", "sync on: µs/req", "sync on: share", "added µs/req"}}
	sum := [2]cpuProfile{{by: make([]time.Duration, len(profileBuckets))}, {by: make([]time.Duration, len(profileBuckets))}}
	for _, r := range runs {
		if r.profile == nil {
			continue
		}
		s := &sum[0]
		if r.sync {
			s = &sum[1]
		}
		for b, d := range r.profile.by {
			s.by[b] += d
		}
		s.requests += r.profile.requests
	}
	total := [2]time.Duration{sum[0].total(), sum[1].total()}
	perReq := func(s *cpuProfile, d time.Duration) float64 {
		if s.requests == 0 {
			return 0
		}
		return float64(d) / float64(time.Microsecond) / float64(s.requests)
	}
	share := func(i int, d time.Duration) string {
		if total[i] == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(d)/float64(total[i]))
	}
	row := func(label string, off, on time.Duration) {
		a, b := perReq(&sum[0], off), perReq(&sum[1], on)
		t.add(label, fmt.Sprintf("%.1f", a), share(0, off), fmt.Sprintf("%.1f", b), share(1, on), fmt.Sprintf("%+.1f", b-a))
	}
	for bi, b := range profileBuckets {
		row(b.label, sum[0].by[bi], sum[1].by[bi])
	}
	row("all of the profile", total[0], total[1])
	return t
}

// writeProfile keeps a run's profile in dir (none when dir is "").
func writeProfile(dir, name string, data []byte) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("out: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		return fmt.Errorf("out: %w", err)
	}
	return nil
}
