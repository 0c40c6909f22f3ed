package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestStreamClientStopsReading: a client that reads nothing is treated as
// gone once a write has waited ClientWriteTimeout: the relay ends with
// ClientGone and the engine's request is canceled.
func TestStreamClientStopsReading(t *testing.T) {
	engineDone := make(chan struct{})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(engineDone)
		w.Header().Set("Content-Type", "text/event-stream")
		event := "data: " + strings.Repeat("x", 16<<10) + "\n\n"
		for r.Context().Err() == nil {
			if _, err := fmt.Fprint(w, event); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	defer engine.Close()
	p := New(Options{ClientWriteTimeout: 200 * time.Millisecond, IdleTimeout: time.Minute})
	defer p.Close()
	results := make(chan Result, 1)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		results <- p.Stream(r.Context(), Attempt{URL: engine.URL, Body: []byte(`{}`)}, w, nil)
	}))
	defer gw.Close()

	conn, err := net.Dial("tcp", gw.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Ask, then never read: the socket buffers fill and writes block.
	fmt.Fprint(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	select {
	case res := <-results:
		if !res.ClientGone || !res.Committed {
			t.Fatalf("result %+v, want ClientGone after commit", res)
		}
	case <-ctx.Done():
		t.Fatal("the relay still waits on a client that reads nothing")
	}
	select {
	case <-engineDone:
	case <-ctx.Done():
		t.Fatal("the engine's request was not canceled")
	}
}

// TestStreamOutlastsClientWriteTimeout: a client that keeps reading a
// stream longer than ClientWriteTimeout gets all of it: the write
// deadline is renewed as the stream goes on, not set once.
func TestStreamOutlastsClientWriteTimeout(t *testing.T) {
	const timeout, events = 100 * time.Millisecond, 8
	engine := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		evs := make([]string, events)
		for i := range evs {
			evs[i] = fmt.Sprintf("data: {\"i\":%d}\n\n", i)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range append(evs, done) {
			// Half a timeout apart: the stream outlasts several
			// timeouts, far past one deadline and its slack.
			time.Sleep(timeout / 2)
			fmt.Fprint(w, e)
			w.(http.Flusher).Flush()
		}
	})
	p := newProxy(t, Options{ClientWriteTimeout: timeout})
	body, res := streamThrough(t, p, engine.URL)
	if !res.Done || res.ClientGone || res.Err != nil || res.Events != events+1 {
		t.Fatalf("Result %+v, want the whole stream (%d events and [DONE]) relayed", res, events)
	}
	if !strings.HasSuffix(body, done) {
		t.Fatalf("the client got %q, want the stream to [DONE]", body)
	}
}
