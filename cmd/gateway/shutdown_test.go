package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
)

// slowStreamVLLM is fakeVLLM whose streamed completions send one chunk,
// then wait for release before the last chunk and [DONE]; other
// completions answer at once.
func slowStreamVLLM(t *testing.T, model string, release <-chan struct{}) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=%q} 0.0\n", model)
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":"vllm"}]}`, model)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(b), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"cmpl-1","object":"text_completion","model":%q,"choices":[{"index":0,"text":"now","logprobs":null,"finish_reason":"stop"}]}`, model)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := func(text string) {
			fmt.Fprintf(w, "data: {\"id\":\"cmpl-2\",\"object\":\"text_completion\",\"model\":%q,\"choices\":[{\"index\":0,\"text\":%q,\"finish_reason\":null}]}\n\n", model, text)
			w.(http.Flusher).Flush()
		}
		chunk("first ")
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		chunk("last")
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv
}

// TestShutdownDelayKeepsServing: on SIGTERM (run's context ending) /readyz
// answers 503 at once while new requests are still served for
// shutdown_delay; then the gateway stops accepting, and a stream in flight
// all along still ends with [DONE] before run returns.
func TestShutdownDelayKeepsServing(t *testing.T) {
	release := make(chan struct{})
	eng := slowStreamVLLM(t, "m", release)
	// The delay is long enough for the checks made during it on a loaded
	// machine; the test waits for the gateway's own log lines, not for
	// the clock.
	path, head, write := configFile(t, "shutdown_timeout = \"30s\"\n")
	head = strings.Replace(head, `shutdown_delay = "0s"`, `shutdown_delay = "8s"`, 1)
	write(head + engineTOML("e1", eng.Listener.Addr().String(), "m"))
	r := startRun(t, "-config", path)
	listen := r.await(r.stderr, regexp.MustCompile(`"listen":"(127\.0\.0\.1:\d+)"[^\n]*"message":"gateway started"`))
	base := "http://" + listen
	r.waitWorkers(base, "e1")
	if a := r.get(base + "/readyz"); a.status != http.StatusOK {
		t.Fatalf("/readyz before the signal: %d %s", a.status, a.body)
	}

	// A stream in flight across the whole shutdown.
	streamClient := &http.Client{Transport: &http.Transport{}}
	defer streamClient.CloseIdleConnections()
	resp, err := streamClient.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.Contains(first, "first ") {
		t.Fatalf("stream's first line %q: %v", first, err)
	}

	r.cancel() // SIGTERM
	r.await(r.stderr, regexp.MustCompile(`"message":"(shutting down): /readyz answers 503`))
	delayOver := regexp.MustCompile(`"message":"shutdown delay over`)

	a := r.get(base + "/readyz")
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, "shutting down") {
		t.Fatalf("/readyz once shutting down: %d %q, want 503", a.status, a.body)
	}
	for i := range 3 { // new requests, on new connections, are still served
		a, err := r.do(http.MethodPost, base+"/v1/completions", `{"model":"m","prompt":"hi"}`)
		if err != nil || a.status != http.StatusOK || !strings.Contains(a.body, `"now"`) {
			t.Fatalf("request %d during shutdown_delay: %v %d %s", i, err, a.status, a.body)
		}
	}
	if delayOver.MatchString(r.stderr.String()) {
		t.Fatal("the machine is too slow for this test: shutdown_delay ended before the checks made during it")
	}

	// Then: no longer accepting, while the stream is still open.
	r.await(r.stderr, delayOver)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the gateway still accepts connections 10s after shutdown_delay")
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-r.done:
		r.done <- err
		t.Fatalf("run returned (%v) with a stream in flight", err)
	default:
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("rest of the stream: %v", err)
	}
	if _, err := sseText(first + string(rest)); err != nil {
		t.Fatalf("the in-flight stream: %v", err)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("run returned %v", err)
	}
}
