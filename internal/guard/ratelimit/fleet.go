package ratelimit

import (
	"math"
	"slices"
	"sort"
	"sync"
	"time"
)

// Fleet-wide limits. With EnableFleet, every key's limits are split
// between the replicas of a fleet, each enforcing its own part (its
// share) of each limit with its own buckets, so that the replicas grant
// together what one gateway would. The replicas tell each other their
// demand (the requests each was asked for each key lately, Tick and Peer,
// over fleet sync) and each computes the same split from the same
// figures: a tenth of each limit spread evenly over the replicas heard
// from, the rest in proportion to their demand, in whole requests (tokens,
// slots) by the largest remainder, ties to the smaller replica id. A
// replica cuts its share at once and raises it only once the larger share
// has held for two intervals, by when its peers have cut theirs on the
// same figures; a raise adds to the refill, never to what a bucket holds.
// A key's buckets start empty (a replica that starts, or a key whose
// limits change, brings no burst of its own), and a replica that has heard
// from no peer holds the whole limit.
//
// The overshoot this allows, with reports that reach every replica within
// an interval: over any period the fleet grants a key at most what one
// gateway would (its limit's worth for the period, plus the limit once:
// the burst its buckets hold), plus, for each replica that started (or
// whose key's limits changed) in the period, two intervals at the whole
// limit's rate (2 × limit × interval / 1 min: its first, counting alone,
// and the one its peers take to cut their parts) and a request of the
// refill's rounding, and for max_concurrent the whole limit in those two
// intervals. With fleet sync away, each
// replica forgets its peers after their timeout and holds the whole limit:
// the fleet then grants up to the limit per replica.

// FleetConfig is how a Limiter shares its keys' limits.
type FleetConfig struct {
	// Replica is this replica's id: the order of the split's ties.
	Replica string
	// Interval is how often Tick runs (fleet sync's load_interval); a
	// share is raised once it has held for 2 × Interval.
	Interval time.Duration
	// PeerTimeout forgets a peer not heard from for that long.
	PeerTimeout time.Duration
	// MaxPeers bounds the peers tracked; a replica beyond them is ignored
	// until one falls silent, unless it is Listed and an unlisted one can
	// make room.
	MaxPeers int
	// Listed are the fleet's replica ids ([gateway.sync] peers; none: no
	// list). A listed replica is never kept out by ids the list does not
	// name: a replica not counted would be granted its share twice.
	Listed []string
}

// Demand is one replica's demand for one key: the requests it was asked
// for the key per minute lately (a moving average over the ticks).
type Demand struct {
	Key       string
	PerMinute float64
}

// Share is one limit of one key as this replica holds it: Local of the
// key's Limit.
type Share struct {
	Key, Limit   string
	Local, Fleet int
}

// Weights of the split and of the demand's moving average.
const (
	// fleetEven is the share of each limit spread evenly over the
	// replicas: a replica that was asked nothing lately can still grant
	// its first requests.
	fleetEven = 0.1
	// demandWeight is the weight of the last tick in the moving average.
	demandWeight = 0.5
)

// raise is a pending raise of one local limit: to, held since since.
type raise struct {
	to    int
	since time.Time
}

// fleet is the sharing state.
type fleet struct {
	cfg   FleetConfig
	mu    sync.Mutex
	last  time.Time
	own   map[string]float64 // this replica's demand per key
	peers map[string]peerDemand
}

type peerDemand struct {
	at time.Time
	d  map[string]float64
}

// EnableFleet shares every key's limits (the present ones and those of
// later SetLimits) with the other replicas of a fleet: until the first
// Tick that has heard a peer this replica holds the whole of each, with
// its buckets empty.
func (l *Limiter) EnableFleet(cfg FleetConfig) {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.PeerTimeout <= 0 {
		cfg.PeerTimeout = 5 * cfg.Interval
	}
	if cfg.MaxPeers <= 0 {
		cfg.MaxPeers = 32
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fleet = &fleet{cfg: cfg, own: map[string]float64{}, peers: map[string]peerDemand{}}
	now := l.now()
	if p := l.keys.Load(); p != nil {
		for _, ks := range *p {
			ks.mu.Lock()
			ks.requests = bucket{}.resize(ks.requests.limit, now)
			ks.tokens = bucket{}.resize(ks.tokens.limit, now)
			ks.mu.Unlock()
		}
	}
}

// noShareRetry is the Retry-After of a request refused for want of a
// share here: when a raise could take effect.
func (l *Limiter) noShareRetry() time.Duration {
	if l.fleet == nil {
		return time.Second
	}
	return max(time.Second, 2*l.fleet.cfg.Interval)
}

// Peer records the demand replica reported at now (its Tick's); a
// replica not tracked beyond MaxPeers is ignored.
func (l *Limiter) Peer(replica string, ds []Demand, now time.Time) {
	f := l.fleet
	if f == nil || replica == f.cfg.Replica {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.peers[replica]; !ok && len(f.peers) >= f.cfg.MaxPeers {
		f.expire(now)
		if len(f.peers) >= f.cfg.MaxPeers && !(slices.Contains(f.cfg.Listed, replica) && f.evictUnlisted()) {
			return
		}
	}
	d := make(map[string]float64, len(ds))
	for _, x := range ds {
		if x.PerMinute > 0 && !math.IsInf(x.PerMinute, 0) {
			d[x.Key] = x.PerMinute
		}
	}
	f.peers[replica] = peerDemand{at: now, d: d}
}

// evictUnlisted forgets the unlisted peer heard from longest ago, and
// reports whether there was one.
func (f *fleet) evictUnlisted() bool {
	var oldest string
	var at time.Time
	for id, p := range f.peers {
		if !slices.Contains(f.cfg.Listed, id) && (oldest == "" || p.at.Before(at) || p.at.Equal(at) && id < oldest) {
			oldest, at = id, p.at
		}
	}
	if oldest == "" {
		return false
	}
	delete(f.peers, oldest)
	return true
}

// expire forgets the peers not heard from within the timeout.
func (f *fleet) expire(now time.Time) {
	for id, p := range f.peers {
		if now.Sub(p.at) > f.cfg.PeerTimeout {
			delete(f.peers, id)
		}
	}
}

// Tick updates this replica's demand from the requests asked since the
// last tick, computes every key's split from it and its peers', applies
// its own share (cuts at once, raises after they held 2 × Interval), and
// returns its demand to tell the peers. It does nothing without
// EnableFleet.
func (l *Limiter) Tick(now time.Time) []Demand {
	f := l.fleet
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	dt := f.cfg.Interval
	if !f.last.IsZero() && now.After(f.last) {
		dt = now.Sub(f.last)
	}
	f.last = now
	f.expire(now)
	replicas := make([]string, 0, len(f.peers)+1)
	replicas = append(replicas, f.cfg.Replica)
	for id := range f.peers {
		replicas = append(replicas, id)
	}
	sort.Strings(replicas)
	self := sort.SearchStrings(replicas, f.cfg.Replica)
	p := l.keys.Load()
	if p == nil {
		return nil
	}
	out := make([]Demand, 0, len(*p))
	weights := make([]float64, len(replicas))
	for name, ks := range *p {
		ks.mu.Lock()
		asked := ks.asked
		ks.asked = 0
		rate := float64(asked) / dt.Minutes()
		d := f.own[name] + demandWeight*(rate-f.own[name])
		if d < 1e-3 {
			d = 0
		}
		f.own[name] = d
		if d > 0 {
			out = append(out, Demand{Key: name, PerMinute: d})
		}
		for i, id := range replicas {
			if i == self {
				weights[i] = d
			} else {
				weights[i] = f.peers[id].d[name]
			}
		}
		split(weights)
		target := Limits{
			RequestsPerMinute: apportion(ks.limits.RequestsPerMinute, weights, self),
			TokensPerMinute:   apportion(ks.limits.TokensPerMinute, weights, self),
			MaxConcurrent:     apportion(ks.limits.MaxConcurrent, weights, self),
		}
		hold := 2 * f.cfg.Interval
		local := Limits{
			RequestsPerMinute: ks.raises[0].step(ks.local.RequestsPerMinute, target.RequestsPerMinute, now, hold),
			TokensPerMinute:   ks.raises[1].step(ks.local.TokensPerMinute, target.TokensPerMinute, now, hold),
			MaxConcurrent:     ks.raises[2].step(ks.local.MaxConcurrent, target.MaxConcurrent, now, hold),
		}
		if local != ks.local {
			ks.local = local
			ks.requests = ks.requests.resize(int64(local.RequestsPerMinute), now)
			ks.tokens = ks.tokens.resize(int64(local.TokensPerMinute), now)
		}
		ks.mu.Unlock()
	}
	for name := range f.own {
		if _, ok := (*p)[name]; !ok {
			delete(f.own, name)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// step is the local limit after a tick that computed target, from cur: a
// cut at once; a raise once targets above cur have held for hold.
func (r *raise) step(cur, target int, now time.Time, hold time.Duration) int {
	if target <= cur {
		*r = raise{}
		return target
	}
	if r.since.IsZero() {
		*r = raise{to: target, since: now}
		return cur
	}
	r.to = target
	if now.Sub(r.since) >= hold {
		*r = raise{}
		return target
	}
	return cur
}

// split turns the replicas' demands into their weights, in place: a tenth
// evenly, the rest by demand (evenly when no one was asked anything).
func split(w []float64) {
	total := 0.0
	for _, x := range w {
		total += x
	}
	n := float64(len(w))
	for i, x := range w {
		if total > 0 {
			w[i] = fleetEven/n + (1-fleetEven)*x/total
		} else {
			w[i] = 1 / n
		}
	}
}

// apportion is replica self's part of total split by weights (summing to
// 1) in whole units: each replica's floor, then the units left to the
// largest remainders, ties to the smaller index. Every replica computes
// the same parts from the same weights, and they add up to total.
func apportion(total int, weights []float64, self int) int {
	if total <= 0 {
		return 0
	}
	parts := make([]int, len(weights))
	rest := make([]int, len(weights))
	left := total
	for i, w := range weights {
		parts[i] = int(math.Floor(float64(total) * w))
		left -= parts[i]
		rest[i] = i
	}
	rem := func(i int) float64 { return float64(total)*weights[i] - float64(parts[i]) }
	sort.SliceStable(rest, func(a, b int) bool { return rem(rest[a]) > rem(rest[b]) })
	for k := 0; left > 0 && k < len(rest); k++ {
		parts[rest[k]]++
		left--
	}
	return parts[self]
}

// Shares lists, for every limit of every key, this replica's part and
// the key's limit (the whole of it without EnableFleet), by key.
func (l *Limiter) Shares() []Share {
	p := l.keys.Load()
	if p == nil {
		return nil
	}
	var out []Share
	for name, ks := range *p {
		ks.mu.Lock()
		for _, x := range []struct {
			limit        string
			local, fleet int
		}{{LimitRequests, ks.local.RequestsPerMinute, ks.limits.RequestsPerMinute},
			{LimitTokens, ks.local.TokensPerMinute, ks.limits.TokensPerMinute},
			{LimitConcurrent, ks.local.MaxConcurrent, ks.limits.MaxConcurrent}} {
			if x.fleet > 0 {
				out = append(out, Share{Key: name, Limit: x.limit, Local: x.local, Fleet: x.fleet})
			}
		}
		ks.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Limit < out[j].Limit
	})
	return out
}
