package actorsys

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// goid is the calling goroutine's id, from its stack header.
func goid() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(buf, []byte("goroutine ")), []byte(" "))
	return string(id)
}

// TestPoolReusesItsGoroutines: work scheduled while the pool's goroutine
// is idle runs on it, every time.
func TestPoolReusesItsGoroutines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPool(1, DefaultThroughput)
		defer p.Close()
		ids := map[string]bool{}
		for range 5 {
			synctest.Wait() // the pooled goroutine is back in its loop
			done := make(chan string)
			p.Schedule(func() { done <- goid() })
			ids[<-done] = true
		}
		if len(ids) != 1 {
			t.Fatalf("5 scheduled functions ran on %d goroutines, want the pool's one", len(ids))
		}
	})
}

// TestPoolScheduleNeverBlocks: with every pooled goroutine busy, work runs
// on new goroutines at once; after Close, too.
func TestPoolScheduleNeverBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPool(2, DefaultThroughput)
		release := make(chan struct{})
		var running sync.WaitGroup
		running.Add(10)
		for range 10 {
			p.Schedule(func() { running.Done(); <-release })
		}
		running.Wait() // all 10 run at once: 2 pooled, 8 new
		close(release)
		p.Close()
		ran := make(chan struct{})
		p.Schedule(func() { close(ran) })
		select {
		case <-ran:
		case <-time.After(time.Minute):
			t.Fatal("work scheduled after Close did not run")
		}
		p.Close() // a second Close is harmless
	})
}

// counter is an actor that checks it sees its messages one at a time and
// in order.
type counter struct {
	mu     sync.Mutex
	busy   bool
	next   int
	failed string
}

func (c *counter) Receive(ctx actor.Context) {
	n, ok := ctx.Message().(int)
	if !ok {
		return
	}
	c.mu.Lock()
	if c.busy && c.failed == "" {
		c.failed = "two messages at once"
	}
	c.busy = true
	if n != c.next && c.failed == "" {
		c.failed = "out of order"
	}
	c.next++
	c.busy = false
	c.mu.Unlock()
	if ctx.Sender() != nil {
		ctx.Respond(n)
	}
}

// TestPoolRunsActors: actors on a pool keep the mailbox's guarantees (one
// message at a time, in order) under many senders' actors at once.
func TestPoolRunsActors(t *testing.T) {
	sys := New(zerolog.Nop())
	p := NewPool(2, DefaultThroughput)
	defer p.Close()
	defer sys.Shutdown()
	const actors, msgs = 20, 500
	counters := make([]*counter, actors)
	var wg sync.WaitGroup
	for i := range actors {
		c := &counter{}
		counters[i] = c
		pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return c }, actor.WithDispatcher(p)))
		wg.Go(func() {
			for n := range msgs - 1 {
				sys.Root.Send(pid, n)
			}
			if got, err := sys.Root.RequestFuture(pid, msgs-1, 30*time.Second).Result(); err != nil || got != msgs-1 {
				t.Errorf("actor %d: last reply %v, %v", i, got, err)
			}
			if err := sys.Root.StopFuture(pid).Wait(); err != nil {
				t.Errorf("actor %d: stop: %v", i, err)
			}
		})
	}
	wg.Wait()
	for i, c := range counters {
		if c.next != msgs || c.failed != "" {
			t.Errorf("actor %d: %d messages, %q", i, c.next, c.failed)
		}
	}
}
