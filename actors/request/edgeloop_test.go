package request

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// countingDispatcher runs each mailbox run at once, on the caller's
// goroutine, and counts them.
type countingDispatcher struct{ n atomic.Int64 }

func (c *countingDispatcher) Schedule(fn func()) { c.n.Add(1); fn() }
func (c *countingDispatcher) Throughput() int    { return 300 }

// TestEdgeLoop walks the loop's states: what it runs itself and what it
// hands to the fallback or to a new goroutine.
func TestEdgeLoop(t *testing.T) {
	t.Run("a mailbox run scheduled while the loop waits runs on the loop", func(t *testing.T) {
		fb := &countingDispatcher{}
		l := newEdgeLoop(fb)
		ran := false
		l.Schedule(func() { ran = true })
		if ran || fb.n.Load() != 0 {
			t.Fatal("the run did not wait for the loop")
		}
		l.drain()
		if !ran || fb.n.Load() != 0 {
			t.Fatalf("ran %v, fallback runs %d: want it run by the loop", ran, fb.n.Load())
		}
	})
	t.Run("while the loop runs an attempt the mailbox runs on the fallback, and the attempt's report on the loop", func(t *testing.T) {
		fb := &countingDispatcher{}
		l := newEdgeLoop(fb)
		during, reported := false, false
		l.goWork(func() {
			l.Schedule(func() { during = true })
			if !during || fb.n.Load() != 1 {
				t.Error("a message that came during the attempt waited for it")
			}
		}, func() {
			l.Schedule(func() { reported = true })
		})
		l.drain()
		if reported || fb.n.Load() != 1 {
			t.Fatalf("the report's mailbox run went to the fallback (%d runs there)", fb.n.Load())
		}
		l.drain()
		if !reported {
			t.Fatal("the loop did not run the report's mailbox run")
		}
	})
	t.Run("a mailbox run pending when an attempt starts goes to the fallback", func(t *testing.T) {
		fb := &countingDispatcher{}
		l := newEdgeLoop(fb)
		var order []string
		l.Schedule(func() {
			order = append(order, "first")
			l.goWork(func() { order = append(order, "attempt") }, func() {})
			l.Schedule(func() { order = append(order, "second") }) // as a mailbox going idle and woken again would
		})
		l.drain()
		if want := []string{"first", "second", "attempt"}; !slices.Equal(order, want) || fb.n.Load() != 1 {
			t.Fatalf("order %v, fallback runs %d; want %v and 1", order, fb.n.Load(), want)
		}
	})
	t.Run("an attempt handed over while the loop is busy runs on its own goroutine", func(t *testing.T) {
		l := newEdgeLoop(&countingDispatcher{})
		done := make(chan struct{})
		l.goWork(func() {
			l.goWork(func() {}, func() { close(done) })
			<-done // the loop is busy here: only another goroutine can end this
		}, func() {})
		l.drain()
	})
	t.Run("what is pending when the outcome arrives runs elsewhere", func(t *testing.T) {
		fb := &countingDispatcher{}
		l := newEdgeLoop(fb)
		done := make(chan Outcome, 1)
		attempt := make(chan struct{})
		l.Schedule(func() {})
		l.goWork(func() {}, func() { close(attempt) })
		done <- Outcome{Status: 200}
		<-l.wake // the loop sees only the outcome
		if o := l.run(done); o.Status != 200 {
			t.Fatalf("outcome %d", o.Status)
		}
		<-attempt
		if fb.n.Load() != 1 {
			t.Fatalf("fallback runs %d, want the pending mailbox run", fb.n.Load())
		}
		l.Schedule(func() {})
		if fb.n.Load() != 2 {
			t.Fatal("a mailbox run scheduled after the loop left did not go to the fallback")
		}
	})
}

// TestRequestRunsOnItsEdgeGoroutine: a request that fails over (worker a
// answers 503) and escalates (b's answer is not confident enough) before
// the cascade's last step answers runs every message of its actor and its
// three attempts on the goroutine that called Run: no mailbox run goes to
// the dispatcher, so the request costs no goroutine handoff but the
// router's.
func TestRequestRunsOnItsEdgeGoroutine(t *testing.T) {
	e := failoverCascadeEngines(t)
	for _, stream := range []bool{false, true} {
		body := `{"model":"auto", "messages":[{"role":"user","content":"is it?"}]}`
		req, err := openai.ParseRequest([]byte(body), true)
		if err != nil {
			t.Fatal(err)
		}
		if stream {
			// One engine that streams: the attempt writes to the client
			// from the loop's goroutine.
			e = newEngines(t, map[string]func(http.ResponseWriter){"a": answerSSE, "b": answerSSE, "c": answerSSE})
			req.Stream = true
		}
		var (
			mu     sync.Mutex
			routes []router.Request
		)
		sys := actorsys.New(zerolog.Nop())
		rt := sys.Root.Spawn(actor.PropsFromFunc(cascadeRouter(e, &routes, &mu)))
		fb := &countingDispatcher{}
		d := &Deps{MaxAttempts: 3, Router: rt, Proxy: proxy.New(proxy.Options{}), Dispatcher: fb}
		rec := httptest.NewRecorder()
		ex := NewExchange(context.Background(), rec, req, "/v1/chat/completions", "req-1")
		got := make(chan Outcome, 1)
		go func() { got <- Run(sys.Root, d, ex) }()
		var o Outcome
		select {
		case o = <-got:
		case <-time.After(10 * time.Second):
			t.Fatal("the request did not end")
		}
		d.Proxy.Close()
		_ = sys.Root.StopFuture(rt).Wait()
		sys.Shutdown()
		if !stream && (o.Status != http.StatusOK || string(o.Body) != sureAnswer || len(routes) != 3) {
			t.Fatalf("outcome %d %s %q after %d routes, want the big model's answer after 3", o.Status, o.Code, o.Body, len(routes))
		}
		if stream && (!o.Streamed || rec.Code != http.StatusOK || rec.Body.Len() == 0) {
			t.Fatalf("streamed %v, client got %d %q: want the stream", o.Streamed, rec.Code, rec.Body.String())
		}
		if n := fb.n.Load(); n != 0 {
			t.Errorf("stream %v: %d mailbox runs went to the dispatcher, want every one on the edge's goroutine", stream, n)
		}
	}
}

// answerSSE streams one chunk and [DONE].
func answerSSE(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = w.Write([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"yes\"}}]}\n\ndata: [DONE]\n\n"))
}
