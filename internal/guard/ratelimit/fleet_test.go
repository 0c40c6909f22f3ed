package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

func TestApportion(t *testing.T) {
	for _, tc := range []struct {
		total   int
		weights []float64
		want    []int
	}{
		{60, []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, []int{20, 20, 20}},
		{2, []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, []int{1, 1, 0}}, // ties to the smaller index
		{10, []float64{0.7, 0.2, 0.1}, []int{7, 2, 1}},
		{7, []float64{0.5, 0.25, 0.25}, []int{3, 2, 2}}, // 3.5, 1.75, 1.75: the two largest remainders
		{7, []float64{0.6, 0.2, 0.2}, []int{4, 2, 1}},   // 4.2, 1.4, 1.4: a tie to the smaller index
		{0, []float64{0.5, 0.5}, []int{0, 0}},
		{1, []float64{1}, []int{1}},
	} {
		sum := 0
		var got []int
		for i := range tc.weights {
			p := apportion(tc.total, tc.weights, i)
			got = append(got, p)
			sum += p
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) || (tc.total > 0 && sum != tc.total) {
			t.Errorf("apportion(%d, %v) = %v, want %v", tc.total, tc.weights, got, tc.want)
		}
	}
}

// replicas is a fleet of limiters that tell each other their demand on
// every tick, as fleet sync does, on one fake clock.
type replicas struct {
	now time.Time
	ls  []*Limiter
	ids []string
}

func newReplicas(n int, limits map[string]Limits, interval time.Duration) *replicas {
	r := &replicas{now: time.Unix(1_000_000, 0)}
	for i := range n {
		l := New(limits, func() time.Time { return r.now })
		id := fmt.Sprint("gw-", i)
		l.EnableFleet(FleetConfig{Replica: id, Interval: interval, PeerTimeout: 5 * interval})
		r.ls, r.ids = append(r.ls, l), append(r.ids, id)
	}
	return r
}

// tick runs every replica's tick and delivers its demand to the others.
func (r *replicas) tick() {
	for i, l := range r.ls {
		ds := l.Tick(r.now)
		for j, o := range r.ls {
			if j != i {
				o.Peer(r.ids[i], ds, r.now)
			}
		}
	}
}

func (r *replicas) local(key string) []Limits {
	var out []Limits
	for _, l := range r.ls {
		ks := l.state(key)
		ks.mu.Lock()
		out = append(out, ks.local)
		ks.mu.Unlock()
	}
	return out
}

// TestFleetShares: three replicas split a key's limits evenly when idle,
// by demand when one is asked everything (cuts at once, raises after two
// intervals), never more than the limit in all; a replica alone holds the
// whole limit; a key's buckets start empty.
func TestFleetShares(t *testing.T) {
	const interval = time.Second
	r := newReplicas(3, map[string]Limits{"k": {RequestsPerMinute: 60, TokensPerMinute: 6000, MaxConcurrent: 6}}, interval)
	for i, l := range r.ls {
		if ks := l.state("k"); ks.requests.remaining() != 0 || ks.tokens.remaining() != 0 {
			t.Fatalf("replica %d: a shared key's buckets start empty: %+v", i, ks)
		}
	}
	r.now = r.now.Add(interval)
	r.tick()
	r.tick() // every replica has now heard the others once
	want := Limits{RequestsPerMinute: 20, TokensPerMinute: 2000, MaxConcurrent: 2}
	for i, got := range r.local("k") {
		if got != want {
			t.Fatalf("replica %d idle: %+v, want an even third %+v", i, got, want)
		}
	}
	// Replica 0 is asked everything: the others cut at once, it raises
	// after two intervals.
	sum := func() (s Limits) {
		for _, x := range r.local("k") {
			s.RequestsPerMinute += x.RequestsPerMinute
			s.TokensPerMinute += x.TokensPerMinute
			s.MaxConcurrent += x.MaxConcurrent
		}
		return s
	}
	for step := range 6 {
		for range 10 {
			r.ls[0].Admit("k", Want{})
		}
		r.now = r.now.Add(interval)
		r.tick()
		if s := sum(); s.RequestsPerMinute > 60 || s.TokensPerMinute > 6000 || s.MaxConcurrent > 6 {
			t.Fatalf("step %d: shares add up to %+v, over the limits", step, s)
		}
	}
	got := r.local("k")
	if got[0].RequestsPerMinute < 50 || got[1].RequestsPerMinute > 5 || got[0].MaxConcurrent < 5 {
		t.Fatalf("after six ticks of demand at replica 0 only: %+v", got)
	}
	// The peers fall silent: replica 0 alone holds the whole limit.
	for range 10 {
		r.now = r.now.Add(interval)
		r.ls[0].Tick(r.now)
	}
	if got := r.local("k")[0]; got != (Limits{60, 6000, 6}) {
		t.Fatalf("alone: %+v", got)
	}
	sh := r.ls[0].Shares()
	if len(sh) != 3 || sh[0] != (Share{Key: "k", Limit: LimitConcurrent, Local: 6, Fleet: 6}) {
		t.Fatalf("shares %+v", sh)
	}
}

// TestFleetGrantsAtMostTheLimit: three replicas asked at random, far over
// a key's limit, for ten minutes of fake time, one tick a second: together
// they grant at most what one gateway would (the limit per minute; their
// buckets started empty, so not even the burst), whatever the demand's
// skew, while per replica counting grants three times that.
func TestFleetGrantsAtMostTheLimit(t *testing.T) {
	const (
		limit    = 120 // per minute
		interval = time.Second
		minutes  = 10
	)
	for _, skew := range []float64{0, 0.5, 0.9} {
		t.Run(fmt.Sprint("skew=", skew), func(t *testing.T) {
			r := newReplicas(3, map[string]Limits{"k": {RequestsPerMinute: limit}}, interval)
			var alone []*Limiter // each replica counting alone
			for range 3 {
				alone = append(alone, New(map[string]Limits{"k": {RequestsPerMinute: limit}}, func() time.Time { return r.now }))
			}
			rng := rand.New(rand.NewPCG(7, uint64(100*skew)))
			granted, grantedAlone := 0, 0
			start := r.now
			for range minutes * 60 {
				for range 20 { // 20 asks a second, 10× the limit
					i := rng.IntN(3)
					if rng.Float64() < skew {
						i = 0
					}
					if r.ls[i].Admit("k", Want{}).OK {
						granted++
					}
					if alone[i].Admit("k", Want{}).OK {
						grantedAlone++
					}
				}
				r.now = r.now.Add(interval)
				r.tick()
			}
			// What one gateway grants: limit per minute of the period.
			bound := limit * r.now.Sub(start).Minutes()
			t.Logf("granted %d, bound %.0f; the replicas counting alone granted %d", granted, bound, grantedAlone)
			if float64(grantedAlone) < 1.5*bound {
				t.Fatalf("counting alone granted %d: the demand does not exceed the limit enough to show anything", grantedAlone)
			}
			if float64(granted) > bound+3 {
				t.Fatalf("the fleet granted %d, more than %.0f", granted, bound)
			}
			if float64(granted) < 0.8*bound {
				t.Fatalf("the fleet granted %d, far under the limit's %.0f", granted, bound)
			}
		})
	}
}

// TestFleetListedPeersNotKeptOut: ids the listed fleet does not name fill
// a replica's peer table (made up by a holder of a shared fleet token, or
// replicas of an earlier rollout); a listed replica heard after them still
// takes a place, so every replica counts every other and the fleet grants
// no more than the limit.
func TestFleetListedPeersNotKeptOut(t *testing.T) {
	const limit, interval = 600, time.Second
	r := &replicas{now: time.Unix(1_000_000, 0)}
	ids := []string{"gw-0", "gw-1", "gw-2"}
	for _, id := range ids {
		l := New(map[string]Limits{"k": {RequestsPerMinute: limit}}, func() time.Time { return r.now })
		l.EnableFleet(FleetConfig{Replica: id, Interval: interval, PeerTimeout: 5 * interval, MaxPeers: 2, Listed: ids})
		r.ls, r.ids = append(r.ls, l), append(r.ids, id)
	}
	for range 20 {
		for _, l := range r.ls {
			l.Peer("made-up", nil, r.now) // heard before the others, every interval
		}
		for range 20 { // equal demand on each replica
			for _, l := range r.ls {
				l.Admit("k", Want{})
			}
		}
		r.now = r.now.Add(interval)
		r.tick()
	}
	sum := 0
	for _, lim := range r.local("k") {
		sum += lim.RequestsPerMinute
	}
	if sum > limit {
		t.Fatalf("the replicas hold %d requests a minute of a limit of %d: %v", sum, limit, r.local("k"))
	}
}
