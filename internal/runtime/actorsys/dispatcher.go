package actorsys

import (
	"runtime"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// Pool is an actor.Dispatcher that runs mailboxes on a set of long-lived
// goroutines. protoactor's default dispatcher starts a goroutine every
// time a mailbox gets work; each starts on a small stack and grows it
// (copying) through the request actors' deep calls, which
// costs several percent of the gateway's CPU. A pooled goroutine keeps its
// grown stack. Schedule never blocks: when no pooled goroutine is idle the
// mailbox runs on a new goroutine, as with the default dispatcher.
type Pool struct {
	work       chan func()
	done       chan struct{}
	wg         sync.WaitGroup
	throughput int
	once       sync.Once
}

var _ actor.Dispatcher = (*Pool)(nil)

// DefaultThroughput is protoactor's default: the messages a mailbox
// processes before it yields its goroutine.
const DefaultThroughput = 300

// PoolSize is the pool size the gateway uses: four goroutines per
// GOMAXPROCS, at least 8. Mailboxes never block, so more of them run at
// once only briefly, and those run on new goroutines.
func PoolSize() int { return max(8, 4*runtime.GOMAXPROCS(0)) }

// NewPool starts a pool of n goroutines (at least 1) whose mailboxes
// process up to throughput messages before yielding (see
// DefaultThroughput). Close stops them.
func NewPool(n, throughput int) *Pool {
	p := &Pool{work: make(chan func()), done: make(chan struct{}), throughput: throughput}
	n = max(1, n)
	p.wg.Add(n)
	for range n {
		go p.loop()
	}
	return p
}

func (p *Pool) loop() {
	defer p.wg.Done()
	for {
		select {
		case fn := <-p.work:
			fn()
		case <-p.done:
			return
		}
	}
}

// Schedule runs fn on an idle pooled goroutine, else on a new one.
func (p *Pool) Schedule(fn func()) {
	select {
	case p.work <- fn:
	default:
		go fn()
	}
}

// Throughput is the messages a mailbox processes before yielding.
func (p *Pool) Throughput() int { return p.throughput }

// Close stops the pooled goroutines once they finish what they run; later
// work runs on new goroutines. It waits for them.
func (p *Pool) Close() {
	p.once.Do(func() { close(p.done) })
	p.wg.Wait()
}
