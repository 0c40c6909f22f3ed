package router

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/flowqueue"
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
// requests per worker and, when a model's workers are full, a bounded
// queue per model with a deadline, in priority bands, fair across API keys
// (flowqueue). A worker's limit is Engine[id], else Model[served model],
// else Worker when > 0, else what the engine's reports teach (see Limit).
// The limits bind on a model's workers together (a request waits when the
// gateway's requests on them reach the sum of their limits, and goes where
// the route policy sends it otherwise), or with PerWorker on each worker
// (one at its limit is no candidate). Saturation says when the engines'
// own reports show a worker saturated: when all of a model's are, its
// requests wait too and its sheddable ones are refused.
type AdmissionConfig struct {
	Enabled      bool
	PerWorker    bool
	Worker       int
	Model        map[string]int
	Engine       map[string]int
	QueueSize    int
	QueueTimeout time.Duration
	Saturation   SaturationConfig
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
	c := s.load(w.ID)
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

// held reports whether a pick must pass over the worker whose load is
// c: it is ejected, or, with limits per worker, at its limit. The latter
// marks the pick as full, so a request that finds no worker waits instead
// of being refused. With limits per pool (the default) no worker is passed
// over for its limit: poolFull judges the pool as a whole.
func (s *State) held(c *workerLoad, now time.Time) bool {
	if c.ejectedAt(now) {
		return true
	}
	if s.cfg.Admission.PerWorker && c.atLimit() {
		s.full = true
		return true
	}
	return false
}

// Waiter is a Route request waiting in a model's queue.
type Waiter struct {
	Seq   uint64
	From  *actor.PID // who asked: answered when the request leaves the queue
	Req   Request
	Key   string // the API key's name (fair shares)
	Class Class  // its priority, objective and fairness id
	Queue string // the queue's model
	// Enqueued is when it joined; Deadline when it leaves overloaded
	// (queue_timeout); Due orders it in its flow: Enqueued + its
	// objective, else Deadline.
	Enqueued, Deadline, Due time.Time
	Cancel                  func() // stops its timer (may be nil)
	// Passed counts the times a later waiter of the same flow left the
	// queue first, for a worker that holds more of its prompt (warmWaiter).
	Passed  int
	entry   *flowqueue.Entry[*Waiter]
	shape   string                    // pickShape of Req
	inShape *flowqueue.Entry[*Waiter] // its entry in its shape's queue
}

// modelQueue is one model's queue, and what its last pick found.
type modelQueue struct {
	q *flowqueue.Queue[*Waiter]
	// shapes holds its waiters again by the workers they ask for
	// (pickShape), each shape's in an order of its own (priority bands,
	// keys' turns, deadlines): lookPast serves from them.
	shapes map[string]*flowqueue.Queue[*Waiter]
	// saturated says why the last pick for one of its requests found every
	// worker saturated by its engine's reports ("": it did not), for the
	// requests that join behind waiters without a pick of their own.
	saturated string
}

// Admission is the outcome of Admit: a target or an error to answer now,
// or a request that waits (Queued). Displaced, when set, is a waiter the
// new one pushed out of a full queue: answer it ErrOverloaded. Shed are
// sheddable waiters refused because the model is saturated and a request
// of higher priority has to wait: answer them ErrSaturated.
type Admission struct {
	Target     Target
	Err        error
	Queued     *Waiter
	Displaced  *Waiter
	Shed       []*Waiter
	RetryAfter time.Duration
	Class      Class
	// Joined: the request joined the queue behind waiters of its priority
	// or higher without a pick of its own.
	Joined bool
}

// Dispatched is a waiter that leaves the queue with an answer: a target,
// or an error (ErrOverloaded when its wait reached the queue timeout,
// ErrObjective when its objective can no longer be met, ErrSaturated when
// it was shed, or the pick's own).
type Dispatched struct {
	W      *Waiter
	Target Target
	Err    error
}

// queueName is the queue a request waits in: its route's model (aliases
// resolved), else the model it names.
func (s *State) queueName(model string) string {
	if r, ok := s.table.Lookup(model); ok {
		return r.Model
	}
	return model
}

// routeOf is the route a request for model matches (RouteResult.Route):
// its route's model, the model itself when it is served without a route,
// "" when nothing serves it.
func (s *State) routeOf(model string, now time.Time) string {
	if r, ok := s.table.Lookup(model); ok {
		return r.Model
	}
	if model != "" && s.Known(model, now) {
		return model
	}
	return ""
}

// highest is q's highest priority, and false when q is nil or empty.
func highest(q *flowqueue.Queue[*Waiter]) (int, bool) {
	if q == nil {
		return 0, false
	}
	return q.Highest()
}

// queue returns the queue of name, creating it.
func (s *State) queue(name string) *modelQueue {
	if s.queues == nil {
		s.queues = map[string]*modelQueue{}
		s.waiters = map[uint64]*Waiter{}
		s.byFrom = map[string]uint64{}
	}
	mq := s.queues[name]
	if mq == nil {
		mq = &modelQueue{q: flowqueue.New[*Waiter](), shapes: map[string]*flowqueue.Queue[*Waiter]{}}
		s.queues[name] = mq
	}
	return mq
}

// Admit routes req at now like Pick, in its class (Classify). With
// admission control on, a request waits in its model's queue (or is
// refused when it cannot) when the pick finds the model's workers full,
// and joins the queue at once when waiters of its priority or higher that
// ask for the same workers (pickShape) are already there, so that none of
// them is passed by a later arrival. Waiters that ask for other workers
// found theirs full (Dispatch serves every waiter that finds room), so an
// arrival that finds room where they cannot is served at once.
func (s *State) Admit(req *Request, key string, from *actor.PID, now time.Time) Admission {
	cls := s.Classify(req)
	name := s.queueName(req.Model)
	shape := ""
	if s.cfg.Admission.Enabled {
		if mq := s.queues[name]; mq != nil {
			shape = s.pickShape(req)
			if hi, ok := highest(mq.shapes[shape]); ok && hi >= cls.Priority {
				if nt := s.tokensToWait(req, now); nt != nil {
					return Admission{Err: nt, Class: cls}
				}
				ad := s.enqueue(req, shape, key, cls, name, from, now)
				ad.Joined = true
				return ad
			}
		}
	}
	s.full, s.saturated, s.why = false, false, ""
	t, err := s.Pick(req, now)
	if err == nil || !s.cfg.Admission.Enabled || !s.full || !errors.Is(err, ErrNoCapacity) {
		if err == nil {
			t.Queue, t.Priority = name, cls.Priority
			if mq := s.queues[name]; mq != nil {
				mq.saturated = ""
			}
		}
		return Admission{Target: t, Err: err, Class: cls}
	}
	s.queue(name).saturated = s.saturatedWhy()
	if shape == "" {
		shape = s.pickShape(req)
	}
	return s.enqueue(req, shape, key, cls, name, from, now)
}

// saturatedWhy is s.why when the last pick found its pool saturated by
// the engines' reports, else "".
func (s *State) saturatedWhy() string {
	if s.saturated {
		return s.why
	}
	return ""
}

// enqueue puts req of class cls in queue name, or refuses it: a
// sheddable request while the model is saturated, a request whose
// objective the estimated wait already misses, one that finds the queue
// full and can push nobody out.
func (s *State) enqueue(req *Request, shape, key string, cls Class, name string, from *actor.PID, now time.Time) Admission {
	a := &s.cfg.Admission
	mq := s.queue(name)
	defer s.dropEmpty(name)
	if cls.Sheddable() && mq.saturated != "" {
		return Admission{Err: &SaturatedError{Model: req.Model, Priority: cls.Priority, Why: mq.saturated}, RetryAfter: s.retryAfter(mq, now), Class: cls}
	}
	deadline := now.Add(a.QueueTimeout)
	it := flowqueue.Item{Priority: cls.Priority, Key: key, Flow: cls.Flow, Due: deadline, Arrived: now, Seq: s.seq + 1}
	if cls.Objective > 0 && now.Add(cls.Objective).Before(deadline) {
		it.Due = now.Add(cls.Objective)
	}
	if cls.Objective > 0 && !cls.ServeLate {
		ahead := mq.q.AheadOf(it)
		wait, ttft := s.waitEstimate(name, ahead, now), s.ttftEstimate(name, cls.Priority, now)
		if wait+ttft > cls.Objective {
			return Admission{Err: &ObjectiveError{Model: req.Model, Objective: cls.Objective, Wait: wait, TTFT: ttft, Ahead: ahead},
				RetryAfter: wait, Class: cls}
		}
	}
	var shed []*Waiter
	if mq.saturated != "" {
		shed = s.shed(mq)
	}
	var displaced *Waiter
	if mq.q.Len() >= a.QueueSize {
		var v *flowqueue.Entry[*Waiter]
		if a.QueueSize > 0 {
			v = mq.q.Victim(it)
		}
		if v == nil {
			return Admission{Err: fmt.Errorf("router: %q: queue full: %w", req.Model, ErrOverloaded), RetryAfter: s.retryAfter(mq, now), Shed: shed, Class: cls}
		}
		displaced = v.Value
		s.drop(mq, displaced)
	}
	s.seq++
	w := &Waiter{Seq: s.seq, From: from, Req: *req, Key: key, Class: cls, Queue: name, Enqueued: now, Deadline: deadline, Due: it.Due,
		shape: shape}
	// A waiter is routed on what it brought when it leaves: sent away to
	// tokenize then, it would lose its place, and the slot it waited for
	// would go to a later arrival (tokenizeBeforeWait asks before it joins).
	w.Req.NoAsk = true
	w.entry = mq.q.Push(it, w)
	sq := mq.shapes[w.shape]
	if sq == nil {
		sq = flowqueue.New[*Waiter]()
		mq.shapes[w.shape] = sq
	}
	w.inShape = sq.Push(it, w)
	s.waiters[w.Seq] = w
	if from != nil {
		s.byFrom[pidKey(from)] = w.Seq
	}
	return Admission{Queued: w, Displaced: displaced, Shed: shed, RetryAfter: s.retryAfter(mq, now), Class: cls}
}

// shed takes every sheddable waiter out of mq.
func (s *State) shed(mq *modelQueue) []*Waiter {
	var out []*Waiter
	for _, e := range mq.q.ShedBelow(0) {
		s.forget(e.Value)
		out = append(out, e.Value)
	}
	return out
}

// drop takes w out of its queue and the index.
func (s *State) drop(mq *modelQueue, w *Waiter) {
	mq.q.Remove(w.entry)
	s.forget(w)
}

// dropEmpty forgets queue name when nothing waits there.
func (s *State) dropEmpty(name string) {
	if mq := s.queues[name]; mq != nil && mq.q.Len() == 0 {
		delete(s.queues, name)
		if d := s.drains[name]; d != nil {
			d.backlog = false // the time until its next dispatch is no dispatch interval
		}
	}
}

// forget removes w, which left its queue, from the indexes.
func (s *State) forget(w *Waiter) {
	if mq := s.queues[w.Queue]; mq != nil {
		if sq := mq.shapes[w.shape]; sq != nil {
			if sq.Remove(w.inShape); sq.Len() == 0 {
				delete(mq.shapes, w.shape)
			}
		}
	}
	delete(s.waiters, w.Seq)
	if w.From != nil && s.byFrom[pidKey(w.From)] == w.Seq {
		delete(s.byFrom, pidKey(w.From))
	}
}

// retryAfter is the Retry-After of an overloaded answer: how long the
// oldest waiter of mq has waited, rounded up to whole seconds, at least 1 s.
func (s *State) retryAfter(mq *modelQueue, now time.Time) time.Duration {
	d := time.Second
	if t, ok := mq.q.Oldest(); ok {
		d = max(d, now.Sub(t))
	}
	return (d + time.Second - 1).Truncate(time.Second)
}

// RetryAfter is the Retry-After for an overloaded answer from queue at now.
func (s *State) RetryAfter(queue string, now time.Time) time.Duration {
	if mq := s.queues[queue]; mq != nil {
		return s.retryAfter(mq, now)
	}
	return time.Second
}

// unreachable returns the ObjectiveError of waiter w at now when its
// objective can no longer be met (now plus the engines' recent TTFT is
// past it) and its key does not ask to be served late; else nil.
func (s *State) unreachable(w *Waiter, now time.Time) error {
	c := w.Class
	if c.Objective <= 0 || c.ServeLate {
		return nil
	}
	ttft := s.ttftEstimate(w.Queue, c.Priority, now)
	if waited := now.Sub(w.Enqueued); waited+ttft > c.Objective {
		return &ObjectiveError{Model: w.Req.Model, Objective: c.Objective, Waited: waited, TTFT: ttft}
	}
	return nil
}

// CheckAt is when waiter w's timer should fire next, at now: its
// deadline, or earlier the moment its objective becomes unreachable by
// the current estimate.
func (s *State) CheckAt(w *Waiter, now time.Time) time.Time {
	c := w.Class
	if c.Objective <= 0 || c.ServeLate {
		return w.Deadline
	}
	at := w.Enqueued.Add(c.Objective - s.ttftEstimate(w.Queue, c.Priority, now))
	if at.After(w.Deadline) {
		return w.Deadline
	}
	return at
}

// Dispatch serves waiters while workers have room: in each queue (by
// name), the waiter whose turn it is (highest priority first; or, under
// cache_aware, a later one of the same flow that warmWaiter prefers) is
// picked for until a pick finds the model's workers full. A waiter whose
// pick fails otherwise (no routable worker left, model gone) leaves with
// that error; one past its deadline leaves with ErrOverloaded, one whose
// objective can no longer be met with ErrObjective. A pick that finds
// the model saturated by its engines' reports sheds its sheddable waiters
// (ErrSaturated). Once every queue's next waiter finds its workers full,
// the waiters behind them that ask for other workers are served where
// there is room (lookPast).
func (s *State) Dispatch(now time.Time) []Dispatched {
	if len(s.queues) == 0 {
		return nil
	}
	var out []Dispatched
	// Queues of different routes may share workers: their heads go in
	// one order (nextQueue), so that no waiter is passed by one of a lower
	// priority in another queue. A queue whose pick finds its workers
	// full is done for this round.
	full := map[string]bool{}
	fullShape := map[string]string{} // per queue, the shape whose pick found its workers full
	for {
		name, mq := s.nextQueue(full)
		if mq == nil {
			break
		}
		w := mq.q.Peek().Value
		if err := s.expired(w, now); err != nil {
			s.drop(mq, w)
			out = append(out, Dispatched{W: w, Err: err})
			continue
		}
		head := w
		w = s.warmWaiter(mq, head, now)
		s.full, s.saturated, s.why = false, false, ""
		t, err := s.Pick(&w.Req, now)
		if err != nil && s.full && errors.Is(err, ErrNoCapacity) {
			if mq.saturated = s.saturatedWhy(); mq.saturated != "" {
				for _, x := range s.shed(mq) {
					out = append(out, Dispatched{W: x, Err: &SaturatedError{Model: x.Req.Model, Priority: x.Class.Priority, Why: mq.saturated}})
				}
			}
			full[name], fullShape[name] = true, w.shape
			continue
		}
		mq.saturated = ""
		if w != head {
			for _, x := range mq.q.Turn(WarmWindow) {
				if x.Value == w {
					break
				}
				x.Value.Passed++
			}
		}
		mq.q.Served(w.entry)
		out = s.departed(name, mq, w, t, err, now, out)
	}
	// The queues go in the same order for the waiters behind their heads.
	done := map[string]bool{}
	for {
		name, mq := s.nextQueue(done)
		if mq == nil {
			break
		}
		done[name] = true
		out = s.lookPast(name, mq, fullShape[name], now, out)
	}
	for name := range s.queues {
		s.dropEmpty(name)
	}
	return out
}

// lookPast serves, from queue name (mq) whose next waiter's pick found
// the workers it asks for (shape full) full, the waiters behind it that
// ask for other workers and find room, and appends them to out. The head
// asks for another cascade step's workers, or another canary backend's,
// or is a failover retry that excludes the worker that failed it, or a
// follow-up pinned to one worker: it cannot use the room another worker
// has, and need not hold back those that can. Waiters that ask for the
// same workers (pickShape) find the same workers full, so each shape's
// waiters are taken in their own order (the queue's: priority bands,
// keys' turns, deadlines) until one finds its workers full; the shapes go
// in the order of their next waiters (priority, then due). The waiters
// passed keep their places; one served so leaves without taking its key's
// turn in the queue. A next waiter past its deadline, or its objective,
// leaves as Dispatch's would.
func (s *State) lookPast(name string, mq *modelQueue, full string, now time.Time, out []Dispatched) []Dispatched {
	if len(mq.shapes) < 2 {
		return out
	}
	tried := map[string]bool{full: true} // shapes found full; their waiters stay
	for {
		shape, sq := nextShape(mq, tried)
		if sq == nil {
			return out
		}
		e := sq.Peek()
		w := e.Value
		if err := s.expired(w, now); err != nil {
			s.drop(mq, w)
			out = append(out, Dispatched{W: w, Err: err})
			continue
		}
		s.full, s.saturated, s.why = false, false, ""
		t, err := s.Pick(&w.Req, now)
		if err != nil && s.full && errors.Is(err, ErrNoCapacity) {
			tried[shape] = true
			continue
		}
		sq.Served(e)
		mq.q.Remove(w.entry)
		out = s.departed(name, mq, w, t, err, now, out)
	}
}

// departed records waiter w, taken out of queue name (mq) at now with its
// pick (t, err), as dispatched, and appends it to out.
func (s *State) departed(name string, mq *modelQueue, w *Waiter, t Target, err error, now time.Time, out []Dispatched) []Dispatched {
	s.forget(w)
	s.dispatched(name, mq.q.Len(), now)
	if err == nil {
		t.Queue, t.Priority = name, w.Class.Priority
	}
	return append(out, Dispatched{W: w, Target: t, Err: err})
}

// nextShape returns the shape of mq, among those not tried, whose next
// waiter goes first: the highest priority, then the earliest due, then
// the shape (nil: none is left).
func nextShape(mq *modelQueue, tried map[string]bool) (string, *flowqueue.Queue[*Waiter]) {
	var (
		best  string
		bq    *flowqueue.Queue[*Waiter]
		bHead *Waiter
	)
	for shape, sq := range mq.shapes {
		if tried[shape] || sq.Len() == 0 {
			continue
		}
		if w := sq.Peek().Value; leavesFirst(w, shape, bHead, best) {
			best, bq, bHead = shape, sq, w
		}
	}
	return best, bq
}

// expired returns the error a waiter leaves with at now without a pick:
// ErrOverloaded past its deadline, an ObjectiveError once its objective is
// out of reach; nil while it may wait.
func (s *State) expired(w *Waiter, now time.Time) error {
	if !now.Before(w.Deadline) {
		return fmt.Errorf("router: %q: waited %s: %w", w.Req.Model, now.Sub(w.Enqueued), ErrOverloaded)
	}
	return s.unreachable(w, now)
}

// pickShape names the workers a pick for req may go to: the model asked
// for, the cascade step, what forces the last step or the least loaded
// worker, the backend drawn for it, the pin, the prefill worker kept, the
// workers excluded. Two requests of one shape find the same workers full
// (while the route table stays the same).
func (s *State) pickShape(req *Request) string {
	var b strings.Builder
	b.WriteString(req.Model)
	b.WriteByte(0)
	b.WriteString(s.drawnBackend(req))
	b.WriteByte(0)
	b.WriteString(strconv.Itoa(req.Step))
	for _, f := range []bool{req.Stream, req.LeastLoaded, req.AnyRole, req.Unjudged} {
		if f {
			b.WriteByte('1')
		} else {
			b.WriteByte('0')
		}
	}
	b.WriteByte(0)
	b.WriteString(req.Pin)
	b.WriteByte(0)
	b.WriteString(req.KeepPrefill)
	for _, id := range slices.Sorted(maps.Keys(req.Exclude)) {
		if req.Exclude[id] {
			b.WriteByte(0)
			b.WriteString(id)
		}
	}
	return b.String()
}

// drawnBackend is the backend drawn for req on its route (or its cascade
// step's route) when that route splits its traffic, else "".
func (s *State) drawnBackend(req *Request) string {
	r, ok := s.table.Lookup(req.Model)
	if !ok || req.Pin != "" {
		return ""
	}
	if r.IsCascade() {
		r, _ = s.resolveStep(r, lastStepFor(r, req), req)
	}
	if len(r.Backends) < 2 {
		return ""
	}
	return routes.PickBackend(r, req.RequestID)
}

// nextQueue returns the queue, among those not in full, whose next waiter
// goes first: the highest priority, then the earliest due, then the
// queue's name (nil: none waits).
func (s *State) nextQueue(full map[string]bool) (string, *modelQueue) {
	var (
		best  string
		bq    *modelQueue
		bHead *Waiter
	)
	for name, mq := range s.queues {
		if full[name] || mq.q.Len() == 0 {
			continue
		}
		if w := mq.q.Peek().Value; leavesFirst(w, name, bHead, best) {
			best, bq, bHead = name, mq, w
		}
	}
	return best, bq
}

// leavesFirst reports whether waiter w, the next of the queue (or shape)
// named name, leaves before b (nil: none yet), the next of bName: the
// higher priority, then the earlier due, then the name.
func leavesFirst(w *Waiter, name string, b *Waiter, bName string) bool {
	switch {
	case b == nil:
		return true
	case w.Class.Priority != b.Class.Priority:
		return w.Class.Priority > b.Class.Priority
	case !w.Due.Equal(b.Due):
		return w.Due.Before(b.Due)
	}
	return name < bName
}

// Expiry is what a waiter's timer found: the waiter that leaves (nil when
// it already left, or when it waits on) with its error (ErrOverloaded or
// an ObjectiveError), or when to look again.
type Expiry struct {
	W     *Waiter
	Err   error
	Again time.Time
}

// Expire looks at waiter seq when its timer fires at now: past its
// deadline it leaves with ErrOverloaded, with its objective out of reach
// with ErrObjective; otherwise (the estimate moved) Again is its next
// check.
func (s *State) Expire(seq uint64, now time.Time) Expiry {
	w := s.waiters[seq]
	if w == nil {
		return Expiry{}
	}
	if err := s.expired(w, now); err != nil {
		s.drop(s.queues[w.Queue], w)
		s.dropEmpty(w.Queue)
		return Expiry{W: w, Err: err}
	}
	next := s.CheckAt(w, now)
	if !next.After(now) {
		// On the edge: just past it, it is out of reach.
		next = now.Add(time.Millisecond)
	}
	return Expiry{Again: next}
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
	s.dropEmpty(w.Queue)
	return w
}

func pidKey(p *actor.PID) string { return p.Address + "/" + p.Id }

// QueueLengths returns the number of waiters per queue (model).
func (s *State) QueueLengths() map[string]int {
	out := make(map[string]int, len(s.queues))
	for n, mq := range s.queues {
		out[n] = mq.q.Len()
	}
	return out
}

// QueueBand is the waiters of one key in one priority band of a queue.
type QueueBand struct {
	Priority int    `json:"priority"`
	Key      string `json:"key"`
	Waiting  int    `json:"waiting"`
}

// QueueBands returns the waiters per queue (model), band and key, bands
// from the highest.
func (s *State) QueueBands() map[string][]QueueBand {
	out := make(map[string][]QueueBand, len(s.queues))
	for n, mq := range s.queues {
		for _, c := range mq.q.Counts() {
			out[n] = append(out[n], QueueBand{Priority: c.Priority, Key: c.Key, Waiting: c.N})
		}
	}
	return out
}

// WarmWindow is how many waiters of the flow whose turn it is warmWaiter
// looks at, and how many times it lets the first of them be passed over.
const WarmWindow = 16

// warmWaiter chooses, under cache_aware, which of the first WarmWindow
// waiters of head's flow (its key and fairness id, in its band) leaves the
// queue: the one with the longest prefix cached (by the prefix index) on
// a worker that has room now, ties to the earliest, head when none holds
// any. A slot that frees on a worker then goes to a request that worker
// holds the prompt of, not to whichever request waited longest (SGLang's
// engines order their waiting queues by longest prefix match much the
// same way). Keys and flows keep their turns; within a flow the head is
// passed over at most WarmWindow times (Dispatch counts a pass when the
// later waiter leaves), so no request waits behind more than that many
// later ones, and a waiter with a TTFT objective is never passed over.
func (s *State) warmWaiter(mq *modelQueue, head *Waiter, now time.Time) *Waiter {
	if s.prefix == nil || head.Passed >= WarmWindow || head.Class.Objective > 0 {
		return head
	}
	list := mq.q.Turn(WarmWindow)
	if len(list) < 2 {
		return head
	}
	best, most := head, s.warmChunks(head, now)
	for _, e := range list[1:] {
		w := e.Value
		if now.Before(w.Deadline) {
			if n := s.warmChunks(w, now); n > most {
				best, most = w, n
			}
		}
		if w.Class.Objective > 0 {
			break // never passed over: no later waiter leaves before it
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
