package enginesim

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// APIServerCost is the serial work of vLLM's API server process beside
// the GPU steps: one Python event loop parses each request's HTTP body,
// applies the chat template and tokenizes it before the engine core sees
// it (PerRequest), and detokenizes and writes out every token the steps
// produce (PerOutputToken). The two share one server: a request's work
// goes before the tokens queued (the event loop parses a new request
// between chunks of output), each kind first come, first served, and
// output is capped at one token per PerOutputToken however large the
// batch. A sequence's next token is computed only once
// the previous one is handed to this server, so a backlog there slows the
// steps too, by one token of lookahead.
type APIServerCost struct {
	PerRequest     time.Duration
	PerOutputToken time.Duration
}

func (c APIServerCost) validate() error {
	if c.PerRequest < 0 || c.PerOutputToken < 0 {
		return fmt.Errorf("%w: negative API server cost", ErrConfig)
	}
	return nil
}

func (c APIServerCost) zero() bool { return c == APIServerCost{} }

// of is the work of a request (request) or of an output token.
func (c APIServerCost) of(request bool) time.Duration {
	if request {
		return c.PerRequest
	}
	return c.PerOutputToken
}

// apiQueue is the API server's order, for the live engine and Simulate
// alike: a request's work before queued tokens' (the event loop parses a
// new request between chunks of output), each kind first come, first
// served.
type apiQueue[T any] struct{ requests, tokens []T }

func (q *apiQueue[T]) push(w T, request bool) {
	if request {
		q.requests = append(q.requests, w)
	} else {
		q.tokens = append(q.tokens, w)
	}
}

// pop takes the next item, false when there is none.
func (q *apiQueue[T]) pop() (w T, ok bool) {
	switch {
	case len(q.requests) > 0:
		w, q.requests = q.requests[0], q.requests[1:]
	case len(q.tokens) > 0:
		w, q.tokens = q.tokens[0], q.tokens[1:]
	default:
		return w, false
	}
	return w, true
}

// apiServer is the live engine's APIServerCost: one goroutine (run)
// serves the items of an apiQueue.
type apiServer struct {
	cost  APIServerCost
	clock Clock

	mu      sync.Mutex
	queue   apiQueue[apiWork]
	wake    chan struct{}
	stopped chan struct{} // closed when run returns
}

// apiWork is an item of the server's queues, queued at at: done is
// closed once the server has spent d on it.
type apiWork struct {
	d    time.Duration
	at   time.Time
	done chan struct{}
}

func newAPIServer(cost APIServerCost, clock Clock) *apiServer {
	return &apiServer{cost: cost, clock: clock, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
}

// run serves the queues until ctx ends. It keeps its own schedule: an
// item starts when the one before it was due to end, or when it was
// queued if that is later. Timers wake late (by up to a millisecond
// here, more than a token's work), so waking late only shortens the
// next wait instead of adding to every item.
func (a *apiServer) run(ctx context.Context) {
	defer close(a.stopped)
	var end time.Time
	for {
		w, ok := a.next(ctx)
		if !ok {
			return
		}
		if end.Before(w.at) {
			end = w.at
		}
		end = end.Add(w.d)
		err := a.clock.Sleep(ctx, end.Sub(a.clock.Now()))
		close(w.done)
		if err != nil {
			return
		}
	}
}

// next waits for an item, in the queue's order.
func (a *apiServer) next(ctx context.Context) (apiWork, bool) {
	for {
		a.mu.Lock()
		w, ok := a.queue.pop()
		a.mu.Unlock()
		if ok {
			return w, true
		}
		select {
		case <-a.wake:
		case <-ctx.Done():
			return apiWork{}, false
		}
	}
}

// serve queues the work of a request (request) or of an output token and
// waits until it is done (or ctx ends). A nil server does no work.
func (a *apiServer) serve(ctx context.Context, request bool) error {
	if a == nil || a.cost.of(request) <= 0 {
		return ctx.Err()
	}
	w := apiWork{d: a.cost.of(request), done: make(chan struct{})}
	a.mu.Lock()
	w.at = a.clock.Now()
	a.queue.push(w, request)
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	select {
	case <-w.done:
		return nil
	case <-a.stopped:
		return errCoreClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// request is a request's work before it reaches the scheduler.
func (a *apiServer) request(ctx context.Context) error { return a.serve(ctx, true) }

// token is an output token's work before the client sees it.
func (a *apiServer) token(ctx context.Context) error { return a.serve(ctx, false) }
