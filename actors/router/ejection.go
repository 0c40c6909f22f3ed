package router

import (
	"sort"
	"strings"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// EjectionConfig is passive health (outlier ejection): a worker whose
// attempts fail before the first byte Failures times in a row (Refused
// times when the failure that reaches the count is a refused connection)
// is ejected for Base × the number of times it has been ejected, at most
// Max. At most MaxPercent of the workers of one pool (served model and
// role) are ejected at once, rounded down; MaxPercent 0 turns ejection off.
type EjectionConfig struct {
	Failures   int
	Refused    int
	Base       time.Duration
	Max        time.Duration
	MaxPercent int
}

// CountsForEjection reports whether an attempt failure (a proxy.Failure)
// is the engine's fault and counts towards its ejection: refused, reset,
// timeout, an early close, another transport error, a status_ failure
// (503 and any other 5xx the proxy fails over) or an answer that is not
// OpenAI-shaped (bad_answer). The client leaving, an answer too large and
// a request that could not be built do not.
func CountsForEjection(reason string) bool {
	switch f := proxy.Failure(reason); {
	case f == proxy.FailRefused, f == proxy.FailReset, f == proxy.FailTimeout, f == proxy.FailEOF, f == proxy.FailTransport,
		f == proxy.FailBadAnswer, f == proxy.FailTruncated:
		return true
	}
	return strings.HasPrefix(reason, "status_")
}

// FailureRefused is the failure reason (internal/wire/proxy's) of a refused
// connection, which ejects after EjectionConfig.Refused failures.
const FailureRefused = "refused"

// health is one worker's passive-health record. A heartbeat never
// changes it; the worker's eviction (RemoveWorker) or a report of a new
// process (renewed) forgets it.
type health struct {
	fails  int       // consecutive failures
	times  int       // ejections so far (the multiplier)
	until  time.Time // end of the current or last ejection
	reason string    // the failure that caused the last ejection
	// The incarnation the record is about: a worker that comes back at
	// another address or with another start time is a new process, and
	// starts with a clean record.
	addr    string
	started time.Time
}

// renewed forgets the record of a worker whose report shows a new process
// (another HTTP address or start time); other reports leave it alone, so
// no heartbeat or probe ends an ejection early.
func (s *State) renewed(w *fleet.Worker) {
	if h := s.health[w.ID]; h != nil && (h.addr != w.HTTPAddress || !h.started.Equal(w.StartedAt)) {
		delete(s.health, w.ID)
		if c := s.inflight[w.ID]; c != nil {
			c.suspect, c.trials = false, 0
		}
	}
}

// Ejection is what AttemptFailed did.
type Ejection struct {
	Ejected bool
	Until   time.Time
	Reason  string
	Model   string
	// Capped: the worker reached its threshold but the pool's cap kept it.
	Capped bool
}

// ejected reports whether worker id is ejected at now.
func (s *State) ejected(id string, now time.Time) bool {
	h := s.health[id]
	return h != nil && now.Before(h.until)
}

// AttemptSucceeded resets worker id's failure count: an attempt reached its
// first byte with an answer that is not a 5xx. It does not end an ejection.
func (s *State) AttemptSucceeded(id string) {
	if h := s.health[id]; h != nil {
		h.fails = 0
	}
	s.belie(id) // the peers' word that it is to be ejected
	if c := s.inflight[id]; c != nil {
		c.suspect, c.trials = false, 0
	}
}

// suspectBusy reports whether a pick should pass over the worker whose
// load is c: its last attempts failed, it is not ejected (yet), and a
// request sent to it since has no attempt outcome on it yet. A worker that
// just failed gets one request at a time until an attempt on it answers
// or fails again, so an engine that died costs at most one more failed
// attempt before it is ejected, rather than one for every request routed
// there before its failure was known.
func suspectBusy(c *workerLoad) bool { return c.suspect && c.trials > 0 }

// AttemptFailed records a failure of worker id before the first byte and
// ejects the worker when it has failed enough times in a row, or once
// while peers' word that it is to be ejected waits for evidence (sync.go),
// and its pool's cap allows. Failures of a worker already ejected (attempts sent
// before the ejection) change nothing.
func (s *State) AttemptFailed(id, reason string, now time.Time) Ejection {
	ec := s.cfg.Ejection
	w, known := s.workers[id]
	if c := s.inflight[id]; c != nil {
		c.trials = 0 // the outcome of an attempt there is known
	}
	if ec.MaxPercent <= 0 || !known || !CountsForEjection(reason) {
		return Ejection{}
	}
	if s.health == nil {
		s.health = map[string]*health{}
	}
	h := s.health[id]
	if h == nil {
		h = &health{addr: w.HTTPAddress, started: w.StartedAt}
		s.health[id] = h
	}
	if now.Before(h.until) {
		return Ejection{}
	}
	h.fails++
	need := max(ec.Failures, 1)
	if reason == FailureRefused {
		need = max(ec.Refused, 1)
	}
	// Peers' word that it is to be ejected (sync.go) and this failure are
	// evidence enough.
	if h.fails < need && s.liveVotes(id, now, false) == 0 {
		s.load(id).suspect = true
		return Ejection{}
	}
	out := Ejection{Model: w.Model, Reason: reason}
	if !s.ejectionRoom(w, now) {
		s.load(id).suspect = true
		out.Capped = true
		return out
	}
	// A worker that stayed out of trouble for Max after its last ejection
	// starts again at one Base.
	if h.times > 0 && now.Sub(h.until) >= ec.Max {
		h.times = 0
	}
	h.times++
	h.fails = 0
	h.reason = reason
	h.until = now.Add(EjectionTime(ec, h.times))
	delete(s.votes, id)
	c := s.load(id)
	c.until, c.suspect = h.until, false
	out.Ejected, out.Until = true, h.until
	s.pruneHealth(now)
	if s.syncing() {
		s.cfg.Sync.Syncer.Ejected(id, w.Model, reason, h.until)
	}
	return out
}

// GenerationTimedOut records a non-streamed attempt on worker id that
// timed out before its first byte (the engine generates a whole answer
// before it): a long generation, not a failure, while the worker is
// otherwise healthy — live by its heartbeats or probes, so its engine
// answers them — and then it does not count towards the worker's
// ejection. On a worker that is not live it is AttemptFailed.
func (s *State) GenerationTimedOut(id, reason string, now time.Time) Ejection {
	if w, ok := s.workers[id]; ok && w.Live(now) {
		if c := s.inflight[id]; c != nil {
			c.trials = 0 // the outcome of an attempt there is known
		}
		return Ejection{}
	}
	return s.AttemptFailed(id, reason, now)
}

// EjectionTime is the length of a worker's k-th ejection: k × Base, at
// most Max.
func EjectionTime(ec EjectionConfig, k int) time.Duration {
	d := time.Duration(k) * ec.Base
	if ec.Max > 0 && (d > ec.Max || d < 0) {
		d = ec.Max
	}
	return d
}

// ejectionRoom reports whether one more worker of the pool may be ejected
// at now: ejected + 1 ≤ ⌊n × MaxPercent / 100⌋.
func (s *State) ejectionRoom(w *fleet.Worker, now time.Time) bool {
	p, ok := s.pools[poolKey{w.Model, w.Role}]
	if !ok {
		return false
	}
	ejected := 0
	for _, other := range p.ids {
		if other != w.ID && s.ejected(other, now) {
			ejected++
		}
	}
	return (ejected+1)*100 <= len(p.ids)*s.cfg.Ejection.MaxPercent
}

// pruneHealth forgets records of workers that are gone and not ejected
// (a record of a worker that left is forgotten when it leaves; this
// catches any left behind by a reset of the view).
func (s *State) pruneHealth(now time.Time) {
	for id, h := range s.health {
		if _, live := s.workers[id]; !live && !now.Before(h.until) {
			delete(s.health, id)
		}
	}
}

// EjectedWorker is one ejection in force.
type EjectedWorker struct {
	ID, Model, Reason string
	Until             time.Time
}

// EjectedAt lists the workers ejected at now, by id.
func (s *State) EjectedAt(now time.Time) []EjectedWorker {
	var out []EjectedWorker
	for id, h := range s.health {
		if now.Before(h.until) {
			e := EjectedWorker{ID: id, Reason: h.reason, Until: h.until}
			if w, ok := s.workers[id]; ok {
				e.Model = w.Model
			}
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Observer receives the router's overload events; each func may be nil.
// They run inside the router actor and must not block.
type Observer struct {
	// OnEject: worker (of model) was ejected until until after reason.
	OnEject func(worker, model, reason string, until time.Time)
	// OnQueueLeft: a waiter left queue after waited, with outcome served,
	// overloaded or gone.
	OnQueueLeft func(queue, outcome string, waited time.Duration)
	// OnOverloaded: a request to queue was answered overloaded, for reason
	// queue_full or queue_timeout.
	OnOverloaded func(queue, reason string)
	// OnAdmission: a request of key in band priority of queue had outcome
	// (AdmissionDispatched, AdmissionQueued, AdmissionShed,
	// AdmissionObjective, AdmissionOverloaded, AdmissionGone).
	OnAdmission func(queue string, priority int, key, outcome string)
	// OnKVApplied: a worker's KV events were applied to its exact view.
	OnKVApplied func(KVApplied)
	// OnAgreement: an exact pick of a request of base model was checked
	// against the prefix index's (agreement.go); agreed: the same worker.
	OnAgreement func(model string, agreed bool)
}

// overloadView fills v's ejection and admission fields at now.
func (s *State) overloadView(v WorkerView, now time.Time) WorkerView {
	if h := s.health[v.ID]; h != nil {
		v.Ejections = h.times
		if now.Before(h.until) {
			v.EjectedUntil, v.EjectionReason = h.until, h.reason
			v.Routable = false // no new request goes there until the ejection ends
		} else {
			v.ConsecutiveFailures = h.fails
		}
	}
	v.ConcurrencyLimit = s.Limit(&v.Worker)
	return v
}
