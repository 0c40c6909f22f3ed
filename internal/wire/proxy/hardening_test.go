package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestFetchTimeoutsExact: a non-streamed attempt is bounded like a stream,
// on a fake clock: the engine's headers within FirstByteTimeout, each read
// of its body within IdleTimeout, the whole within ResponseTimeout. Every
// such timeout is a retryable failure (it fails over).
func TestFetchTimeoutsExact(t *testing.T) {
	const (
		firstByte = 5 * time.Second
		idle      = 2 * time.Second
		total     = 30 * time.Second
	)
	answer := `{"choices":[{"text":"ok"}]}`
	tests := []struct {
		name      string
		headersAt time.Duration // -1: never
		gaps      []time.Duration
		stall     bool // after the pieces, nothing more (and no end)
		dribble   bool // pieces every idle-1 for ever
		wantAfter time.Duration
		wantErr   Failure
	}{
		{"never answers", -1, nil, false, false, firstByte, FailTimeout},
		{"headers just in time", firstByte - 1, []time.Duration{0}, false, false, firstByte - 1, ""},
		{"headers then part of the body, then a stall", time.Second, []time.Duration{0, idle - 1}, true, false, time.Second + idle - 1 + idle, FailTimeout},
		{"body within the idle timeout", time.Second, []time.Duration{idle - 1, idle - 1, idle - 1}, false, false, time.Second + 3*(idle-1), ""},
		{"dribbled past the response timeout", 0, nil, false, true, total, FailTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
					ctx := r.Context()
					if tt.headersAt < 0 {
						<-ctx.Done()
						return nil, context.Cause(ctx)
					}
					select {
					case <-time.After(tt.headersAt):
					case <-ctx.Done():
						return nil, context.Cause(ctx)
					}
					pr, pw := io.Pipe()
					go func() {
						<-ctx.Done()
						pw.CloseWithError(context.Cause(ctx))
					}()
					go func() {
						// The answer in len(gaps) pieces (one more, never
						// sent, when the engine stalls); dribbled: spaces.
						n := len(tt.gaps)
						if tt.stall {
							n++
						}
						for i := 0; tt.dribble || i < len(tt.gaps); i++ {
							g, piece := idle-1, " "
							if !tt.dribble {
								g, piece = tt.gaps[i], answer[i*len(answer)/n:(i+1)*len(answer)/n]
							}
							select {
							case <-time.After(g):
							case <-ctx.Done():
								return
							}
							if _, err := io.WriteString(pw, piece); err != nil {
								return
							}
						}
						if !tt.stall {
							pw.Close()
						}
					}()
					return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
						Body: pr, ContentLength: -1, Request: r}, nil
				})}
				p := New(Options{FirstByteTimeout: firstByte, IdleTimeout: idle, ResponseTimeout: total, Client: client})
				start := time.Now()
				resp, err := p.Fetch(context.Background(), Attempt{URL: "http://engine/v1/completions", Body: []byte(`{}`)})
				if got := time.Since(start); got != tt.wantAfter {
					t.Fatalf("Fetch returned after %v, want %v (err %v)", got, tt.wantAfter, err)
				}
				if ReasonOf(err) != tt.wantErr {
					t.Fatalf("Fetch = %v, %v; want reason %q", resp, err, tt.wantErr)
				}
				if tt.wantErr != "" && !IsRetryable(err) {
					t.Fatalf("a timeout is not retryable: %v", err)
				}
				if tt.wantErr == "" && (resp.Status != 200 || string(resp.Body) != answer) {
					t.Fatalf("Fetch = %d %q", resp.Status, resp.Body)
				}
				synctest.Wait()
			})
		})
	}
}

// TestStreamIdleTimeoutEndsWithErrorEvent: an engine that sends one event
// and stalls ends the client's stream with the upstream_failed event after
// IdleTimeout, also when ClientWriteTimeout is as long (the gateway's
// setting), which used to spend the last write's deadline first and lose
// the event: the stream then ended as if it were complete.
func TestStreamIdleTimeoutEndsWithErrorEvent(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeSSE(w, ev1)
		<-r.Context().Done()
	}))
	defer engine.Close()
	const idle = 200 * time.Millisecond
	p := New(Options{IdleTimeout: idle, ClientWriteTimeout: idle})
	defer p.Close()
	body, res := streamThrough(t, p, engine.URL)
	if !strings.HasPrefix(body, ev1) || !strings.Contains(body, sseErrLine) ||
		!strings.Contains(body, `"upstream_failed"`) || strings.Contains(body, "[DONE]") {
		t.Fatalf("client got %q, want the event, then the upstream_failed event and no [DONE]", body)
	}
	if !res.Committed || res.ClientGone || ReasonOf(res.Err) != FailTimeout {
		t.Fatalf("Result = %+v, want a committed timeout with the client still there", res)
	}
}

// TestStreamGarbage: a line that is not SSE is never relayed. Before the
// first event it is a retryable failure with nothing written; after it the
// events before the garbage are relayed and the stream ends with the
// upstream_failed event.
func TestStreamGarbage(t *testing.T) {
	tests := []struct {
		name      string
		events    []string
		committed bool
		want      string // what the client gets before the error event
	}{
		{"HTML instead of events", []string{"<html><body>502 Bad Gateway</body></html>\n\n"}, false, ""},
		{"a bare word before the first event", []string{"hello\n" + ev1, done}, false, ""},
		{"garbage after an event", []string{ev1, "\x00\x01garbage\n\n", done}, true, ev1},
		{"garbage inside an event", []string{ev1, "data: {}\nnot a field\n\n", done}, true, ev1},
		{"garbage in the same read", []string{ev1 + "}}{{\n\n" + ev2, done}, true, ev1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := upstream(t, func(w http.ResponseWriter, r *http.Request) { writeSSE(w, tt.events...) })
			p := newProxy(t, Options{})
			cw := newClientWriter()
			res := p.Stream(context.Background(), Attempt{URL: srv.URL, Body: []byte(`{}`)}, cw, nil)
			if res.Committed != tt.committed || ReasonOf(res.Err) != FailBadAnswer || res.Done {
				t.Fatalf("Result = %+v", res)
			}
			_, got := cw.got()
			if !tt.committed {
				if got != "" || !IsRetryable(res.Err) {
					t.Fatalf("client got %q, retryable %v", got, IsRetryable(res.Err))
				}
				return
			}
			rest, ok := strings.CutPrefix(got, tt.want)
			if !ok || !strings.HasPrefix(rest, sseErrLine) || !strings.Contains(rest, "bad_answer") || strings.Count(rest, "\n\n") != 1 {
				t.Fatalf("client got %q, want %q then one error event", got, tt.want)
			}
		})
	}
}

// TestStreamTruncatedByContentLength: an SSE stream that announces more
// bytes than it sends ends, after its events, with the upstream_failed
// event, never with a clean end.
func TestStreamTruncatedByContentLength(t *testing.T) {
	srv := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", "100000")
		_, _ = io.WriteString(w, ev1)
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	})
	p := newProxy(t, Options{})
	cw := newClientWriter()
	res := p.Stream(context.Background(), Attempt{URL: srv.URL, Body: []byte(`{}`)}, cw, nil)
	if !res.Committed || res.Done || ReasonOf(res.Err) != FailEOF {
		t.Fatalf("Result = %+v", res)
	}
	if _, got := cw.got(); !strings.HasPrefix(got, ev1) || !strings.Contains(got[len(ev1):], sseErrLine) {
		t.Fatalf("client got %q, want the event and the error event", got)
	}
}
