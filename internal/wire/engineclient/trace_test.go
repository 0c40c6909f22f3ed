package engineclient_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/tlgate/tlgate/internal/wire/engineclient"
	enginev1 "github.com/tlgate/tlgate/protos/tl/engine/v1"
	kvv1 "github.com/tlgate/tlgate/protos/tl/kv/v1"
)

// fakeEngine answers Prefill, Release and tokenize, keeping the
// traceparent each call carried.
type fakeEngine struct {
	enginev1.UnimplementedEngineControlServer
	kvv1.UnimplementedKvTransferServiceServer
	mu   sync.Mutex
	seen map[string]string // call → traceparent
}

func (f *fakeEngine) keep(ctx context.Context, call string) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[call] = strings.Join(md.Get("traceparent"), ",")
}

func (f *fakeEngine) Prefill(ctx context.Context, _ *enginev1.PrefillRequest) (*enginev1.PrefillResponse, error) {
	f.keep(ctx, "prefill")
	return &enginev1.PrefillResponse{HandleId: "kv-1"}, nil
}

func (f *fakeEngine) Release(ctx context.Context, _ *kvv1.ReleaseRequest) (*kvv1.ReleaseResponse, error) {
	f.keep(ctx, "release")
	return &kvv1.ReleaseResponse{Released: true}, nil
}

// TestEngineCallsCarryTraceparent: with a span in the caller's context,
// tokenize sends traceparent as an HTTP header and Prefill and Release as
// gRPC metadata (Release also when the caller's context is canceled);
// without one, nothing is sent.
func TestEngineCallsCarryTraceparent(t *testing.T) {
	f := &fakeEngine{seen: map[string]string{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	enginev1.RegisterEngineControlServer(srv, f)
	kvv1.RegisterKvTransferServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.seen["tokenize"] = r.Header.Get("Traceparent")
		f.mu.Unlock()
		_, _ = w.Write([]byte(`{"tokens":[1,2]}`))
	}))
	defer web.Close()

	c := engineclient.New(engineclient.Options{})
	defer c.Close()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	const want = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, traced := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		if traced {
			ctx = trace.ContextWithSpanContext(ctx, sc)
		}
		if _, err := c.Tokenize(ctx, strings.TrimPrefix(web.URL, "http://"), "m", []byte(`{"prompt":"x"}`), false); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Prefill(ctx, lis.Addr().String(), &enginev1.PrefillRequest{}); err != nil {
			t.Fatal(err)
		}
		cancel()
		if _, err := c.Release(ctx, lis.Addr().String(), "kv-1"); err != nil {
			t.Fatal(err)
		}
		f.mu.Lock()
		for _, call := range []string{"tokenize", "prefill", "release"} {
			w := want
			if !traced {
				w = ""
			}
			if f.seen[call] != w {
				t.Errorf("traced=%v: %s carried traceparent %q, want %q", traced, call, f.seen[call], w)
			}
		}
		f.mu.Unlock()
	}
}
