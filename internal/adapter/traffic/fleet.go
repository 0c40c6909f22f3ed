package traffic

import (
	"math"
	"sort"
)

// Raw is a Recorder's rings as they stand, for another gateway replica to
// merge into its own (SnapshotWith): every non-empty bucket of the window,
// per model. Its JSON form travels over fleet sync.
type Raw struct {
	// Width is the bucket width, in nanoseconds: rings of another width do
	// not merge.
	Width  int64      `json:"width_ns"`
	Models []RawModel `json:"models"`
}

// RawModel is one model's non-empty buckets.
type RawModel struct {
	Model   string    `json:"model"`
	Buckets []RawSlot `json:"buckets"`
}

// RawSlot is one bucket: its number (unix nanoseconds / width), counts,
// error codes, and the histograms' non-empty bins as [bin, count] pairs.
type RawSlot struct {
	Num       int64             `json:"num"`
	Requests  uint32            `json:"requests,omitempty"`
	Failovers uint32            `json:"failovers,omitempty"`
	Accepted  uint32            `json:"accepted,omitempty"`
	Escalated uint32            `json:"escalated,omitempty"`
	Codes     map[string]uint32 `json:"codes,omitempty"`
	TTFT      [][2]uint32       `json:"ttft,omitempty"`
	Latency   [][2]uint32       `json:"latency,omitempty"`
}

// Raw returns the rings of the window ending now.
func (r *Recorder) Raw() Raw {
	cur := r.bucketNum(r.cfg.Now())
	copies, first := r.copyWindow(cur)
	out := Raw{Width: int64(r.cfg.Width), Models: make([]RawModel, 0, len(copies))}
	for name, slots := range copies {
		m := RawModel{Model: name}
		for num := first; num <= cur; num++ {
			s := &slots[mod(num, len(slots))]
			if s.num != num || s.empty() {
				continue
			}
			m.Buckets = append(m.Buckets, s.raw())
		}
		if len(m.Buckets) > 0 {
			out.Models = append(out.Models, m)
		}
	}
	sort.Slice(out.Models, func(i, j int) bool { return out.Models[i].Model < out.Models[j].Model })
	return out
}

// copyWindow copies, under the lock, the rings of models seen in the
// window ending with bucket cur, and returns the window's first bucket.
func (r *Recorder) copyWindow(cur int64) (map[string][]slot, int64) {
	first := cur - int64(r.cfg.Buckets) + 1
	r.mu.Lock()
	defer r.mu.Unlock()
	copies := make(map[string][]slot, len(r.models))
	for m, rg := range r.models {
		if rg.last < first {
			continue
		}
		copies[m] = append([]slot(nil), rg.slots...)
	}
	return copies, first
}

func (s *slot) empty() bool {
	return s.requests == 0 && s.failovers == 0 && s.accepted == 0 && s.escalated == 0 && s.ncodes == 0 && s.ttftCount == 0 && s.latencyCt == 0
}

func (s *slot) raw() RawSlot {
	out := RawSlot{Num: s.num, Requests: s.requests, Failovers: s.failovers, Accepted: s.accepted, Escalated: s.escalated,
		TTFT: s.ttft.pairs(), Latency: s.latency.pairs()}
	if s.ncodes > 0 {
		out.Codes = make(map[string]uint32, s.ncodes)
		for _, c := range s.codes[:s.ncodes] {
			out.Codes[c.code] = c.n
		}
	}
	return out
}

func (h *hist) pairs() [][2]uint32 {
	var out [][2]uint32
	for i, n := range h {
		if n > 0 {
			out = append(out, [2]uint32{uint32(i), n})
		}
	}
	return out
}

// add merges a peer's bucket into s (of the same number): counts summed,
// codes past maxCodes counted as OtherCode, histogram bins out of range
// ignored (a peer's message is bounded, not trusted).
func (s *slot) add(p *RawSlot) {
	s.requests = satAdd(s.requests, p.Requests)
	s.failovers = satAdd(s.failovers, p.Failovers)
	s.accepted = satAdd(s.accepted, p.Accepted)
	s.escalated = satAdd(s.escalated, p.Escalated)
	codes := make([]string, 0, len(p.Codes))
	for c := range p.Codes {
		codes = append(codes, c)
	}
	sort.Strings(codes) // the same OtherCode whatever the map's order
	for _, c := range codes {
		s.addCodeN(c, p.Codes[c])
	}
	s.ttftCount = satAdd(s.ttftCount, s.ttft.addPairs(p.TTFT))
	s.latencyCt = satAdd(s.latencyCt, s.latency.addPairs(p.Latency))
}

// addPairs adds [bin, count] pairs to h and returns the count added.
func (h *hist) addPairs(ps [][2]uint32) uint32 {
	var n uint32
	for _, p := range ps {
		if int(p[0]) < len(h) {
			h[p[0]] = satAdd(h[p[0]], p[1])
			n = satAdd(n, p[1])
		}
	}
	return n
}

func satAdd(a, b uint32) uint32 {
	if a > math.MaxUint32-b {
		return math.MaxUint32
	}
	return a + b
}

// SnapshotWith is Snapshot over this recorder's rings merged with the
// other replicas' (peers): the fleet's traffic. A peer's ring of another
// bucket width, and its buckets outside this window, are left out; its
// models count towards MaxModels like this replica's.
func (r *Recorder) SnapshotWith(peers []Raw) Snapshot {
	now := r.cfg.Now()
	cur := r.bucketNum(now)
	copies, first := r.copyWindow(cur)
	replicas := 1
	for i := range peers {
		p := &peers[i]
		if p.Width != int64(r.cfg.Width) {
			continue
		}
		replicas++
		for _, m := range p.Models {
			slots := copies[m.Model]
			if slots == nil {
				if len(copies) >= r.cfg.MaxModels {
					continue
				}
				slots = make([]slot, r.cfg.Buckets)
				for j := range slots {
					slots[j].num = math.MinInt64
				}
				copies[m.Model] = slots
			}
			for k := range m.Buckets {
				b := &m.Buckets[k]
				if b.Num < first || b.Num > cur {
					continue
				}
				s := &slots[mod(b.Num, len(slots))]
				if s.num != b.Num {
					*s = slot{num: b.Num}
				}
				s.add(b)
			}
		}
	}
	snap := r.summary(copies, now, cur, first)
	snap.Replicas = replicas
	return snap
}
