package main

import (
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
	"github.com/tlgate/tlgate/internal/tool/bench/tlbench"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"-quick", "-only", "scale, routing", "-workers", "2,8", "-streams", "10", "-requests", "5",
		"-workloads", "distinct", "-out", "x", "-rate", "50", "-timeout", "30s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Only, []string{tlbench.ExpScale, tlbench.ExpRouting}) || !slices.Equal(c.Workers, []int{2, 8}) || !slices.Equal(c.Streams, []int{10}) ||
		c.Requests != 5 || !slices.Equal(c.Workloads, []loadgen.Kind{loadgen.Distinct}) || c.Out != "x" || c.Rate != 50 || c.Timeout != 30*time.Second {
		t.Errorf("parsed %+v", c)
	}
	ca, err := parseFlags([]string{"-policies", "cache_aware, least_outstanding", "-sweep", "8,64", "-cache-load-weight", "200"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ca.RoutePolicies, []string{"cache_aware", "least_outstanding"}) || !slices.Equal(ca.SweepPrompts, []int{8, 64}) || ca.CacheLoadWeight != 200 {
		t.Errorf("parsed %+v", ca)
	}
	full, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(full.Only, tlbench.Experiments) || !slices.Equal(full.Workers, []int{4, 64, 1024}) || !slices.Equal(full.Streams, []int{1000, 10000}) {
		t.Errorf("defaults %+v", full)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-only", "speed"}, `-only: unknown experiment "speed"`},
		{[]string{"-workers", "4,x"}, `-workers: not a positive integer: "x"`},
		{[]string{"-streams", "0"}, `-streams: not a positive integer: "0"`},
		{[]string{"-requests", "-1"}, "-requests: must be positive, got -1"},
		{[]string{"-workloads", "burst"}, `-workloads: unknown workload "burst"`},
		{[]string{"-rate", "-5"}, "-timeout and -rate must not be negative"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
		{[]string{"-policies", "least_outstanding,magic"}, `-policies: unknown policy "magic"`},
		{[]string{"-sweep", "4,0"}, `-sweep: not a positive integer: "0"`},
		{[]string{"-cache-load-weight", "-1"}, "-cache-load-weight: must not be negative, got -1"},
	} {
		if _, err := parseFlags(tc.args, io.Discard); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
	if _, err := parseFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}
