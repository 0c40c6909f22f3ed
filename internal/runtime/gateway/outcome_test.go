package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// TestAccessLogOutcome: the access log line says how a request ended, not
// only its status: a stream that an engine cut (the client got the
// upstream_failed event) and one whose client stopped reading were both
// answered 200.
func TestAccessLogOutcome(t *testing.T) {
	streamed := func(l request.Log) request.Outcome {
		return request.Outcome{Status: 200, Streamed: true, Log: l}
	}
	cases := []struct {
		name    string
		o       request.Outcome
		outcome string
		level   string
		extra   map[string]any
	}{
		{"stream done", streamed(request.Log{Committed: true, Done: true, Attempts: 1}), "ok", "info", nil},
		{"stream cut by an idle engine", streamed(request.Log{Committed: true, Attempts: 1, StreamFailure: "timeout",
			LastError: "proxy: engine timed out"}), "upstream_failed", "warn",
			map[string]any{"stream_failure": "timeout", "last_error": "proxy: engine timed out"}},
		{"client stopped reading", streamed(request.Log{Committed: true, ClientGone: true, Attempts: 1,
			LastError: "proxy: write to client failed: i/o timeout"}), "client_gone", "info",
			map[string]any{"last_error": "proxy: write to client failed: i/o timeout"}},
		{"non-streamed 200", request.Outcome{Status: 200, Log: request.Log{Committed: true}}, "ok", "info", nil},
		{"engines all failed", request.Outcome{Status: 502, Code: openai.CodeUpstreamFailed,
			Log: request.Log{Attempts: 2, Failures: []string{"status_5xx", "bad_answer"}, LastError: "500 boom"}}, "upstream_failed", "warn",
			map[string]any{"code": "upstream_failed", "last_error": "500 boom"}},
		{"client gave up before an answer", request.Outcome{Status: 499, Code: "client_closed"}, "client_gone", "info", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			ex := request.NewExchange(context.Background(), httptest.NewRecorder(), openai.Request{Model: "smol", Stream: tc.o.Streamed}, "/v1/completions", "r1")
			accessLog(zerolog.New(&buf), ex, tc.o)
			var line map[string]any
			if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
				t.Fatalf("log line %q: %v", buf.String(), err)
			}
			if line["outcome"] != tc.outcome || line["level"] != tc.level || line["status"] != float64(tc.o.Status) {
				t.Fatalf("log line %s, want outcome %s at %s", buf.String(), tc.outcome, tc.level)
			}
			for k, v := range tc.extra {
				if line[k] != v {
					t.Errorf("log %s = %v, want %v", k, line[k], v)
				}
			}
			if bytes.Count(buf.Bytes(), []byte(`"last_error"`)) > 1 {
				t.Errorf("last_error twice: %s", buf.String())
			}
		})
	}
}

// TestObjectiveResult: how a request with a TTFT objective is counted.
func TestObjectiveResult(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		o    request.Outcome
		want string
	}{
		{"no objective", request.Outcome{Status: 200, Log: request.Log{TTFT: ms}}, ""},
		{"met", request.Outcome{Status: 200, Log: request.Log{Objective: 500 * ms, TTFT: 300 * ms}}, metrics.ObjectiveMet},
		{"missed", request.Outcome{Status: 200, Log: request.Log{Objective: 500 * ms, TTFT: 700 * ms}}, metrics.ObjectiveMissed},
		{"refused early", request.Outcome{Status: 429, Code: openai.CodeObjectiveUnreachable, Log: request.Log{Objective: 500 * ms}}, metrics.ObjectiveRefused},
		{"shed", request.Outcome{Status: 429, Code: openai.CodeSaturated, Log: request.Log{Objective: 500 * ms}}, metrics.ObjectiveRefused},
		{"client gone", request.Outcome{Status: 499, Log: request.Log{Objective: 500 * ms, ClientGone: true}}, ""},
		{"engine failed", request.Outcome{Status: 502, Code: openai.CodeUpstreamFailed, Log: request.Log{Objective: 500 * ms}}, ""},
	} {
		if got := objectiveResult(tc.o); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
