package request

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// Run spawns the request actor of ex and runs it on the calling goroutine,
// the edge's, until it hands back its outcome; it returns once no attempt
// of the exchange still runs (Exchange.Wait). The edge's goroutine would
// wait for the outcome anyway: here it runs, while it waits, the actor's
// mailbox and the request's attempts (Exchange.spawn), so a request
// answered by its first worker costs two goroutine handoffs (the route's
// question to the router and its answer) instead of one per message.
// Messages that arrive while that goroutine is inside an attempt run on
// d.Dispatcher, so the actor answers them at once; protoactor's mailbox
// runs one batch of messages at a time wherever it runs, so the actor's
// guarantees hold.
func Run(root *actor.RootContext, d *Deps, ex *Exchange) Outcome {
	l := newEdgeLoop(d.Dispatcher)
	ex.loop = l
	p := Props(d, ex)
	p.Configure(actor.WithDispatcher(l))
	root.Spawn(p)
	o := l.run(ex.Done)
	ex.Wait()
	return o
}

// edgeLoop is the actor.Dispatcher of one request actor run by Run: it
// runs the actor's mailbox, and the attempts handed to it (goWork), on the
// goroutine in edgeLoop.run while that goroutine waits; elsewhere while
// it is busy with an attempt or has left.
type edgeLoop struct {
	mu      sync.Mutex
	state   loopState
	mailbox func()    // a mailbox run scheduled for the loop
	work    *edgeWork // an attempt handed to the loop
	wake    chan struct{}
	// fallback runs the mailbox when the loop cannot.
	fallback actor.Dispatcher
}

// loopState is what the loop's goroutine is doing.
type loopState uint8

const (
	// loopWaiting: it waits for the outcome and runs what is scheduled.
	loopWaiting loopState = iota
	// loopBusy: it runs an attempt; the mailbox runs on the fallback.
	loopBusy
	// loopGone: it has the outcome and left; everything runs elsewhere.
	loopGone
)

// edgeWork is an attempt handed to the loop: run does the I/O, then
// reports its outcome to the actor once the loop runs the mailbox again.
type edgeWork struct{ run, then func() }

var _ actor.Dispatcher = (*edgeLoop)(nil)

func newEdgeLoop(fallback actor.Dispatcher) *edgeLoop {
	if fallback == nil {
		fallback = actor.NewDefaultDispatcher(300)
	}
	return &edgeLoop{wake: make(chan struct{}, 1), fallback: fallback}
}

// Schedule runs a mailbox run on the loop's goroutine when it waits, else
// on the fallback. It never blocks.
func (l *edgeLoop) Schedule(fn func()) {
	l.mu.Lock()
	if l.state != loopWaiting || l.mailbox != nil {
		l.mu.Unlock()
		l.fallback.Schedule(fn)
		return
	}
	l.mailbox = fn
	l.mu.Unlock()
	l.signal()
}

// Throughput is the fallback's.
func (l *edgeLoop) Throughput() int { return l.fallback.Throughput() }

// goWork runs run and then then on the loop's goroutine when it waits and
// holds no other attempt, else on a new goroutine. then runs after the
// loop is back to running the mailbox, so the message it sends is
// processed there. It never blocks.
func (l *edgeLoop) goWork(run, then func()) {
	l.mu.Lock()
	if l.state != loopWaiting || l.work != nil {
		l.mu.Unlock()
		spawnAway(run, then)
		return
	}
	l.work = &edgeWork{run: run, then: then}
	l.mu.Unlock()
	l.signal()
}

func (l *edgeLoop) signal() {
	select {
	case l.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// run runs what is scheduled until done delivers the outcome, then leaves.
func (l *edgeLoop) run(done <-chan Outcome) Outcome {
	for {
		select {
		case o := <-done:
			l.leave()
			return o
		case <-l.wake:
			l.drain()
		}
	}
}

// drain runs the scheduled mailbox run, then the attempt handed over, if
// any, with the mailbox sent to the fallback while the attempt runs.
func (l *edgeLoop) drain() {
	l.mu.Lock()
	mb := l.mailbox
	l.mailbox = nil
	l.mu.Unlock()
	if mb != nil {
		mb()
	}
	l.mu.Lock()
	w := l.work
	l.work = nil
	if w == nil {
		l.mu.Unlock()
		return
	}
	l.state = loopBusy
	mb = l.mailbox
	l.mailbox = nil
	l.mu.Unlock()
	if mb != nil {
		l.fallback.Schedule(mb)
	}
	w.run()
	l.mu.Lock()
	l.state = loopWaiting
	l.mu.Unlock()
	w.then()
}

// leave hands what is still scheduled elsewhere: the loop's goroutine
// goes back to the edge.
func (l *edgeLoop) leave() {
	l.mu.Lock()
	l.state = loopGone
	mb, w := l.mailbox, l.work
	l.mailbox, l.work = nil, nil
	l.mu.Unlock()
	if mb != nil {
		l.fallback.Schedule(mb)
	}
	if w != nil {
		go func() { w.run(); w.then() }()
	}
}
