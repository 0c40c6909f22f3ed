package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
)

// drillSlowClient is an HTTP client whose connections have a tiny receive
// buffer, so a stream it does not read fills it at once and the gateway's
// writes to it block.
func drillSlowClient(t *testing.T) *http.Client {
	d := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	tr := &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestDrillSlowClient: a client that stops reading a long stream holds only
// its own request. While the gateway's write to it is blocked (its
// in-flight slot still held), a burst of other clients, streamed and not,
// on the same engine all complete; then the slow client reads its stream to
// the end, a few bytes at a time, and gets all of it.
//
// Nothing here depends on the machine's speed: the gateway's let-go timer
// for clients that stop reading (idle_timeout) is set far beyond the test,
// and the wait for the engine to finish its 30,000 tokens fails only when
// the engine stops making progress, not when it is slow.
func TestDrillSlowClient(t *testing.T) {
	const slowTokens = 30000 // 5 MB of SSE: several times what the sockets buffer
	c := newCluster(t, "", []clusterOpt{keys(), drillGateway(func(g *config.Gateway) {
		g.IdleTimeout = config.D(10 * time.Minute)
	})}, enginesim.Config{ID: "a", Model: "m"})
	a := c.engines["a"]

	b, _ := json.Marshal(drillBody("m", slowTokens, true))
	req, _ := http.NewRequest(http.MethodPost, c.url+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+drillKey)
	resp, err := drillSlowClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("slow stream: %d", resp.StatusCode)
	}
	// The slow client reads nothing for now. The engine finishes the
	// stream (the gateway reads it all) while the gateway's relay stays
	// stuck on the slow client: its in-flight slot is still held.
	progressing(t, 10*time.Second, func() uint64 { return a.Stats().TokensSampled }, func() bool {
		return a.Stats().Completed == 1 && c.drillInFlight()["a"] == 1
	}, "the engine done with the slow stream and the gateway's write to the client blocked")

	var wg sync.WaitGroup
	outs := make([]drillOutcome, 16)
	for i := range outs {
		wg.Go(func() {
			outs[i] = c.drillSend(context.Background(), "/v1/completions", drillKey, fmt.Sprintf("fast-%d", i), drillBody("m", 8, i%2 == 0))
		})
	}
	wg.Wait()
	drillFailIf(t, outs, func(o drillOutcome) string {
		if !o.finishedOK(o.id[len(o.id)-1]%2 == 0) {
			return "fast client"
		}
		return ""
	})
	if n := c.drillInFlight()["a"]; n != 1 {
		t.Fatalf("in flight on a %d after the fast clients, want 1: the slow stream is not open any more", n)
	}

	// Now read it, 64 bytes at a time.
	var body bytes.Buffer
	buf := make([]byte, 64)
	for {
		n, err := resp.Body.Read(buf)
		body.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("slow read after %d bytes: %v", body.Len(), err)
		}
	}
	ev := sseEvents(body.Bytes())
	if len(ev) < 2 || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("slow stream: %d events, last %q", len(ev), ev[len(ev)-1])
	}
	t.Logf("slow stream: %d bytes, %d events, read after %d fast requests completed", body.Len(), len(ev), len(outs))
	c.drillWaitIdle()
}

// TestDrillVanishingClient: a client that goes away frees its in-flight
// slot and the engine's request at once (the engine counts it aborted long
// before it would have finished), streamed or not, unified or
// disaggregated, where the decode worker's KV handle is freed too.
func TestDrillVanishingClient(t *testing.T) {
	const tokens, perToken = 400, 25 * time.Millisecond // 10 s if nobody left
	c := newCluster(t, drillPDRoutes, []clusterOpt{keys()},
		enginesim.Config{ID: "u", Model: "m", DecodePerToken: perToken},
		enginesim.Config{ID: "p", Model: "m", Role: enginesim.RolePrefill},
		enginesim.Config{ID: "d", Model: "m", Role: enginesim.RoleDecode, DecodePerToken: perToken},
	)
	for _, tc := range []struct {
		name, model, engine string
		stream              bool
	}{
		{"unified stream", "m", "u", true},
		{"unified non-streamed", "m", "u", false},
		{"disaggregated stream", "pd", "d", true},
		{"disaggregated non-streamed", "pd", "d", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := c.engines[tc.engine]
			before := e.Stats()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			gone := make(chan drillOutcome, 1)
			if tc.stream {
				resp, _, err := c.drillOpenStream(ctx, drillKey, "vanish-"+tc.name, drillBody(tc.model, tokens, true))
				if err != nil {
					t.Fatal(err)
				}
				cancel() // gone after the first event
				resp.Body.Close()
			} else {
				go func() {
					gone <- c.drillSend(ctx, "/v1/completions", drillKey, "vanish-"+tc.name, drillBody(tc.model, tokens, false))
				}()
				eventually(t, 5*time.Second, func() bool { return e.Stats().Running == 1 }, "the engine running the request")
				cancel()
				if o := <-gone; o.err == nil {
					t.Fatalf("the client's request ended without its cancellation: %v", o)
				}
			}
			left := time.Now()
			eventually(t, 3*time.Second, func() bool {
				s := e.Stats()
				return s.Aborted == before.Aborted+1 && s.Running == 0 && s.HeldHandles == 0 && s.HeldBlocks == 0
			}, "the engine's request aborted and its KV freed: %+v", e.Stats())
			aborted := time.Since(left)
			c.drillWaitIdle()
			if s := e.Stats(); s.Completed != before.Completed {
				t.Fatalf("the engine completed the abandoned request: %+v", s)
			}
			t.Logf("engine request aborted %v after the client left (it would have run %v)", aborted.Round(time.Millisecond), tokens*perToken)
		})
	}
	if o := c.drillSend(context.Background(), "/v1/completions", drillKey, "after", drillBody("pd", 2, true)); !o.finishedOK(true) {
		t.Fatalf("after the vanishing clients: %v", o)
	}
}
