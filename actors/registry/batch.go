package registry

import (
	"cmp"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// MaxBatch bounds the workers in one *Changes: a subscriber (the router)
// spends bounded time on one batch, and messages queued behind it (the
// requests to route) wait at most that long.
const MaxBatch = 32

// Changes is a batch for a subscriber that subscribed Batched: the latest
// snapshot of each worker that changed, and the workers gone, since the
// previous batch, each worker at most once in each (one gone and back is
// in both: the subscriber applies Gone first, so that the worker starts
// afresh). The subscriber must respond
// with *ChangesApplied carrying Gen; the registry sends it no other batch
// until then and coalesces what happens meanwhile. So a subscriber's
// mailbox never holds more than one batch, however fast heartbeats come:
// a flood of heartbeats cannot put minutes of updates ahead of the
// requests it routes, and a real worker's latest heartbeat is in the next
// batch rather than behind thousands of others.
type Changes struct {
	Gen     uint64
	Changed []fleet.Worker
	Gone    []WorkerGone
}

// ChangesApplied acknowledges a *Changes.
type ChangesApplied struct{ Gen uint64 }

// subscriber is one subscriber and, when batched, what it has not been
// sent yet.
type subscriber struct {
	pid     *actor.PID
	batched bool
	gen     uint64 // unique per Subscribe; acks of an older one are stale
	busy    bool   // a batch is sent and not yet acknowledged
	pending map[string]pendingChange
	seq     uint64 // orders pending changes by when they were first pending
}

// pendingChange is a worker's latest change not yet sent: a snapshot, or
// its removal, or both (removed, then registered again: the removal is
// kept, for the subscriber to forget what it knew of the old one). fresh
// marks a worker the subscriber has not been told of yet (a new
// registration); updates of known workers go first.
type pendingChange struct {
	worker fleet.Worker
	gone   *WorkerGone
	fresh  bool
	seq    uint64
}

// add coalesces msg (a *WorkerChanged or *WorkerGone) into the pending
// changes; fresh says msg registers a new worker.
func (s *subscriber) add(msg any, fresh bool) {
	if s.pending == nil {
		s.pending = map[string]pendingChange{}
	}
	id := ""
	switch m := msg.(type) {
	case *WorkerChanged:
		id = m.Worker.ID
	case *WorkerGone:
		id = m.ID
	}
	old, ok := s.pending[id]
	if !ok {
		s.seq++
		old.seq = s.seq
	}
	c := pendingChange{fresh: fresh || ok && old.fresh, seq: old.seq}
	switch m := msg.(type) {
	case *WorkerChanged:
		c.worker, c.gone = m.Worker, old.gone
	case *WorkerGone:
		c.gone, c.fresh = m, false
	}
	s.pending[id] = c
}

// take removes and returns at most max pending changes: updates of known
// workers and removals first, then new workers; each part oldest first,
// so a worker that heartbeats often is never starved by many others.
func (s *subscriber) take(max int) *Changes {
	ids := make([]string, 0, len(s.pending))
	for id := range s.pending {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int {
		ca, cb := s.pending[a], s.pending[b]
		switch {
		case ca.fresh != cb.fresh && !ca.fresh:
			return -1
		case ca.fresh != cb.fresh:
			return 1
		}
		return cmp.Compare(ca.seq, cb.seq)
	})
	if len(ids) > max {
		ids = ids[:max]
	}
	b := &Changes{Gen: s.gen}
	for _, id := range ids {
		c := s.pending[id]
		delete(s.pending, id)
		if c.gone != nil {
			b.Gone = append(b.Gone, *c.gone)
		}
		if c.worker.ID != "" {
			b.Changed = append(b.Changed, c.worker)
		}
	}
	return b
}

// subscribe adds or resets a subscriber and sends it the full snapshot:
// whatever was pending for it is in the snapshot.
func (a *registryActor) subscribe(ctx actor.Context, m *Subscribe) {
	st := a.st
	i := slices.IndexFunc(st.subscribers, func(s *subscriber) bool { return s.pid.Equal(m.PID) })
	if i < 0 {
		st.subscribers = append(st.subscribers, &subscriber{pid: m.PID})
		i = len(st.subscribers) - 1
	}
	s := st.subscribers[i]
	st.gens++
	s.batched, s.busy, s.pending, s.gen = m.Batched, false, nil, st.gens
	ctx.Send(m.PID, st.snapshot(false, time.Now()))
}

// flush sends s its next batch unless one is unacknowledged.
func (a *registryActor) flush(ctx actor.Context, s *subscriber) {
	if s.busy || len(s.pending) == 0 {
		return
	}
	s.busy = true
	ctx.Request(s.pid, s.take(MaxBatch))
}

// applied handles a subscriber's acknowledgement of its batch (a response
// carries no sender: the generation, unique per Subscribe, names it).
func (a *registryActor) applied(ctx actor.Context, m *ChangesApplied) {
	for _, s := range a.st.subscribers {
		if s.gen == m.Gen {
			s.busy = false
			a.flush(ctx, s)
			return
		}
	}
}

// publishNow tells every subscriber of ws at once, ahead of any batch
// flow control: an operator's drain is answered only once the router has
// it in its mailbox, so no request is routed to a drained worker after
// the answer. Such a batch has Gen 0, so its acknowledgement is ignored.
func (a *registryActor) publishNow(ctx actor.Context, ws []fleet.Worker) {
	for _, s := range a.st.subscribers {
		if !s.batched {
			for _, w := range ws {
				ctx.Send(s.pid, &WorkerChanged{Worker: w})
			}
			continue
		}
		for _, w := range ws {
			delete(s.pending, w.ID) // older than ws
		}
		ctx.Request(s.pid, &Changes{Changed: ws})
	}
}
