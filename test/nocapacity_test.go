package test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

// accessLines returns the access log lines ("message":"request") of logs
// whose client_request_id (the client's X-Request-Id) is id.
func accessLines(t *testing.T, logs *syncBuffer, id string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		var v map[string]any
		if json.Unmarshal([]byte(l), &v) != nil || v["message"] != "request" || v["client_request_id"] != id {
			continue
		}
		out = append(out, v)
	}
	return out
}

// TestCascadeSkipsStepWithoutWorkers: a cascade whose first step has no
// routable worker is answered by its next step, not refused no_capacity;
// the access log and the trace say the step was skipped and why.
func TestCascadeSkipsStepWithoutWorkers(t *testing.T) {
	p, exp := memTracing(t, "tlgate")
	logs := &syncBuffer{}
	c := newClusterGateway(t, cascadeRoutes, []clusterOpt{keys()}, func(d *request.Deps) { d.Tracer = p.Tracer() },
		func(o *gateway.Options) { o.Logger = zerolog.New(logs) })
	f := &cascadeFakes{}
	c.addFake("large-1", "large", f.large) // no worker of "small"

	r := c.post("/v1/chat/completions", "key-debug", chatMsg("I am sure", nil), "X-Request-Id", "skip-1")
	if r.status != http.StatusOK {
		t.Fatalf("cascade with an empty first step: %d %s", r.status, r.body)
	}
	if text := completionText(t, r.body); text != "large answer" || r.header.Get("X-TL-Cascade-Step") != "1" {
		t.Fatalf("answer %q from step %q, want the large one from step 1", text, r.header.Get("X-TL-Cascade-Step"))
	}
	if f.largeCalls.Load() != 1 {
		t.Fatalf("large called %d times, want 1", f.largeCalls.Load())
	}

	var lines []map[string]any
	eventually(t, 5*eventuallyUnit, func() bool { lines = accessLines(t, logs, "skip-1"); return len(lines) == 1 }, "the access log line")
	skipped, _ := lines[0]["cascade_skipped"].([]any)
	if len(skipped) != 1 || !strings.Contains(skipped[0].(string), "step 0 (small): ") ||
		!strings.Contains(skipped[0].(string), "no worker of small is registered") {
		t.Fatalf("access log cascade_skipped %v, want step 0 (small) with its reason; line %v", lines[0]["cascade_skipped"], lines[0])
	}
	if lines[0]["cascade_step"] != float64(1) {
		t.Fatalf("access log cascade_step %v, want 1", lines[0]["cascade_step"])
	}

	spans := waitSpans(t, exp, func(s spanSet) bool { return len(s.named(request.SpanCascadeStep)) >= 2 }, "two cascade step spans")
	var sawSkip bool
	for _, sp := range spans.named(request.SpanCascadeStep) {
		if attr(sp, string(request.AttrOutcome)) == request.OutcomeSkipped {
			sawSkip = true
			if attr(sp, string(request.AttrStep)) != "0" || !strings.Contains(attr(sp, string(request.AttrSkipped)), "small") {
				t.Fatalf("skipped step span: %v", sp.Attributes)
			}
		}
	}
	if !sawSkip {
		t.Fatalf("no cascade step span with outcome %q: %v", request.OutcomeSkipped, spans.names())
	}

	// A step that has workers again is asked again.
	c.addFake("small-1", "small", f.small)
	r = c.post("/v1/chat/completions", "key-debug", chatMsg("I am sure", nil))
	if text := completionText(t, r.body); r.status != http.StatusOK || text != "small answer" || r.header.Get("X-TL-Cascade-Step") != "0" {
		t.Fatalf("with a small worker: %d %q step %q", r.status, text, r.header.Get("X-TL-Cascade-Step"))
	}
}

// TestNoCapacitySaysWhy: a disaggregated route with only a unified
// worker of its model is answered 503 no_capacity saying what it needs and
// what there is, in the message and the access log, with Retry-After.
func TestNoCapacitySaysWhy(t *testing.T) {
	logs := &syncBuffer{}
	c := newClusterGateway(t, pdRoutes, nil, nil, func(o *gateway.Options) { o.Logger = zerolog.New(logs) },
		enginesim.Config{ID: "u1", Model: "big"})
	const why = "route big-pd needs prefill and decode workers of big; 1 unified worker is routable"

	r := c.post("/v1/completions", "", map[string]any{"model": "big-pd", "prompt": "hello", "max_tokens": 2}, "X-Request-Id", "nocap-1")
	if r.status != http.StatusServiceUnavailable || errorCode(t, r.body) != "no_capacity" {
		t.Fatalf("%d %s, want 503 no_capacity", r.status, r.body)
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || !strings.Contains(e.Error.Message, why) {
		t.Fatalf("message %q does not say %q (%v)", e.Error.Message, why, err)
	}
	if ra := r.header.Get("Retry-After"); ra != "1" {
		t.Fatalf("Retry-After %q, want 1 (the heartbeat interval rounded up)", ra)
	}
	var lines []map[string]any
	eventually(t, 5*eventuallyUnit, func() bool { lines = accessLines(t, logs, "nocap-1"); return len(lines) == 1 }, "the access log line")
	if lines[0]["no_capacity"] != why || lines[0]["code"] != "no_capacity" {
		t.Fatalf("access log no_capacity %q code %v, want %q", lines[0]["no_capacity"], lines[0]["code"], why)
	}

	// A route whose model's only worker is gone says so.
	c.engines["u1"].Kill()
	eventually(t, 10*eventuallyUnit, func() bool {
		r = c.post("/v1/completions", "", map[string]any{"model": "big-pd", "prompt": "hello", "max_tokens": 2})
		return r.status == http.StatusServiceUnavailable && strings.Contains(string(r.body), "route big-pd needs prefill and decode workers of big; no worker of big is registered")
	}, "no_capacity once the worker is evicted, saying none is registered (last: %d %s)", r.status, r.body)
}
