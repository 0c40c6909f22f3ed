package proxy

import (
	"context"
	"io"
	"testing"
	"testing/synctest"
	"time"
)

// TestStreamTimeoutsExact runs the relay on a fake clock, with an in-memory
// engine that paces its events: the first-byte and idle timeouts fire at
// exactly their durations and not a nanosecond before.
func TestStreamTimeoutsExact(t *testing.T) {
	const (
		firstByte = 5 * time.Second
		idle      = 2 * time.Second
	)
	tests := []struct {
		name      string
		gaps      []time.Duration // wait before each event (ev1 each), then [DONE] right away
		stall     bool            // after the events, send nothing more
		committed bool
		wantAfter time.Duration // fake time at which Stream returns
		wantErr   Failure       // "" for a finished stream
	}{
		{"first event just in time", []time.Duration{firstByte - 1}, false, true, firstByte - 1, ""},
		{"first event 1ns late", []time.Duration{firstByte + 1}, false, false, firstByte, FailTimeout},
		{"events just inside the idle timeout", []time.Duration{0, idle - 1, idle - 1, idle - 1}, false, true, 3 * (idle - 1), ""},
		{"stall after two events", []time.Duration{1, idle - 1}, true, true, 1 + (idle - 1) + idle, FailTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := New(Options{FirstByteTimeout: firstByte, IdleTimeout: idle,
					Client: memClient(200, "text/event-stream", func(ctx context.Context) io.ReadCloser {
						pr, pw := io.Pipe()
						go func() {
							<-ctx.Done()
							pw.CloseWithError(context.Cause(ctx))
						}()
						go func() {
							for _, g := range tt.gaps {
								select {
								case <-time.After(g):
								case <-ctx.Done():
									return
								}
								if _, err := io.WriteString(pw, ev1); err != nil {
									return
								}
							}
							if !tt.stall {
								_, _ = io.WriteString(pw, done)
								pw.Close()
							}
						}()
						return pr
					})})
				start := time.Now()
				cw := newClientWriter()
				res := p.Stream(context.Background(), Attempt{URL: "http://engine/v1/completions", Body: []byte(`{}`)}, cw, nil)
				if got := time.Since(start); got != tt.wantAfter {
					t.Fatalf("Stream returned after %v, want %v", got, tt.wantAfter)
				}
				if res.Committed != tt.committed || ReasonOf(res.Err) != tt.wantErr || res.Done != (tt.wantErr == "") {
					t.Fatalf("Result = %+v", res)
				}
				if tt.committed && res.FirstByte != tt.gaps[0] {
					t.Fatalf("FirstByte = %v, want %v", res.FirstByte, tt.gaps[0])
				}
				synctest.Wait()
			})
		})
	}
}
