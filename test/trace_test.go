package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/tracing"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
	"github.com/tlgate/tlgate/internal/testkit/syncbuf"
)

// memTracing is a recording provider whose spans land in an in-memory
// exporter the moment they end.
func memTracing(t testing.TB, service string) (*tracing.Provider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	p := tracing.WithExporter(exp, tracing.Config{SampleRatio: 1, ServiceName: service}, sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p, exp
}

// withTracer makes the request actors record spans on p.
func withTracer(p *tracing.Provider) func(*request.Deps) {
	return func(d *request.Deps) { d.Tracer = p.Tracer() }
}

// spanSet indexes exported spans.
type spanSet []tracetest.SpanStub

func (s spanSet) named(name string) spanSet {
	var out spanSet
	for _, sp := range s {
		if sp.Name == name {
			out = append(out, sp)
		}
	}
	return out
}

func (s spanSet) byID(id trace.SpanID) (tracetest.SpanStub, bool) {
	for _, sp := range s {
		if sp.SpanContext.SpanID() == id {
			return sp, true
		}
	}
	return tracetest.SpanStub{}, false
}

func (s spanSet) names() []string {
	out := make([]string, len(s))
	for i, sp := range s {
		out[i] = sp.Name
	}
	return out
}

// attr returns a span attribute's value as a string ("" when absent).
func attr(sp tracetest.SpanStub, key string) string {
	for _, kv := range sp.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// waitSpans polls exp until cond holds on its spans (bounded: 5 s).
func waitSpans(t *testing.T, exp *tracetest.InMemoryExporter, cond func(spanSet) bool, what string) spanSet {
	t.Helper()
	var got spanSet
	eventually(t, 5*eventuallyUnit, func() bool { got = spanSet(exp.GetSpans()); return cond(got) }, "%s", what)
	return got
}

// TestTraceSpansOfFailover: a request that fails over once (a refuses
// connections, b answers) shows one request span, a route span per
// decision, two attempt spans (the first with its failure reason), all in
// one trace under the request span.
func TestTraceSpansOfFailover(t *testing.T) {
	p, exp := memTracing(t, "tlgate")
	c := newClusterDeps(t, "", nil, withTracer(p), enginesim.Config{ID: "a", Model: "m"}, enginesim.Config{ID: "b", Model: "m"})
	if err := c.engines["a"].SetFaults(enginesim.Faults{Refuse: true}); err != nil {
		t.Fatal(err)
	}
	r := c.post("/v1/completions", "", map[string]any{"model": "m", "prompt": "hello", "max_tokens": 4})
	if r.status != http.StatusOK {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	spans := spanSet(exp.GetSpans())
	reqs := spans.named("text_completion m")
	if len(reqs) != 1 {
		t.Fatalf("%d request spans, want 1: %v", len(reqs), spans.names())
	}
	root := reqs[0]
	if root.SpanKind != trace.SpanKindServer || root.Parent.IsValid() {
		t.Fatalf("request span kind %v parent %v: want a server root span", root.SpanKind, root.Parent)
	}
	for k, want := range map[string]string{
		"http.response.status_code": "200", "tlgate.committed": "true", "tlgate.route": "m",
		"gen_ai.request.model": "m", "gen_ai.response.model": "m", "tlgate.attempts": "2", "tlgate.worker": "b",
		"gen_ai.usage.input_tokens": "3", "tlgate.failures": `["refused"]`,
	} {
		if got := attr(root, k); got != want {
			t.Errorf("request span %s = %q, want %q", k, got, want)
		}
	}
	if attr(root, "gen_ai.usage.output_tokens") == "" {
		t.Error("request span has no gen_ai.usage.output_tokens")
	}
	routes, attempts := spans.named(request.SpanRoute), spans.named(request.SpanAttempt)
	if len(routes) != 2 || len(attempts) != 2 {
		t.Fatalf("%d route and %d attempt spans, want 2 and 2: %v", len(routes), len(attempts), spans.names())
	}
	for i, want := range []struct{ worker, outcome, reason string }{{"a", "failed", "refused"}, {"b", "ok", ""}} {
		rt, at := routes[i], attempts[i]
		if attr(rt, "tlgate.worker") != want.worker || attr(rt, "tlgate.route.policy") != "cache_aware" ||
			attr(rt, "tlgate.route.reason") != "load" || attr(rt, "tlgate.route.candidates") != fmt.Sprint(2-i) {
			t.Errorf("route span %d: %v", i, rt.Attributes)
		}
		if attr(at, "tlgate.worker") != want.worker || attr(at, "tlgate.outcome") != want.outcome || attr(at, "tlgate.failure_reason") != want.reason {
			t.Errorf("attempt span %d: worker %q outcome %q reason %q, want %+v", i, attr(at, "tlgate.worker"), attr(at, "tlgate.outcome"), attr(at, "tlgate.failure_reason"), want)
		}
	}
	if attr(attempts[1], "http.response.status_code") != "200" {
		t.Errorf("second attempt: %v", attempts[1].Attributes)
	}
	for _, sp := range append(routes, attempts...) {
		if sp.SpanContext.TraceID() != root.SpanContext.TraceID() || sp.Parent.SpanID() != root.SpanContext.SpanID() {
			t.Errorf("span %s (trace %s, parent %s) is not a child of the request span %s/%s",
				sp.Name, sp.SpanContext.TraceID(), sp.Parent.SpanID(), root.SpanContext.TraceID(), root.SpanContext.SpanID())
		}
	}
	if len(spans) != 5 {
		t.Errorf("%d spans, want 5: %v", len(spans), spans.names())
	}
}

// TestTraceDisaggregated: a disaggregated request whose first decode
// worker dies before the first byte. The gateway's tokenize, prefill,
// decode and Release spans share the request's trace; the engines' own
// spans are children of the gateway's calls, so traceparent reached them:
// in Prefill's and Release's gRPC metadata, on tokenize's and decode's
// HTTP headers (and in the KV push between the engines).
func TestTraceDisaggregated(t *testing.T) {
	p, exp := memTracing(t, "tlgate")
	ep, eexp := memTracing(t, "enginesim")
	engines := []enginesim.Config{
		{ID: "p", Model: "big", Role: enginesim.RolePrefill, Confidence: 0.9, Tracer: ep.TracerProvider()},
		{ID: "d1", Model: "big", Role: enginesim.RoleDecode, Confidence: 0.9, Tracer: ep.TracerProvider()},
		{ID: "d2", Model: "big", Role: enginesim.RoleDecode, Confidence: 0.9, Tracer: ep.TracerProvider()},
	}
	c := newClusterDeps(t, pdRoutes, nil, withTracer(p), engines...)
	if err := c.engines["d1"].SetFaults(enginesim.Faults{Die: true, DieAfterTokens: 0}); err != nil {
		t.Fatal(err)
	}
	r := c.post("/v1/completions", "", map[string]any{"model": "big-pd", "prompt": "Once upon a time", "max_tokens": 8, "seed": 3, "stream": true})
	if r.status != 200 || !strings.Contains(string(r.body), "data: [DONE]") {
		t.Fatalf("%d %s", r.status, r.body)
	}
	spans := waitSpans(t, exp, func(s spanSet) bool { return len(s.named(request.SpanRelease)) == 1 }, "the Release span")
	root := spans.named("text_completion big-pd")
	if len(root) != 1 {
		t.Fatalf("request spans %d: %v", len(root), spans.names())
	}
	tid := root[0].SpanContext.TraceID()
	want := map[string]int{request.SpanRoute: 2, request.SpanAttempt: 2, request.SpanTokenize: 1, request.SpanPrefill: 2, request.SpanDecode: 2, request.SpanRelease: 1}
	for name, n := range want {
		if got := len(spans.named(name)); got != n {
			t.Errorf("%d %s spans, want %d", got, name, n)
		}
	}
	for _, sp := range spans {
		if sp.SpanContext.TraceID() != tid {
			t.Errorf("span %s in trace %s, want %s", sp.Name, sp.SpanContext.TraceID(), tid)
		}
	}
	att := spans.named(request.SpanAttempt)
	if attr(att[0], "tlgate.worker") != "d1" || attr(att[0], "tlgate.outcome") != "failed" || attr(att[1], "tlgate.worker") != "d2" || attr(att[1], "tlgate.outcome") != "ok" {
		t.Errorf("attempts: %v / %v", att[0].Attributes, att[1].Attributes)
	}
	pre, dec, rel := spans.named(request.SpanPrefill), spans.named(request.SpanDecode), spans.named(request.SpanRelease)[0]
	h1 := attr(pre[0], "tlgate.kv.handle")
	if h1 == "" || attr(dec[0], "tlgate.kv.handle") != h1 || attr(rel, "tlgate.kv.handle") != h1 {
		t.Errorf("KV handle: prefill %q, decode %q, release %q", h1, attr(dec[0], "tlgate.kv.handle"), attr(rel, "tlgate.kv.handle"))
	}
	if attr(pre[0], "gen_ai.usage.input_tokens") == "" || attr(pre[0], "tlgate.kv.target") != c.engines["d1"].KVAddr() {
		t.Errorf("prefill span: %v", pre[0].Attributes)
	}
	for _, sp := range append(append(spans.named(request.SpanTokenize), pre...), dec...) {
		if parent, ok := spans.byID(sp.Parent.SpanID()); !ok || parent.Name != request.SpanAttempt {
			t.Errorf("%s span's parent is %q, want an attempt span", sp.Name, parent.Name)
		}
	}
	// The engines' side: each gateway call has an engine span as child.
	calls := map[string]string{
		request.SpanTokenize: "enginesim.tokenize",
		request.SpanPrefill:  "enginesim /tl.engine.v1.EngineControl/Prefill",
		request.SpanDecode:   "enginesim.completions",
		request.SpanRelease:  "enginesim /tl.kv.v1.KvTransferService/Release",
	}
	espans := waitSpans(t, eexp, func(s spanSet) bool {
		for _, name := range calls {
			if len(s.named(name)) == 0 {
				return false
			}
		}
		return len(s.named("enginesim.completions")) == 2
	}, "the engines' spans")
	for gw, eng := range calls {
		for _, es := range espans.named(eng) {
			parent, ok := spans.byID(es.Parent.SpanID())
			if !ok || parent.Name != gw || es.SpanContext.TraceID() != tid {
				t.Errorf("engine span %s: parent %q in trace %s, want a child of %s in %s", eng, parent.Name, es.SpanContext.TraceID(), gw, tid)
			}
		}
	}
	for _, push := range espans.named("enginesim /tl.kv.v1.KvTransferService/Push") {
		if parent, ok := espans.byID(push.Parent.SpanID()); !ok || parent.Name != "enginesim.kv_push" {
			t.Errorf("KV Push span's parent %q, want enginesim.kv_push", parent.Name)
		}
	}
}

// syncBuffer is a log sink the gateway's goroutines share with the test.
type syncBuffer = syncbuf.Buffer

// newTracedCluster is a cluster whose gateway gets o (tracing, logger,
// metrics registry) as given.
func newTracedCluster(t *testing.T, o gateway.Options) *cluster {
	t.Helper()
	cfg, err := config.Parse([]byte(`
[gateway]
listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
first_byte_timeout = "5s"
idle_timeout = "5s"
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Gateway.StateDir = t.TempDir()
	gw, err := gateway.Start(context.Background(), cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, gw: gw, url: "http://" + gw.HTTPAddr(), engines: map[string]*enginesim.Engine{}, hooks: &hookLog{}}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := gw.Close(ctx); err != nil {
			t.Errorf("gateway close: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	return c
}

// TestTraceContinuesClientTrace: a client's traceparent and tracestate
// make the request span a child of the client's span, reach the engine
// (with the attempt span as parent), and the trace id shows in the access
// log and as an exemplar on /metrics (OpenMetrics). A client trace that is
// not sampled records nothing but is still propagated; without a
// traceparent the gateway starts a trace of its own.
func TestTraceContinuesClientTrace(t *testing.T) {
	p, exp := memTracing(t, "tlgate")
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	c := newTracedCluster(t, gateway.Options{Logger: zerolog.New(logs), Registry: reg, Gatherer: reg, Tracing: p})
	type seen struct{ traceparent, tracestate string }
	got := make(chan seen, 4)
	c.addFake("f", "m", func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Header.Get("Traceparent"), r.Header.Get("Tracestate")}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"text_completion","model":"m","choices":[{"index":0,"text":"hi","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	})
	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	body := map[string]any{"model": "m", "prompt": "hello", "max_tokens": 2}
	r := c.post("/v1/completions", "", body, "Traceparent", "00-"+clientTrace+"-"+clientSpan+"-01", "Tracestate", "vendor=abc")
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	engine := <-got
	spans := spanSet(exp.GetSpans())
	root := spans.named("text_completion m")
	if len(root) != 1 {
		t.Fatalf("request spans: %v", spans.names())
	}
	rs := root[0]
	if rs.SpanContext.TraceID().String() != clientTrace || rs.Parent.SpanID().String() != clientSpan || !rs.Parent.IsRemote() {
		t.Fatalf("request span trace %s parent %s (remote %v), want the client's %s/%s", rs.SpanContext.TraceID(), rs.Parent.SpanID(), rs.Parent.IsRemote(), clientTrace, clientSpan)
	}
	if attr(rs, "gen_ai.usage.input_tokens") != "3" || attr(rs, "gen_ai.usage.output_tokens") != "1" {
		t.Errorf("usage attributes: %v", rs.Attributes)
	}
	att := spans.named(request.SpanAttempt)
	if len(att) != 1 {
		t.Fatalf("attempt spans: %v", spans.names())
	}
	wantTP := "00-" + clientTrace + "-" + att[0].SpanContext.SpanID().String() + "-01"
	if engine.traceparent != wantTP || engine.tracestate != "vendor=abc" {
		t.Fatalf("engine got traceparent %q tracestate %q, want %q and vendor=abc", engine.traceparent, engine.tracestate, wantTP)
	}
	if !strings.Contains(logs.String(), `"trace_id":"`+clientTrace+`"`) {
		t.Errorf("access log has no trace_id %s:\n%s", clientTrace, logs.String())
	}
	req, _ := http.NewRequest(http.MethodGet, c.url+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	m := c.do(req)
	if !strings.Contains(string(m.body), `trace_id="`+clientTrace+`"`) {
		t.Errorf("no exemplar with the trace id on /metrics:\n%s", m.body)
	}

	// Not sampled by the client: no span, but the context still travels.
	exp.Reset()
	const unsampled = "0af7651916cd43dd8448eb211c80319c"
	if r := c.post("/v1/completions", "", body, "Traceparent", "00-"+unsampled+"-b7ad6b7169203331-00"); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	engine = <-got
	if n := len(exp.GetSpans()); n != 0 {
		t.Errorf("%d spans recorded for an unsampled trace", n)
	}
	if !strings.HasPrefix(engine.traceparent, "00-"+unsampled+"-") || !strings.HasSuffix(engine.traceparent, "-00") {
		t.Errorf("unsampled trace reached the engine as %q", engine.traceparent)
	}

	// No traceparent: a new trace, rooted at the gateway.
	if r := c.post("/v1/completions", "", body); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	engine = <-got
	root = spanSet(exp.GetSpans()).named("text_completion m")
	if len(root) != 1 || root[0].Parent.IsValid() {
		t.Fatalf("without traceparent: request spans %v", root)
	}
	if tid := root[0].SpanContext.TraceID().String(); tid == clientTrace || !strings.Contains(engine.traceparent, tid) {
		t.Fatalf("new trace %s, engine got %q", tid, engine.traceparent)
	}
}

// TestTraceCascadeSteps: a cascade whose small step is unsure shows two
// cascade step spans: the first with its accept_if, the statistic measured
// and "escalated", the last "final"; each holds its attempt.
func TestTraceCascadeSteps(t *testing.T) {
	p, exp := memTracing(t, "tlgate")
	c := newClusterDeps(t, cascadeRoutes, nil, withTracer(p))
	f := &cascadeFakes{}
	c.addFake("small-1", "small", f.small)
	c.addFake("large-1", "large", f.large)
	if r := c.post("/v1/chat/completions", "", chatMsg("unsure", nil)); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	spans := spanSet(exp.GetSpans())
	steps := spans.named(request.SpanCascadeStep)
	if len(steps) != 2 {
		t.Fatalf("%d cascade step spans: %v", len(steps), spans.names())
	}
	for i, want := range []map[string]string{
		{"tlgate.cascade.step": "0", "tlgate.cascade.accept_if": "mean_logprob > -1.2", "tlgate.cascade.statistic": "mean_logprob",
			"tlgate.cascade.value": "-2.75", "tlgate.outcome": "escalated"},
		{"tlgate.cascade.step": "1", "tlgate.outcome": "final"},
	} {
		for k, v := range want {
			if got := attr(steps[i], k); got != v {
				t.Errorf("step %d: %s = %q, want %q", i, k, got, v)
			}
		}
	}
	for _, at := range spans.named(request.SpanAttempt) {
		if parent, ok := spans.byID(at.Parent.SpanID()); !ok || parent.Name != request.SpanCascadeStep {
			t.Errorf("attempt span's parent %q, want a cascade step", parent.Name)
		}
	}
	if root := spans.named("chat auto"); len(root) != 1 || attr(root[0], "tlgate.escalations") != "1" || attr(root[0], "gen_ai.response.model") != "large" {
		t.Errorf("request span: %v", root)
	}
}
