package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

const (
	ev1  = "data: {\"choices\":[{\"delta\":{\"content\":\"The\"}}]}\n\n"
	ev2  = "data: {\"choices\":[{\"delta\":{\"content\":\" cat\"}}]}\n\n"
	done = "data: [DONE]\n\n"
)

var sseErrLine = string(openai.SSEError(openai.CodeUpstreamFailed, "x"))[:len("data: {\"error\":")]

func TestStreamRelaysEvents(t *testing.T) {
	body := `{"model":"smol-v3","stream":true}`
	var gotBody, gotReqID, gotAccept string
	srv := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotBody, gotReqID, gotAccept = string(b), r.Header.Get("X-Request-Id"), r.Header.Get("Accept")
		w.Header().Set("X-Engine", "e1")
		// One event split across two writes, and two events in one write.
		writeSSE(w, ev1[:10], ev1[10:], ev2+": keep-alive\n\n", done)
	})
	p := newProxy(t, Options{})
	cw := newClientWriter()
	var commits int
	res := p.Stream(context.Background(), Attempt{
		URL: srv.URL + "/v1/chat/completions", Body: []byte(body),
		Header: http.Header{"X-Request-Id": {"req-1"}},
	}, cw, func(status int, h http.Header) {
		commits++
		if status != 200 || h.Get("X-Engine") != "e1" {
			t.Errorf("commit(%d, %v)", status, h)
		}
		if cw.body.Len() != 0 || cw.status != 0 {
			t.Error("commit called after a write to the client")
		}
		cw.Header().Set("X-TL-Route", "w1")
	})
	if res.Err != nil || !res.Done || !res.Committed || res.ClientGone || res.Status != 200 {
		t.Fatalf("Result = %+v", res)
	}
	want := ev1 + ev2 + ": keep-alive\n\n" + done
	if status, got := cw.got(); status != 200 || got != want {
		t.Fatalf("client got %d %q, want %q", status, got, want)
	}
	if res.Events != 3 || res.Bytes != int64(len(want)) || commits != 1 || res.FirstByte <= 0 {
		t.Fatalf("Events %d Bytes %d commits %d FirstByte %v", res.Events, res.Bytes, commits, res.FirstByte)
	}
	if cw.header.Get("Content-Type") != "text/event-stream" || cw.header.Get("X-TL-Route") != "w1" ||
		cw.header.Get("Cache-Control") != "no-cache" {
		t.Fatalf("client headers %v", cw.header)
	}
	if cw.flushed == 0 {
		t.Fatal("never flushed")
	}
	if gotBody != body || gotReqID != "req-1" || gotAccept != "text/event-stream" {
		t.Fatalf("upstream got body %q, X-Request-Id %q, Accept %q", gotBody, gotReqID, gotAccept)
	}
}

// TestStreamFlushesEachEvent checks, through a real client, that an event
// reaches the client before the engine sends the next one: the engine waits
// for the client to have read the first event (no buffering of the stream).
func TestStreamFlushesEachEvent(t *testing.T) {
	clientRead := make(chan struct{})
	eng := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		writeSSE(w, ev1)
		select {
		case <-clientRead:
		case <-r.Context().Done():
			return
		}
		writeSSE(w, ev2, done)
	})
	p := newProxy(t, Options{})
	results := make(chan Result, 1)
	gw := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		results <- p.Stream(r.Context(), Attempt{URL: eng.URL, Body: []byte(`{}`)}, w, nil)
	})
	resp, err := http.Post(gw.URL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len(ev1))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != ev1 {
		t.Fatalf("first event %q, %v", first, err)
	}
	close(clientRead)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != ev2+done {
		t.Fatalf("rest %q, %v", rest, err)
	}
	if res := <-results; !res.Done || res.Events != 3 {
		t.Fatalf("Result = %+v", res)
	}
}

func TestStreamUncommittedFailures(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc // nil: nothing listens
		reason  Failure
	}{
		{"refused", nil, FailRefused},
		{"503", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":"draining"}`)
		}, FailStatus503},
		{"reset before first byte", func(w http.ResponseWriter, r *http.Request) { resetConn(t, w) }, FailReset},
		{"timeout before headers", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, FailTimeout},
		{"timeout after headers, no event", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			_ = http.NewResponseController(w).Flush()
			<-r.Context().Done()
		}, FailTimeout},
		{"timeout inside the first event", func(w http.ResponseWriter, r *http.Request) {
			writeSSE(w, ev1[:12])
			<-r.Context().Done()
		}, FailTimeout},
		{"closed inside the first event", func(w http.ResponseWriter, r *http.Request) {
			writeSSE(w, ev1[:12])
		}, FailEOF},
		{"empty 200", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
		}, FailEOF},
		{"keep-alive comments, then dies", func(w http.ResponseWriter, r *http.Request) {
			writeSSE(w, ": keep-alive\n\n", ": keep-alive\n\n")
			panic(http.ErrAbortHandler)
		}, FailEOF},
		{"dies before first event", func(w http.ResponseWriter, r *http.Request) {
			writeSSE(w, "data: {")
			panic(http.ErrAbortHandler)
		}, FailEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := "http://" + closedAddr(t) + "/v1/completions"
			if tt.handler != nil {
				url = upstream(t, tt.handler).URL + "/v1/completions"
			}
			p := newProxy(t, Options{FirstByteTimeout: 50 * time.Millisecond})
			cw := newClientWriter()
			called := false
			res := p.Stream(context.Background(), Attempt{URL: url, Body: []byte(`{}`)}, cw,
				func(int, http.Header) { called = true })
			if res.Committed || called || res.ClientGone || res.Done {
				t.Fatalf("Result = %+v, commit called %v", res, called)
			}
			if !IsRetryable(res.Err) || ReasonOf(res.Err) != tt.reason {
				t.Fatalf("Err = %v (reason %q), want retryable %q", res.Err, ReasonOf(res.Err), tt.reason)
			}
			if status, body := cw.got(); status != 0 || body != "" || len(cw.header) != 0 {
				t.Fatalf("client was touched: %d %q %v", status, body, cw.header)
			}
		})
	}
}

func TestStreamFailsAfterCommit(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		reason  Failure
	}{
		{"dies after one event", func(w http.ResponseWriter, r *http.Request) {
			writeSSE(w, ev1)
			panic(http.ErrAbortHandler)
		}, FailEOF},
		{"dies inside the second event", func(w http.ResponseWriter, r *http.Request) {
			writeSSE(w, ev1, ev2[:15])
			panic(http.ErrAbortHandler)
		}, FailEOF},
		{"ends without [DONE]", func(w http.ResponseWriter, r *http.Request) { writeSSE(w, ev1) }, FailEOF},
		{"idle timeout after commit", func(w http.ResponseWriter, r *http.Request) {
			writeSSE(w, ev1)
			<-r.Context().Done()
		}, FailTimeout},
		{"event over the limit", func(w http.ResponseWriter, r *http.Request) {
			writeSSE(w, ev1, "data: "+strings.Repeat("x", 600))
			<-r.Context().Done()
		}, FailTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := upstream(t, tt.handler)
			p := newProxy(t, Options{IdleTimeout: 50 * time.Millisecond, MaxEventBytes: 512})
			cw := newClientWriter()
			res := p.Stream(context.Background(), Attempt{URL: srv.URL, Body: []byte(`{}`)}, cw, nil)
			if !res.Committed || res.Done || res.ClientGone || res.Events != 1 {
				t.Fatalf("Result = %+v", res)
			}
			if IsRetryable(res.Err) || ReasonOf(res.Err) != tt.reason {
				t.Fatalf("Err = %v (reason %q), want committed %q", res.Err, ReasonOf(res.Err), tt.reason)
			}
			status, got := cw.got()
			if status != 200 || !strings.HasPrefix(got, ev1) {
				t.Fatalf("client got %d %q", status, got)
			}
			tail := got[len(ev1):]
			if !strings.HasPrefix(tail, sseErrLine) || strings.Count(tail, "\n\n") != 1 || !strings.HasSuffix(tail, "\n\n") ||
				!strings.Contains(tail, `"code":"upstream_failed"`) || !strings.Contains(tail, `"type":"server_error"`) {
				t.Fatalf("after the first event the client got %q, want one SSE error event", tail)
			}
			if strings.Contains(got, "[DONE]") {
				t.Fatal("client got [DONE]")
			}
		})
	}
}

func TestStreamClientGone(t *testing.T) {
	tests := []struct {
		name      string
		committed bool
		setup     func(cw *clientWriter, cancel context.CancelFunc, entered <-chan struct{})
	}{
		{"canceled after the first event", true, func(cw *clientWriter, cancel context.CancelFunc, _ <-chan struct{}) {
			cw.afterWrites, cw.onWrite = 1, cancel
		}},
		{"write to the client fails", true, func(cw *clientWriter, _ context.CancelFunc, _ <-chan struct{}) {
			cw.failWrites = true
		}},
		{"canceled before the first byte", false, func(_ *clientWriter, cancel context.CancelFunc, entered <-chan struct{}) {
			go func() { <-entered; cancel() }()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			entered := make(chan struct{})
			upstreamGone := make(chan struct{})
			srv := upstream(t, func(w http.ResponseWriter, r *http.Request) {
				defer close(upstreamGone)
				close(entered)
				if tt.name != "canceled before the first byte" {
					writeSSE(w, ev1)
				}
				<-r.Context().Done()
			})
			p := newProxy(t, Options{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cw := newClientWriter()
			tt.setup(cw, cancel, entered)
			res := p.Stream(ctx, Attempt{URL: srv.URL, Body: []byte(`{}`)}, cw, nil)
			if !res.ClientGone || res.Done || ReasonOf(res.Err) != FailCanceled || IsRetryable(res.Err) {
				t.Fatalf("Result = %+v", res)
			}
			if res.Committed != tt.committed {
				t.Fatalf("Committed = %v, want %v", res.Committed, tt.committed)
			}
			// The engine sees its request end: this blocks until it does.
			<-upstreamGone
			if _, got := cw.got(); strings.Contains(got, "error") {
				t.Fatalf("an error event was written to a gone client: %q", got)
			}
		})
	}
}

// TestStreamUpstreamAnswers: an answer to a streamed request that is not
// an SSE stream never reaches the client as it arrives. An OpenAI-shaped
// 4xx error comes back as Result.Answer (re-encoded in OpenAI's shape) for
// the caller to relay; a 5xx, a 2xx that is not SSE (an engine that ignored
// "stream"; also a truncated one), the engine's own 401 or 403, a redirect
// or an error that is not OpenAI-shaped is a retryable failure before
// commit.
func TestStreamUpstreamAnswers(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		ct       string
		body     string
		cl       int // a Content-Length the body does not meet (0: none)
		reason   Failure
		wantBody string // the relayed Answer's body, when reason is ""
	}{
		{"400 invalid request", 400, "application/json", `{"error":{"message":"bad","type":"invalid_request_error","param":"top_p","code":null}}`, 0, "",
			`{"error":{"message":"bad","type":"invalid_request_error","param":"top_p","code":"invalid_request"}}`},
		{"404 unknown model", 404, "application/json", `{"error":{"message":"no such model","code":"model_not_found","internal":"x"}}`, 0, "",
			`{"error":{"message":"no such model","type":"not_found_error","param":null,"code":"model_not_found"}}`},
		{"400 in vLLM's shape", 400, "application/json", `{"object":"error","message":"too long","type":"BadRequestError","code":400}`, 0, "",
			`{"error":{"message":"too long","type":"invalid_request_error","param":null,"code":"invalid_request"}}`},
		{"500 engine error", 500, "text/plain; charset=utf-8", "boom", 0, FailStatus5xx, ""},
		{"502 OpenAI-shaped", 502, "application/json", `{"error":{"message":"upstream"}}`, 0, FailStatus5xx, ""},
		{"422 empty body", 422, "", "", 0, FailBadAnswer, ""},
		{"401 of the engine", 401, "text/plain", "Unauthorized", 0, FailBadAnswer, ""},
		{"403 OpenAI-shaped of the engine", 403, "application/json", `{"error":{"message":"bad key"}}`, 0, FailBadAnswer, ""},
		{"307 without Location", 307, "", "", 0, FailBadAnswer, ""},
		{"200 JSON instead of a stream", 200, "application/json", `{"choices":[]}`, 0, FailBadAnswer, ""},
		{"200 JSON truncated", 200, "application/json", `{"choices":[{"te`, 100000, FailBadAnswer, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := upstream(t, func(w http.ResponseWriter, r *http.Request) {
				if tt.ct != "" {
					w.Header().Set("Content-Type", tt.ct)
				}
				if tt.cl > 0 {
					w.Header().Set("Content-Length", strconv.Itoa(tt.cl))
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
				if tt.cl > 0 {
					_ = http.NewResponseController(w).Flush()
					panic(http.ErrAbortHandler)
				}
			})
			p := newProxy(t, Options{})
			cw := newClientWriter()
			commits := 0
			res := p.Stream(context.Background(), Attempt{URL: srv.URL, Body: []byte(`{}`)}, cw,
				func(int, http.Header) { commits++ })
			if res.Committed || commits != 0 || res.Status != tt.status {
				t.Fatalf("Result = %+v, %d commits: committed", res, commits)
			}
			if status, got := cw.got(); status != 0 || got != "" {
				t.Fatalf("the client got %d %q", status, got)
			}
			if tt.reason != "" {
				if ReasonOf(res.Err) != tt.reason || !IsRetryable(res.Err) || res.Answer != nil {
					t.Fatalf("Result = %+v, want a retryable %s", res, tt.reason)
				}
				return
			}
			if res.Err != nil || res.Answer == nil || res.Answer.Status != tt.status || string(res.Answer.Body) != tt.wantBody {
				t.Fatalf("Result = %+v, answer %+v, want %d %s", res, res.Answer, tt.status, tt.wantBody)
			}
			if ct := res.Answer.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("answer Content-Type %q", ct)
			}
		})
	}
}

// TestStreamReusesConnection checks that a finished stream hands its
// connection back to the pool: the relay reads past [DONE] to the end.
func TestStreamReusesConnection(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { writeSSE(w, ev1, done) }))
	srv.Listener = countingListener{srv.Listener, &conns}
	srv.Start()
	t.Cleanup(srv.Close)
	p := newProxy(t, Options{})
	for i := range 3 {
		res := p.Stream(context.Background(), Attempt{URL: srv.URL, Body: []byte(`{}`)}, newClientWriter(), nil)
		if !res.Done {
			t.Fatalf("stream %d: %+v", i, res)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 3 streams, want 1", n)
	}
}

func Example() {
	p := New(Options{})
	defer p.Close()
	_ = func(w http.ResponseWriter, r *http.Request) {
		res := p.Stream(r.Context(), Attempt{URL: "http://10.0.0.7:8000/v1/chat/completions", Body: []byte(`{}`)}, w,
			func(int, http.Header) { w.Header().Set("X-Request-Id", "req-1") })
		switch {
		case !res.Committed && IsRetryable(res.Err):
			fmt.Println("exclude the worker and route again")
		case res.Err != nil:
			fmt.Println("committed failure: the client got the SSE error event")
		}
	}
	// Output:
}

// TestStreamErrorEventSequenced: a stream of a Sequenced dialect (the
// Responses API) that fails after commit ends with the dialect's error
// event numbered one past the last event relayed, also when the events
// arrive several to a read; before any numbered event it is numbered 0.
func TestStreamErrorEventSequenced(t *testing.T) {
	d := dialect.New(dialect.Spec{
		EndEvents: []string{"response.completed"},
		ErrorEvent: func(reason string, seq int64) []byte {
			return openai.ResponsesErrorEvent(openai.CodeUpstreamFailed, reason, seq)
		},
		Sequenced: true,
	})
	ev := func(typ string, seq int) string {
		return fmt.Sprintf("event: %s\ndata: {\"type\":%q,\"response\":{\"id\":\"resp_1\"},\"sequence_number\": %d}\n\n", typ, typ, seq)
	}
	for _, tc := range []struct {
		name   string
		events []string
		want   int64
	}{
		{"three events, one a read", []string{ev("response.created", 0), ev("response.in_progress", 1), ev("response.output_text.delta", 2)}, 3},
		{"three events in one read", []string{ev("response.created", 0) + ev("response.in_progress", 1) + ev("response.output_text.delta", 2)}, 3},
		{"an event without a number", []string{"event: response.created\ndata: {\"type\":\"response.created\"}\n\n"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := upstream(t, func(w http.ResponseWriter, r *http.Request) { writeSSE(w, tc.events...) })
			p := newProxy(t, Options{})
			cw := newClientWriter()
			res := p.Stream(context.Background(), Attempt{URL: srv.URL, Body: []byte(`{}`), Dialect: d}, cw, nil)
			if !res.Committed || ReasonOf(res.Err) != FailEOF {
				t.Fatalf("Result = %+v", res)
			}
			_, got := cw.got()
			want := string(openai.ResponsesErrorEvent(openai.CodeUpstreamFailed, string(FailEOF), tc.want))
			if !strings.HasSuffix(got, want) {
				t.Fatalf("the stream ends %q, want %q", got[max(0, len(got)-len(want)):], want)
			}
		})
	}
}

// TestStreamErrorFirst: a 200 stream whose first event is the engine's
// error (vLLM and SGLang report a request's failure so, then [DONE]) is
// not committed: judged as the same error answered whole would be, a 5xx
// is retryable on another worker (with the error to relay should the
// next one fail alike), a 4xx is the answer to relay. An error after the
// first event, or a first event that only mentions "error", is relayed.
func TestStreamErrorFirst(t *testing.T) {
	tests := []struct {
		name     string
		events   string
		reason   Failure // "" with wantBody: the answer; "" without: relayed
		status   int
		wantBody string
	}{
		{"vLLM engine core error", `data: {"error":{"object":"error","message":"EngineCore encountered an issue","type":"InternalServerError","param":null,"code":500}}` + "\n\n" + done,
			FailEngineError, 500, ""},
		{"error without a code", `data: {"error":{"message":"generation failed"}}` + "\n\n" + done, FailEngineError, 500, ""},
		{"503 in the event", `data: {"error":{"message":"overloaded","code":503}}` + "\n\n" + done, FailStatus5xx, 503, ""},
		{"400 in the event", `data: {"error":{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}}` + "\n\n" + done,
			"", 400, `{"error":{"message":"too long","type":"invalid_request_error","param":null,"code":"invalid_request"}}`},
		{"error after the first event", `data: {"choices":[{"index":0,"text":"a"}]}` + "\n\n" + `data: {"error":{"message":"late"}}` + "\n\n" + done, "", 200, ""},
		{"a token that says error", `data: {"choices":[{"index":0,"text":"\"error\""}]}` + "\n\n" + done, "", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := upstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, tt.events)
			})
			cw := newClientWriter()
			res := newProxy(t, Options{}).Stream(context.Background(), Attempt{URL: srv.URL, Body: []byte(`{}`)}, cw, nil)
			if tt.reason == "" && tt.wantBody == "" { // relayed
				if _, got := cw.got(); !res.Committed || !res.Done || got != tt.events {
					t.Fatalf("Result = %+v, client got %q, want the stream relayed", res, got)
				}
				return
			}
			if status, got := cw.got(); res.Committed || status != 0 || got != "" {
				t.Fatalf("Result = %+v, client got %d %q: committed", res, status, got)
			}
			if res.Status != tt.status {
				t.Fatalf("status %d, want %d", res.Status, tt.status)
			}
			if tt.reason != "" {
				if ReasonOf(res.Err) != tt.reason || !IsRetryable(res.Err) || res.Answer != nil {
					t.Fatalf("Result = %+v, want a retryable %s", res, tt.reason)
				}
				if tt.reason == FailEngineError && EngineAnswer(res.Err) == nil {
					t.Fatal("no engine answer to relay")
				}
				return
			}
			if res.Err != nil || res.Answer == nil || res.Answer.Status != tt.status || string(res.Answer.Body) != tt.wantBody {
				t.Fatalf("Result = %+v, answer %+v, want %d %s", res, res.Answer, tt.status, tt.wantBody)
			}
		})
	}
}
