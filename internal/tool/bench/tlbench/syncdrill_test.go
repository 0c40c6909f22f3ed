package tlbench

import (
	"strconv"
	"testing"
	"time"
)

func TestMetricSum(t *testing.T) {
	exp := []byte(`# HELP tlgate_sync_messages_sent_total x
tlgate_sync_messages_sent_total{kind="batch"} 12
tlgate_sync_messages_sent_total{kind="pick"} 30
tlgate_sync_messages_sent_total_other{kind="batch"} 99
tlgate_sync_sent_bytes_total 2048
tlgate_sync_up 1
`)
	for _, tc := range []struct {
		name, filter string
		want         float64
	}{
		{"tlgate_sync_messages_sent_total", `kind="batch"`, 12},
		{"tlgate_sync_messages_sent_total", "", 42},
		{"tlgate_sync_sent_bytes_total", "", 2048},
		{"tlgate_sync_up", "", 1},
		{"tlgate_sync_lag_seconds", "", 0},
	} {
		if got := metricSum(exp, tc.name, tc.filter); got != tc.want {
			t.Errorf("metricSum(%s, %q) = %v, want %v", tc.name, tc.filter, got, tc.want)
		}
	}
}

func TestSyncAgreed(t *testing.T) {
	rep := func(up, loads int) []byte {
		return []byte("tlgate_sync_up " + strconv.Itoa(up) + "\ntlgate_sync_messages_received_total{kind=\"load\"} " + strconv.Itoa(loads) + "\n")
	}
	for _, tc := range []struct {
		name string
		exps [][]byte
		base []float64
		want bool
	}{
		{"none", nil, nil, false},
		{"all up, a report from both peers since", [][]byte{rep(1, 12), rep(1, 7)}, []float64{10, 5}, true},
		{"one still down", [][]byte{rep(1, 12), rep(0, 7)}, []float64{10, 5}, false},
		{"one has heard one peer only", [][]byte{rep(1, 12), rep(1, 6)}, []float64{10, 5}, false},
	} {
		if got := syncAgreed(tc.exps, tc.base, 2); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestPhaseOf(t *testing.T) {
	s := time.Second
	phases := []*drillPhase{{name: "a", from: s, to: 2 * s}, {name: "b", from: 2 * s, to: 3 * s}}
	for _, tc := range []struct {
		at   time.Duration
		want string
	}{
		{0, ""}, {s, "a"}, {2*s - 1, "a"}, {2 * s, "b"}, {3 * s, ""},
	} {
		got := ""
		if p := phaseOf(phases, tc.at); p != nil {
			got = p.name
		}
		if got != tc.want {
			t.Errorf("phaseOf(%v) = %q, want %q", tc.at, got, tc.want)
		}
	}
}
