package router

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Errors of admission control.
var (
	// ErrOverloaded: every routable worker of the model is at its limit
	// and the request could not wait (queue full, displaced, or its wait
	// reached the queue timeout).
	ErrOverloaded = errors.New("overloaded")
	// ErrLeft: the request left the queue because its client went away.
	ErrLeft = errors.New("left the queue")
)

// AdmissionConfig is admission control: a limit on the gateway's in-flight
// requests per worker and, when every routable worker of a model is at its
// limit, a bounded queue per model with a deadline, fair across API keys.
// A worker's limit is Engine[id], else Model[served model], else Worker
// when > 0, else what the engine's reports teach (see Limit).
type AdmissionConfig struct {
	Enabled      bool
	Worker       int
	Model        map[string]int
	Engine       map[string]int
	QueueSize    int
	QueueTimeout time.Duration
}

// learned is a worker's batch capacity as its reports show it.
type learned struct {
	running int       // the capacity the reports show (0: not known yet)
	started time.Time // the engine's start, to forget it on a restart
}

// observe learns from a worker's report. An engine that reports a queue
// runs as many sequences as it can now: that is its capacity (it may fall,
// when KV blocks run short). One that runs at least that many without a
// queue can run more: its capacity rises to what it runs. A new process
// (another start time) is learned afresh, and starts with a clean health
// record (renewed).
func (s *State) observe(w *fleet.Worker) {
	s.renewed(w)
	if s.learned == nil {
		s.learned = map[string]learned{}
	}
	l := s.learned[w.ID]
	if !l.started.Equal(w.StartedAt) {
		l = learned{started: w.StartedAt}
	}
	switch {
	case w.QueueDepth > 0:
		l.running = max(w.Running, 1)
	case l.running > 0 && w.Running >= l.running:
		l.running = w.Running
	}
	s.learned[w.ID] = l
	c := s.counter(w.ID)
	c.limit = s.Limit(w)
	c.until = time.Time{}
	if h := s.health[w.ID]; h != nil {
		c.until = h.until
	}
}

// Limit is worker w's concurrency limit (0: none). Derived from the
// reports it is the learned capacity plus one, so the engine keeps one
// request ready and a capacity that has grown shows in its next report.
func (s *State) Limit(w *fleet.Worker) int {
	a := &s.cfg.Admission
	if !a.Enabled {
		return 0
	}
	if n, ok := a.Engine[w.ID]; ok && n > 0 {
		return n
	}
	if n, ok := a.Model[w.Model]; ok && n > 0 {
		return n
	}
	if a.Worker > 0 {
		return a.Worker
	}
	if n := s.learned[w.ID].running; n > 0 {
		return n + 1
	}
	return 0
}

// held reports whether a pick must pass over the worker whose counter is
// c: it is ejected, or at its limit. The latter marks the pick as
// saturated, so a request that finds no worker waits instead of being
// refused.
func (s *State) held(c *counter, now time.Time) bool {
	if c.ejectedAt(now) {
		return true
	}
	if c.atLimit() {
		s.full = true
		return true
	}
	return false
}

// Waiter is a Route request waiting in a model's queue.
type Waiter struct {
	Seq      uint64
	From     *actor.PID // who asked: answered when the request leaves the queue
	Req      Request
	Key      string // the API key's name (fair shares)
	Queue    string // the queue's model
	Enqueued time.Time
	Deadline time.Time
	Cancel   func() // stops the deadline timer (may be nil)
	// Passed counts the times a later waiter of the same key left the
	// queue first, for a worker that holds more of its prompt (warmWaiter).
	Passed int
}

// Admission is the outcome of Admit: a target or an error to answer now,
// or a request that waits (Queued). Displaced, when set, is a waiter the
// new one pushed out of a full queue: answer it ErrOverloaded.
type Admission struct {
	Target     Target
	Err        error
	Queued     *Waiter
	Displaced  *Waiter
	RetryAfter time.Duration
}

// Dispatched is a waiter that leaves the queue with an answer.
type Dispatched struct {
	W      *Waiter
	Target Target
	Err    error
}

// fairQueue is one model's queue: first come, first served within a key,
// round robin across keys (deficit round robin with a quantum of one
// request, every request costing one).
type fairQueue struct {
	keys  []string // keys with waiting requests, in turn order
	next  int      // index in keys of the key whose turn it is
	byKey map[string][]*Waiter
	n     int
}

func newFairQueue() *fairQueue { return &fairQueue{byKey: map[string][]*Waiter{}} }

func (q *fairQueue) push(w *Waiter) {
	if len(q.byKey[w.Key]) == 0 {
		// A key that starts waiting takes its turn after the others'.
		q.keys = append(q.keys, "")
		if q.next > 0 {
			copy(q.keys[q.next+1:], q.keys[q.next:])
			q.keys[q.next] = w.Key
			q.next++
		} else {
			q.keys[len(q.keys)-1] = w.Key
		}
	}
	q.byKey[w.Key] = append(q.byKey[w.Key], w)
	q.n++
}

// peek returns the waiter whose turn it is, or nil.
func (q *fairQueue) peek() *Waiter {
	if q.n == 0 {
		return nil
	}
	return q.byKey[q.keys[q.next]][0]
}

// pop removes the waiter peek returned and passes the turn on.
func (q *fairQueue) pop() *Waiter {
	w := q.peek()
	if w == nil {
		return nil
	}
	q.take(w)
	return w
}

// take removes w, a waiter of the key whose turn it is, and passes the
// turn on.
func (q *fairQueue) take(w *Waiter) {
	q.remove(w)
	if q.n > 0 && len(q.byKey[w.Key]) > 0 {
		q.next = (q.next + 1) % len(q.keys)
	}
}

// remove takes w out of the queue wherever it is; it reports whether w was
// there.
func (q *fairQueue) remove(w *Waiter) bool {
	list := q.byKey[w.Key]
	i := -1
	for j, x := range list {
		if x == w {
			i = j
			break
		}
	}
	if i < 0 {
		return false
	}
	list = append(list[:i], list[i+1:]...)
	q.n--
	if len(list) > 0 {
		q.byKey[w.Key] = list
		return true
	}
	delete(q.byKey, w.Key)
	for k, key := range q.keys {
		if key == w.Key {
			q.keys = append(q.keys[:k], q.keys[k+1:]...)
			if k < q.next {
				q.next--
			}
			break
		}
	}
	if q.next >= len(q.keys) {
		q.next = 0
	}
	return true
}

// heaviest returns the key with the most waiting requests (the first in
// turn order on a tie).
func (q *fairQueue) heaviest() string {
	best, n := "", -1
	for _, k := range q.keys {
		if len(q.byKey[k]) > n {
			best, n = k, len(q.byKey[k])
		}
	}
	return best
}

// oldest returns the earliest Enqueued among the waiters.
func (q *fairQueue) oldest() (time.Time, bool) {
	var t time.Time
	for _, list := range q.byKey {
		if len(list) > 0 && (t.IsZero() || list[0].Enqueued.Before(t)) {
			t = list[0].Enqueued
		}
	}
	return t, !t.IsZero()
}

// queueName is the queue a request waits in: its route's model (aliases
// resolved), else the model it names.
func (s *State) queueName(model string) string {
	if r, ok := s.table.Lookup(model); ok {
		return r.Model
	}
	return model
}

// Admit routes req at now like Pick; when every routable worker it could
// use is at its limit, the request waits in its model's queue (or is
// refused when it cannot).
func (s *State) Admit(req *Request, key string, from *actor.PID, now time.Time) Admission {
	s.full = false
	t, err := s.Pick(req, now)
	if err == nil || !s.cfg.Admission.Enabled || !s.full || !errors.Is(err, ErrNoCapacity) {
		return Admission{Target: t, Err: err}
	}
	name := s.queueName(req.Model)
	if s.queues == nil {
		s.queues = map[string]*fairQueue{}
		s.waiters = map[uint64]*Waiter{}
		s.byFrom = map[string]uint64{}
	}
	q := s.queues[name]
	if q == nil {
		q = newFairQueue()
		s.queues[name] = q
	}
	var displaced *Waiter
	if q.n >= s.cfg.Admission.QueueSize {
		heavy := q.heaviest()
		if s.cfg.Admission.QueueSize == 0 || len(q.byKey[key])+1 >= len(q.byKey[heavy]) {
			return Admission{Err: fmt.Errorf("router: %q: queue full: %w", req.Model, ErrOverloaded), RetryAfter: s.retryAfter(q, now)}
		}
		list := q.byKey[heavy]
		displaced = list[len(list)-1]
		s.drop(q, displaced)
	}
	s.seq++
	w := &Waiter{Seq: s.seq, From: from, Req: *req, Key: key, Queue: name, Enqueued: now, Deadline: now.Add(s.cfg.Admission.QueueTimeout)}
	q.push(w)
	s.waiters[w.Seq] = w
	if from != nil {
		s.byFrom[pidKey(from)] = w.Seq
	}
	return Admission{Queued: w, Displaced: displaced, RetryAfter: s.retryAfter(q, now)}
}

// drop takes w out of its queue and the index.
func (s *State) drop(q *fairQueue, w *Waiter) {
	q.remove(w)
	s.forget(w)
	if q.n == 0 {
		delete(s.queues, w.Queue)
	}
}

// forget removes w from the indexes.
func (s *State) forget(w *Waiter) {
	delete(s.waiters, w.Seq)
	if w.From != nil && s.byFrom[pidKey(w.From)] == w.Seq {
		delete(s.byFrom, pidKey(w.From))
	}
}

// retryAfter is the Retry-After of an overloaded answer: how long the
// oldest waiter of q has waited, rounded up to whole seconds, at least 1 s.
func (s *State) retryAfter(q *fairQueue, now time.Time) time.Duration {
	d := time.Second
	if t, ok := q.oldest(); ok {
		d = max(d, now.Sub(t))
	}
	return (d + time.Second - 1).Truncate(time.Second)
}

// RetryAfter is the Retry-After for an overloaded answer from queue at now.
func (s *State) RetryAfter(queue string, now time.Time) time.Duration {
	if q := s.queues[queue]; q != nil {
		return s.retryAfter(q, now)
	}
	return time.Second
}

// Dispatch serves waiters while workers have room: in each queue (by
// name), the waiter whose turn it is (or, under cache_aware, a later one of
// the same key that warmWaiter prefers) is picked for until a pick finds
// every worker at its limit. A waiter whose pick fails otherwise (no routable
// worker left, model gone) leaves with that error; one past its deadline
// leaves with ErrOverloaded.
func (s *State) Dispatch(now time.Time) []Dispatched {
	if len(s.queues) == 0 {
		return nil
	}
	names := make([]string, 0, len(s.queues))
	for n := range s.queues {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []Dispatched
	for _, name := range names {
		q := s.queues[name]
		for q.n > 0 {
			w := q.peek()
			if !now.Before(w.Deadline) {
				q.pop()
				s.forget(w)
				out = append(out, Dispatched{W: w, Err: fmt.Errorf("router: %q: waited %s: %w", w.Req.Model, now.Sub(w.Enqueued), ErrOverloaded)})
				continue
			}
			head := w
			w = s.warmWaiter(q, head, now)
			s.full = false
			w.Req.NoAsk = true // a waiter routes on what it brought
			t, err := s.Pick(&w.Req, now)
			if err != nil && s.full && errors.Is(err, ErrNoCapacity) {
				break
			}
			if w != head {
				for _, x := range q.byKey[w.Key] {
					if x == w {
						break
					}
					x.Passed++
				}
			}
			q.take(w)
			s.forget(w)
			out = append(out, Dispatched{W: w, Target: t, Err: err})
		}
		if q.n == 0 {
			delete(s.queues, name)
		}
	}
	return out
}

// Expire takes waiter seq out of its queue when its deadline has come; it
// returns nil when the waiter already left.
func (s *State) Expire(seq uint64, now time.Time) *Waiter {
	w := s.waiters[seq]
	if w == nil || now.Before(w.Deadline) {
		return nil
	}
	s.drop(s.queues[w.Queue], w)
	return w
}

// Leave takes the waiter asked for by from out of its queue (its client
// went away); it returns nil when from is not waiting.
func (s *State) Leave(from *actor.PID) *Waiter {
	if from == nil {
		return nil
	}
	w := s.waiters[s.byFrom[pidKey(from)]]
	if w == nil {
		return nil
	}
	s.drop(s.queues[w.Queue], w)
	return w
}

func pidKey(p *actor.PID) string { return p.Address + "/" + p.Id }

// QueueLengths returns the number of waiters per queue (model).
func (s *State) QueueLengths() map[string]int {
	out := make(map[string]int, len(s.queues))
	for n, q := range s.queues {
		out[n] = q.n
	}
	return out
}

// WarmWindow is how many waiters of the key whose turn it is warmWaiter
// looks at, and how many times it lets the first of them be passed over.
const WarmWindow = 16

// warmWaiter chooses, under cache_aware, which of the first WarmWindow
// waiters of head's key leaves the queue: the one with the longest prefix
// cached (by the prefix index) on a worker that has room now, ties to the
// earliest, head when none holds any. A slot that frees on a worker then
// goes to a request that worker holds the prompt of, not to whichever
// request waited longest (SGLang's engines order their waiting queues by
// longest prefix match much the same way). Keys keep their turns; within a
// key the head is passed over at most WarmWindow times (Dispatch counts a
// pass when the later waiter leaves), so no request waits behind more than
// that many later ones.
func (s *State) warmWaiter(q *fairQueue, head *Waiter, now time.Time) *Waiter {
	list := q.byKey[head.Key]
	if s.prefix == nil || len(list) < 2 || head.Passed >= WarmWindow {
		return head
	}
	best, most := head, s.warmChunks(head, now)
	for _, w := range list[1:min(len(list), WarmWindow)] {
		if n := s.warmChunks(w, now); n > most && now.Before(w.Deadline) {
			best, most = w, n
		}
	}
	return best
}

// warmChunks is the longest prefix of w's prompt, in chunks, that the
// prefix index places on a routable worker that has room now and that w
// does not exclude, among the workers of the model w would be served by
// (its route's backend for its request id; a cascade's first step is not
// resolved, so its waiters hold nothing and keep their order).
func (s *State) warmChunks(w *Waiter, now time.Time) int {
	if w.Req.LeastLoaded {
		return 0
	}
	served := w.Req.Model
	if r, ok := s.table.Lookup(served); ok {
		served = routes.PickBackend(r, w.Req.RequestID)
	}
	base := served
	if p := s.pools[poolKey{served, fleet.RoleUnified}]; p != nil && len(p.ws) > 0 {
		base = p.ws[0].Model
	}
	model, ns := indexKey(base, served, w.Req.CacheSalt)
	most := 0
	for _, h := range s.prefix.index.LookupHashed(model, ns, w.Req.Prompt, w.Req.Hashes).Hits() {
		wk, c := s.workers[h.ID], s.inflight[h.ID]
		if h.Chunks <= most || wk == nil || c == nil || !wk.Routable(now) || w.Req.Exclude[h.ID] ||
			c.ejectedAt(now) || c.atLimit() {
			continue
		}
		most = h.Chunks
	}
	return most
}
