package test

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/tracing"
)

// otlpSpan is one decoded span with the service that exported it.
type otlpSpan struct {
	service, name              string
	trace, id, parent          string
	kind                       tracev1.Span_SpanKind
	attrs                      map[string]string
	statusCode                 tracev1.Status_StatusCode
	startUnixNano, endUnixNano uint64
}

// receiver is an OTLP trace receiver: the collector's TraceService over
// gRPC, and POST /v1/traces over HTTP (protobuf).
type receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []otlpSpan
}

func (r *receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.add(req)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, hr *http.Request) {
	b, err := io.ReadAll(hr.Body)
	req := &collectortrace.ExportTraceServiceRequest{}
	if err != nil || hr.URL.Path != "/v1/traces" || hr.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(b, req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	r.add(req)
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *receiver) add(req *collectortrace.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				attrs := map[string]string{}
				for _, kv := range sp.GetAttributes() {
					v := kv.GetValue()
					switch {
					case v.GetStringValue() != "":
						attrs[kv.GetKey()] = v.GetStringValue()
					default:
						attrs[kv.GetKey()] = strings.TrimSpace(strings.TrimPrefix(v.String(), "int_value:"))
					}
				}
				r.spans = append(r.spans, otlpSpan{
					service: service, name: sp.GetName(), kind: sp.GetKind(), attrs: attrs,
					trace: hex.EncodeToString(sp.GetTraceId()), id: hex.EncodeToString(sp.GetSpanId()),
					parent: hex.EncodeToString(sp.GetParentSpanId()), statusCode: sp.GetStatus().GetCode(),
					startUnixNano: sp.GetStartTimeUnixNano(), endUnixNano: sp.GetEndTimeUnixNano(),
				})
			}
		}
	}
}

func (r *receiver) snapshot() []otlpSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]otlpSpan(nil), r.spans...)
}

// startReceiver serves rcv over protocol on loopback and returns the
// endpoint URL to give the exporters.
func startReceiver(t *testing.T, rcv *receiver, protocol string) string {
	t.Helper()
	if protocol == tracing.ProtocolHTTP {
		srv := httptest.NewServer(rcv)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, rcv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return "http://" + lis.Addr().String()
}

// TestTraceExportedOverOTLP: a gateway configured by [gateway.tracing] and
// a reference engine given the same endpoint export their spans to a real
// OTLP receiver in the test process, over gRPC and over HTTP; the decoded
// protobuf spans form one tree: the gateway's request span at the root,
// its route and attempt spans under it, the engine's span under the
// attempt.
func TestTraceExportedOverOTLP(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20") // export batches every 20 ms
	for _, protocol := range []string{tracing.ProtocolGRPC, tracing.ProtocolHTTP} {
		t.Run(protocol, func(t *testing.T) {
			rcv := &receiver{}
			endpoint := startReceiver(t, rcv, protocol)
			ep, err := tracing.New(context.Background(), tracing.Config{Endpoint: endpoint, Protocol: protocol, SampleRatio: 1, ServiceName: "enginesim"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := ep.Shutdown(ctx); err != nil {
					t.Errorf("engine tracing shutdown: %v", err)
				}
			})
			c := newCluster(t, "", []clusterOpt{func(cfg *config.Config) {
				cfg.Gateway.Tracing = config.Tracing{Endpoint: endpoint, Protocol: protocol, SampleRatio: 1, ServiceName: "tlgate-test"}
			}}, enginesim.Config{ID: "e1", Model: "m", Tracer: ep.TracerProvider()})
			r := c.post("/v1/chat/completions", "", map[string]any{"model": "m", "stream": true, "max_tokens": 4,
				"messages": []map[string]string{{"role": "user", "content": "hello"}}})
			if r.status != http.StatusOK || !strings.Contains(string(r.body), "[DONE]") {
				t.Fatalf("%d %s", r.status, r.body)
			}
			var spans []otlpSpan
			find := func(service, name string) []otlpSpan {
				var out []otlpSpan
				for _, s := range spans {
					if s.service == service && s.name == name {
						out = append(out, s)
					}
				}
				return out
			}
			eventually(t, 10*eventuallyUnit, func() bool {
				spans = rcv.snapshot()
				return len(find("tlgate-test", "chat m")) == 1 && len(find("tlgate-test", request.SpanAttempt)) == 1 &&
					len(find("tlgate-test", request.SpanRoute)) == 1 && len(find("enginesim", "enginesim.chat")) == 1
			}, "the gateway's and the engine's spans at the receiver")
			root, route, att, eng := find("tlgate-test", "chat m")[0], find("tlgate-test", request.SpanRoute)[0],
				find("tlgate-test", request.SpanAttempt)[0], find("enginesim", "enginesim.chat")[0]
			if root.parent != "" || root.kind != tracev1.Span_SPAN_KIND_SERVER || len(root.trace) != 32 {
				t.Fatalf("request span: parent %q kind %v trace %q, want a server root", root.parent, root.kind, root.trace)
			}
			if root.attrs["gen_ai.operation.name"] != "chat" || root.attrs["gen_ai.request.model"] != "m" || root.attrs["http.response.status_code"] != "200" ||
				root.attrs["gen_ai.usage.output_tokens"] != "4" || root.attrs["gen_ai.usage.input_tokens"] == "" {
				t.Errorf("request span attributes: %v", root.attrs)
			}
			for _, s := range []otlpSpan{route, att, eng} {
				if s.trace != root.trace {
					t.Errorf("%s/%s in trace %s, want %s", s.service, s.name, s.trace, root.trace)
				}
			}
			if route.parent != root.id || att.parent != root.id {
				t.Errorf("route parent %s, attempt parent %s, want the request span %s", route.parent, att.parent, root.id)
			}
			if eng.parent != att.id || eng.kind != tracev1.Span_SPAN_KIND_SERVER || eng.attrs["tlgate.worker"] != "e1" {
				t.Errorf("engine span: parent %s (want the attempt %s), kind %v, attrs %v", eng.parent, att.id, eng.kind, eng.attrs)
			}
			if att.attrs["tlgate.worker"] != "e1" || att.attrs["tlgate.outcome"] != "ok" || att.attrs["tlgate.ttfb_ms"] == "" {
				t.Errorf("attempt span attributes: %v", att.attrs)
			}
			if !(root.startUnixNano <= att.startUnixNano && att.startUnixNano <= eng.startUnixNano && eng.endUnixNano <= root.endUnixNano+uint64(time.Second)) {
				t.Errorf("times out of order: request %d–%d, attempt %d, engine %d–%d", root.startUnixNano, root.endUnixNano, att.startUnixNano, eng.startUnixNano, eng.endUnixNano)
			}
		})
	}
}
