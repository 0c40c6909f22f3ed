package gateway

import (
	"testing"

	"github.com/tlgate/tlgate/actors/request"
)

func TestTrafficCode(t *testing.T) {
	tests := []struct {
		name string
		o    request.Outcome
		want string
	}{
		{"ok", request.Outcome{Status: 200}, ""},
		{"ok stream", request.Outcome{Status: 200, Streamed: true, Log: request.Log{Committed: true, Done: true}}, ""},
		{"code", request.Outcome{Status: 503, Code: "no_capacity"}, "no_capacity"},
		{"client gone", request.Outcome{Status: 200, Log: request.Log{ClientGone: true}}, "client_gone"},
		{"499", request.Outcome{Status: 499, Code: "x"}, "client_gone"},
		{"cut stream", request.Outcome{Status: 200, Streamed: true, Log: request.Log{Committed: true}}, "upstream_failed"},
		{"bare status", request.Outcome{Status: 502}, "http_502"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := trafficCode(tc.o); got != tc.want {
				t.Fatalf("trafficCode = %q, want %q", got, tc.want)
			}
		})
	}
}
