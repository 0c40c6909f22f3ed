package router

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// Errors of priorities and latency objectives.
var (
	// ErrSaturated: a sheddable request (priority < 0) found every worker
	// of its model saturated by the engines' own reports, or was waiting
	// when a request of a higher priority had to wait.
	ErrSaturated = errors.New("saturated")
	// ErrObjective: the request's TTFT objective cannot be met by the
	// gateway's estimate, and its key does not ask to be served late.
	ErrObjective = errors.New("objective unreachable")
)

// Ask is what a request and its API key say about its place in the
// admission queue (resolved by State.Classify).
type Ask struct {
	// Priority is the x-tlgate-priority header's value; nil: none.
	Priority *int
	// Objective is the x-slo-ttft-ms header's TTFT objective; 0: none.
	Objective time.Duration
	// FairnessID is the x-tlgate-fairness-id header: the key's end user
	// the request takes turns as, inside the key's share.
	FairnessID string
	// Key is the API key's settings.
	Key KeyClass
}

// KeyClass is an API key's admission settings.
type KeyClass struct {
	// Priority is the key's default priority; nil: the route's.
	Priority *int
	// MaxPriority caps every priority of the key's requests (the header,
	// the key's default, the route's); nil: the header may lower a
	// request's priority but not raise it above what it would have
	// without it.
	MaxPriority *int
	// Trusted: no cap at all (authentication is off: every caller is
	// trusted alike).
	Trusted bool
	// Objective is the key's default TTFT objective; 0: the route's.
	Objective time.Duration
	// ServeLate: the key's requests wait even when their objective can no
	// longer be met, instead of being refused early.
	ServeLate bool
}

// Class is a request's resolved place in the queue.
type Class struct {
	Priority  int
	Objective time.Duration // 0: none
	Flow      string        // the fairness id
	ServeLate bool
}

// Sheddable reports whether the class is refused first under saturation.
func (c Class) Sheddable() bool { return c.Priority < 0 }

// Classify resolves a request's class. Priority: the key's default, else
// its route's, else 0; the header's in its place when sent, but never
// above the key's maximum (without one, never above the priority it
// replaces); and the key's maximum caps the default and the route's too.
// Objective: the header's, else the key's default, else the route's,
// else none.
func (s *State) Classify(req *Request) Class {
	a := &req.Ask
	c := Class{Flow: a.FairnessID, ServeLate: a.Key.ServeLate}
	r, routed := s.table.Lookup(req.Model)
	switch {
	case a.Key.Priority != nil:
		c.Priority = *a.Key.Priority
	case routed:
		c.Priority = r.Priority
	}
	if h := a.Priority; h != nil && (*h <= c.Priority || a.Key.MaxPriority != nil || a.Key.Trusted) {
		c.Priority = *h
	}
	if m := a.Key.MaxPriority; m != nil && c.Priority > *m && !a.Key.Trusted {
		c.Priority = *m
	}
	switch {
	case a.Objective > 0:
		c.Objective = a.Objective
	case a.Key.Objective > 0:
		c.Objective = a.Key.Objective
	case routed && r.TTFTObjectiveMs > 0:
		c.Objective = time.Duration(r.TTFTObjectiveMs) * time.Millisecond
	}
	return c
}

// SaturationConfig says when an engine's reports show it saturated: its
// queue at QueueDepth or more, its KV cache at least KVUse used, or the
// recent TTFT of its answers at TTFT or more. A zero field judges
// nothing.
type SaturationConfig struct {
	QueueDepth int
	KVUse      float64
	TTFT       time.Duration
}

// engineSaturated reports why worker w's own reports (and the gateway's
// recent TTFT on it) show it saturated, or "" when they do not.
func (s *State) engineSaturated(w *fleet.Worker, now time.Time) string {
	sc := &s.cfg.Admission.Saturation
	if sc.QueueDepth > 0 && w.QueueDepth >= sc.QueueDepth {
		return fmt.Sprintf("%d queued", w.QueueDepth)
	}
	if sc.KVUse > 0 && w.KVTotalBlocks > 0 {
		if use := float64(w.KVTotalBlocks-w.KVFreeBlocks) / float64(w.KVTotalBlocks); use >= sc.KVUse {
			return fmt.Sprintf("KV cache %.0f%% used", 100*use)
		}
	}
	if sc.TTFT > 0 {
		if d, ok := s.workerTTFT[w.ID].at(now); ok && d >= sc.TTFT {
			return fmt.Sprintf("recent TTFT %s", d.Round(time.Millisecond))
		}
	}
	return ""
}

// poolFull judges the candidates a pick collected (s.members, s.loads):
// it reports whether the request must wait instead, and sets s.saturated
// (with s.why) when every candidate's engine reports itself saturated.
// With limits per pool (the default) the pool is full when the gateway's
// requests on the candidates reach the sum of their limits (every one
// limited); with limits per worker, collect already passed over the
// workers at their limits.
func (s *State) poolFull(now time.Time) bool {
	if len(s.members) == 0 {
		return false
	}
	var why []string
	for _, w := range s.members {
		r := s.engineSaturated(w, now)
		if r == "" {
			why = nil
			break
		}
		why = append(why, w.ID+": "+r)
	}
	if why != nil {
		s.saturated, s.why = true, strings.Join(why, ", ")
		return true
	}
	if s.cfg.Admission.PerWorker {
		return false
	}
	used, limit := 0, 0
	for _, c := range s.loads {
		if c.limit <= 0 {
			return false
		}
		used += c.used()
		limit += c.limit
	}
	return used >= limit
}

// ewma is a moving average of durations with the time of its last sample.
type ewma struct {
	mean float64 // seconds
	last time.Time
	n    int
}

// ewmaWeight is the weight of a new sample; samples older than ewmaFresh
// are not believed any more.
const (
	ewmaWeight = 0.2
	ewmaFresh  = 10 * time.Second
)

func (e *ewma) add(d time.Duration, now time.Time) {
	x := d.Seconds()
	if e.n == 0 {
		e.mean = x
	} else {
		e.mean += ewmaWeight * (x - e.mean)
	}
	e.n++
	e.last = now
}

// at is the average when its last sample is fresh at now.
func (e *ewma) at(now time.Time) (time.Duration, bool) {
	if e == nil || e.n == 0 || now.Sub(e.last) > ewmaFresh {
		return 0, false
	}
	return time.Duration(e.mean * float64(time.Second)), true
}

// bandKey names one priority band of one queue.
type bandKey struct {
	queue string
	prio  int
}

// drain is how fast a queue's waiters leave: the mean interval between
// two dispatches while waiters were left behind.
type drain struct {
	prev     time.Time // the last dispatch
	backlog  bool      // waiters were left after it
	interval ewma
}

// dispatched records a dispatch from queue at now, left waiting after.
func (s *State) dispatched(queue string, left int, now time.Time) {
	if s.drains == nil {
		s.drains = map[string]*drain{}
	}
	d := s.drains[queue]
	if d == nil {
		d = &drain{}
		s.drains[queue] = d
	}
	if d.backlog && !now.Before(d.prev) {
		d.interval.add(now.Sub(d.prev), now)
	}
	d.prev, d.backlog = now, left > 0
}

// waitEstimate is the estimated wait of a request with ahead waiters
// before it in queue: one dispatch interval for each and its own, and at
// least the time since the last dispatch when waiters are left over. It
// is 0 when no interval was measured lately.
func (s *State) waitEstimate(queue string, ahead int, now time.Time) time.Duration {
	d := s.drains[queue]
	if d == nil {
		return 0
	}
	iv, ok := d.interval.at(now)
	if !ok {
		return 0
	}
	if d.backlog {
		iv = max(iv, now.Sub(d.prev)/time.Duration(ahead+1))
	}
	return iv * time.Duration(ahead+1)
}

// maxTTFTBands bounds the priority bands whose TTFT a queue keeps apart:
// priorities are the clients' to choose, so the bands past the first
// maxTTFTBands seen share the queue's TTFT over every band.
const maxTTFTBands = 32

// TTFTObserved records the time to first byte of an answer from worker
// (dispatch to first byte, as the client of that attempt saw it) for a
// request of queue and priority: in the band's recent TTFT, the queue's
// and the worker's (an objective's estimate, and saturation_ttft).
func (s *State) TTFTObserved(worker, queue string, prio int, d time.Duration, now time.Time) {
	if d <= 0 {
		return
	}
	if s.bandTTFT == nil {
		s.bandTTFT = map[bandKey]*ewma{}
		s.bands = map[string]int{}
		s.workerTTFT = map[string]*ewma{}
	}
	s.ewmaOf(s.bandTTFT, bandKey{queue: queue, prio: anyBand}).add(d, now)
	s.workerEWMA(worker).add(d, now)
	k := bandKey{queue, prio}
	if e := s.bandTTFT[k]; e != nil {
		e.add(d, now)
	} else if s.bands[queue] < maxTTFTBands {
		s.bands[queue]++
		s.ewmaOf(s.bandTTFT, k).add(d, now)
	}
}

// anyBand keys a queue's TTFT over every band.
const anyBand = int(^uint(0) >> 1)

func (s *State) ewmaOf(m map[bandKey]*ewma, k bandKey) *ewma {
	e := m[k]
	if e == nil {
		e = &ewma{}
		m[k] = e
	}
	return e
}

func (s *State) workerEWMA(id string) *ewma {
	e := s.workerTTFT[id]
	if e == nil {
		e = &ewma{}
		s.workerTTFT[id] = e
	}
	return e
}

// ttftEstimate is the engines' recent TTFT for a request of queue and
// priority: its band's, else its queue's, else 0.
func (s *State) ttftEstimate(queue string, prio int, now time.Time) time.Duration {
	if d, ok := s.bandTTFT[bandKey{queue, prio}].at(now); ok {
		return d
	}
	d, _ := s.bandTTFT[bandKey{queue: queue, prio: anyBand}].at(now)
	return d
}

// ObjectiveError is ErrObjective with the estimate that refused the
// request.
type ObjectiveError struct {
	Model     string
	Objective time.Duration
	// Waited is how long it waited already; Wait the estimated wait left
	// (Ahead requests before it); TTFT the engines' recent TTFT.
	Waited, Wait, TTFT time.Duration
	Ahead              int
}

func (e *ObjectiveError) Error() string {
	return fmt.Sprintf("router: %q: %v: objective %s, estimate %s", e.Model, ErrObjective, e.Objective, e.Waited+e.Wait+e.TTFT)
}

// Unwrap makes errors.Is(err, ErrObjective) hold.
func (e *ObjectiveError) Unwrap() error { return ErrObjective }

// Message is the client's error message.
func (e *ObjectiveError) Message() string {
	est := (e.Waited + e.Wait + e.TTFT).Round(time.Millisecond)
	parts := []string{}
	if e.Waited > 0 {
		parts = append(parts, fmt.Sprintf("%s waited", e.Waited.Round(time.Millisecond)))
	}
	if e.Wait > 0 {
		parts = append(parts, fmt.Sprintf("%s more in the queue behind %d requests", e.Wait.Round(time.Millisecond), e.Ahead))
	}
	parts = append(parts, fmt.Sprintf("%s of the engines' recent time to first token", e.TTFT.Round(time.Millisecond)))
	return fmt.Sprintf("The request's time-to-first-token objective of %s for model %q cannot be met: the gateway estimates %s (%s). Retry later, ask for a longer objective (x-slo-ttft-ms), or use a key that is served late.",
		e.Objective, e.Model, est, strings.Join(parts, ", "))
}

// SaturatedError is ErrSaturated with what was saturated.
type SaturatedError struct {
	Model    string
	Priority int
	// Why lists the workers and what their reports show; empty when the
	// request was shed from the queue for a higher priority's.
	Why string
}

func (e *SaturatedError) Error() string {
	return fmt.Sprintf("router: %q: %v: %s", e.Model, ErrSaturated, e.Why)
}

// Unwrap makes errors.Is(err, ErrSaturated) hold.
func (e *SaturatedError) Unwrap() error { return ErrSaturated }

// Message is the client's error message.
func (e *SaturatedError) Message() string {
	if e.Why == "" {
		return fmt.Sprintf("Model %q is saturated and the request is sheddable (priority %d): it gave its place up to a request of higher priority. Retry later.", e.Model, e.Priority)
	}
	return fmt.Sprintf("Model %q is saturated (%s) and the request is sheddable (priority %d): sheddable requests are refused first. Retry later.", e.Model, e.Why, e.Priority)
}
