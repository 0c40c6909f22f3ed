package request

import (
	"context"
	"net"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// TestRoutesShareHashes: every Route of one request carries the same
// prompt hashes memo (router.Request.Hashes), so the router hashes the
// prompt once for its first route and its failover retry. A fake router
// sends the first attempt to a port nothing listens on, then answers
// model_not_found.
func TestRoutesShareHashes(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := l.Addr().String()
	_ = l.Close()

	var (
		mu     sync.Mutex
		routes []*router.Route
	)
	fake := func(ctx actor.Context) {
		m, ok := ctx.Message().(*router.Route)
		if !ok {
			return // Release, AttemptFailed...
		}
		mu.Lock()
		routes = append(routes, m)
		n := len(routes)
		mu.Unlock()
		if n == 1 {
			ctx.Respond(&router.RouteResult{Target: router.Target{Worker: fleet.Worker{ID: "a", HTTPAddress: refused}, CascadeSteps: 1}})
			return
		}
		ctx.Respond(&router.RouteResult{Err: router.ErrModelNotFound})
	}
	sys := actorsys.New(zerolog.Nop())
	defer sys.Shutdown()
	rt := sys.Root.Spawn(actor.PropsFromFunc(fake))
	defer func() { _ = sys.Root.StopFuture(rt).Wait() }()

	req := openai.Request{Model: "m", Prompt: "hello"}
	if req.Object, err = openai.ObjectOf([]byte(`{"model":"m","prompt":"hello"}`)); err != nil {
		t.Fatal(err)
	}
	ex := NewExchange(context.Background(), httptest.NewRecorder(), req, "/v1/completions", "req-1")
	d := &Deps{Router: rt, Proxy: proxy.New(proxy.Options{}), MaxAttempts: 2}
	sys.Root.Spawn(Props(d, ex))
	select {
	case <-ex.Done:
	case <-time.After(5 * time.Second):
		t.Fatal("the request did not end")
	}
	ex.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(routes) != 2 {
		t.Fatalf("%d Routes, want the first and the failover", len(routes))
	}
	if h := routes[0].Request.Hashes; h == nil || routes[1].Request.Hashes != h {
		t.Fatalf("Hashes %p then %p, want one memo for both", h, routes[1].Request.Hashes)
	}
}
