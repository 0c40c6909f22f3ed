package tlbench

import (
	"strings"
	"testing"
	"time"
)

// TestPriorityRun runs the priority experiment's smallest configuration:
// one run of each mode, a row each, no request of the interactive tenant
// failing for want of a gateway.
func TestPriorityRun(t *testing.T) {
	c := smallest("")
	c.Timeout = 3 * time.Minute
	c.Only = []string{ExpPriority}
	c.PriorityDuration, c.PriorityWarmup, c.PriorityRepeats = 1500*time.Millisecond, 500*time.Millisecond, 1
	c.PriorityBatchBytes, c.PriorityBatchTokens, c.PriorityKVBlocks = 400, 4, 256
	c.OpenMaxTokens, c.OpenDecode, c.PriorityChatTokens = 4, time.Millisecond, 4
	var out, log strings.Builder
	if err := Run(t.Context(), c, &out, &log); err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	rows := tableRows(t, out.String(), "Priorities and TTFT objectives at 120% load")
	n := 0
	for _, mode := range PriorityModes {
		for k := range rows {
			if strings.HasPrefix(k, mode+" ") {
				n++
			}
		}
	}
	if n != len(PriorityModes) {
		t.Errorf("%d rows, want one per mode:\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), "With priorities on, the interactive tenant met its objective") {
		t.Errorf("no verdict:\n%s", out.String())
	}
}

// TestPriorityTOML: what each mode configures.
func TestPriorityTOML(t *testing.T) {
	c := Preset(false)
	for mode, want := range map[string][]string{
		PriorityOff:      {"enabled = false"},
		PriorityFair:     {"enabled = true", `limit_scope = "worker"`},
		PriorityPriority: {`limit_scope = "pool"`, "priority = 10\nttft_objective_ms = 500\n", "priority = -1\n"},
	} {
		got := priorityTOML(c, mode)
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", mode, got, w)
			}
		}
		if mode != PriorityPriority && strings.Contains(got, "priority =") {
			t.Errorf("%s sets a priority: %q", mode, got)
		}
	}
}

// TestKeyLimitsRun runs the key limits experiment shortened: both rows,
// and the fleet's verdict.
func TestKeyLimitsRun(t *testing.T) {
	c := smallest("")
	c.Timeout = 3 * time.Minute
	c.Only = []string{ExpKeyLimits}
	c.KeyLimitDuration = 2 * time.Second
	var out, log strings.Builder
	if err := Run(t.Context(), c, &out, &log); err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	md := out.String()
	rows := tableRows(t, md, "Fleet-wide key limits")
	for _, mode := range []string{"fleet", "replica"} {
		n := 0
		for k := range rows {
			if strings.HasPrefix(k, mode+" ") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d rows of %s, want one:\n%s", n, mode, md)
		}
	}
	if !strings.Contains(md, `With key_limits = "fleet" the three replicas granted`) {
		t.Errorf("no verdict:\n%s", md)
	}
}
