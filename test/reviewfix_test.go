package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tlgate/tlgate/internal/adapter/config"
)

// TestCascadeBlameOnlySameStep: a cascade's first step answers an engine
// error and the next, larger step answers the request. With ejection at
// its strictest (one failure ejects), the first step's worker is neither
// ejected nor suspect: a larger model answering what a smaller one could
// not says nothing against the smaller one's worker. A worker of the same
// step that answers after the engine error does show the first one failed.
func TestCascadeBlameOnlySameStep(t *testing.T) {
	c := newCluster(t, cascadeRoutes, []clusterOpt{keys(), drillGateway(func(g *config.Gateway) {
		g.Ejection.ConsecutiveFailures, g.Ejection.MaxPercent = 1, 100
	})})
	var smallCalls atomic.Int64
	c.addFake("small-1", "small", func(w http.ResponseWriter, r *http.Request) {
		smallCalls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":{"message":"logprobs are not supported by this model","type":"server_error","code":500}}`)
	})
	f := &cascadeFakes{}
	c.addFake("large-1", "large", f.large)

	for i := range 3 {
		r := c.post("/v1/chat/completions", "key-debug", chatMsg("I am sure", nil))
		if r.status != http.StatusOK || completionText(t, r.body) != "large answer" || r.header.Get("X-TL-Cascade-Step") != "1" {
			t.Fatalf("request %d: %d %s (step %q), want the large answer from step 1", i, r.status, r.body, r.header.Get("X-TL-Cascade-Step"))
		}
	}
	if smallCalls.Load() != 3 {
		t.Fatalf("the small worker was asked %d times, want 3 (it must stay routable)", smallCalls.Load())
	}
	w, _ := c.drillWorker("small-1")
	if !w.Routable || !w.EjectedUntil.IsZero() || w.ConsecutiveFailures != 0 || w.Ejections != 0 {
		t.Fatalf("small-1 after answering engine errors a larger step answered: routable %v, ejected until %v, %d failures, %d ejections",
			w.Routable, w.EjectedUntil, w.ConsecutiveFailures, w.Ejections)
	}
}

// TestPinnedRelaysEngineError: a Responses follow-up pinned to the worker
// that stores its response, whose engine answers an OpenAI-shaped 5xx
// error, gets that error (its status and message), not the gateway's
// generic 502: no other worker could have been asked, and the engine's
// words say what went wrong.
func TestPinnedRelaysEngineError(t *testing.T) {
	c := newCluster(t, "", []clusterOpt{keys()})
	var calls atomic.Int64
	c.addFake("r1", "m", func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var req map[string]any
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		if req["previous_response_id"] != nil {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":{"message":"the stored conversation exceeds the context window","type":"server_error","code":"context_length_exceeded"}}`)
			return
		}
		fmt.Fprint(w, `{"id":"resp_stored1","object":"response","created_at":1,"status":"completed","model":"m","output":[],"usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}`)
	})
	r := c.post("/v1/responses", "key-debug", map[string]any{"model": "m", "input": "hello", "store": true})
	if r.status != http.StatusOK {
		t.Fatalf("stored response: %d %s", r.status, r.body)
	}
	r = c.post("/v1/responses", "key-debug", map[string]any{"model": "m", "input": "and then?", "previous_response_id": "resp_stored1"})
	if r.status != http.StatusInternalServerError || !strings.Contains(string(r.body), "exceeds the context window") ||
		errorCode(t, r.body) != "context_length_exceeded" {
		t.Fatalf("pinned follow-up with an engine error: %d %s, want the engine's 500 with its message and code", r.status, r.body)
	}
	if calls.Load() != 2 {
		t.Fatalf("the engine was called %d times, want 2", calls.Load())
	}
}
