package test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// fakeEngine is an HTTP engine written by the test, registered with the
// gateway by heartbeats like any engine: for checks the reference engine
// cannot make (what body arrived, whether the request context ended).
type fakeEngine struct {
	srv  *httptest.Server
	stop chan struct{}
	done chan struct{}
}

func (c *cluster) addFake(id, model string, h http.HandlerFunc) *fakeEngine {
	c.t.Helper()
	f := &fakeEngine{stop: make(chan struct{}), done: make(chan struct{})}
	f.srv = httptest.NewServer(h)
	conn, err := grpc.NewClient(c.gw.RegistryAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatal(err)
	}
	cl := controlv1.NewWorkerRegistryClient(conn)
	st := &controlv1.WorkerStatus{WorkerId: id, Model: model, Role: controlv1.Role_ROLE_UNIFIED,
		HttpAddress: strings.TrimPrefix(f.srv.URL, "http://"), KvTotalBlocks: 100, KvFreeBlocks: 100, KvBlockTokens: 16}
	beat := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, _ = cl.Heartbeat(ctx, st)
	}
	beat()
	go func() {
		defer close(f.done)
		defer conn.Close()
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-f.stop:
				return
			case <-tk.C:
				beat()
			}
		}
	}()
	c.t.Cleanup(func() {
		close(f.stop)
		<-f.done
		f.srv.CloseClientConnections()
		f.srv.Close()
	})
	c.waitRoutable(id)
	return f
}
