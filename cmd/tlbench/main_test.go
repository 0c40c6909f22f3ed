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
		"-workloads", "distinct", "-out", "x", "-rate", "50", "-timeout", "30s", "-overhead-rounds", "9"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Only, []string{tlbench.ExpScale, tlbench.ExpRouting}) || !slices.Equal(c.Workers, []int{2, 8}) || !slices.Equal(c.Streams, []int{10}) ||
		c.Requests != 5 || !slices.Equal(c.Workloads, []loadgen.Kind{loadgen.Distinct}) || c.Out != "x" || c.Rate != 50 || c.Timeout != 30*time.Second || c.Rounds != 9 {
		t.Errorf("parsed %+v", c)
	}
	ca, err := parseFlags([]string{"-policies", "cache_aware, least_outstanding", "-sweep", "8,64", "-cache-load-weight", "200",
		"-turn-system-bytes", "1024", "-turn-user-bytes", "384", "-answer-bytes", "1536"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ca.RoutePolicies, []string{"cache_aware", "least_outstanding"}) || !slices.Equal(ca.SweepPrompts, []int{8, 64}) || ca.CacheLoadWeight != 200 ||
		ca.TurnSystemBytes != 1024 || ca.TurnUserBytes != 384 || ca.AnswerBytes != 1536 {
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
		{[]string{"-answer-bytes", "-1"}, "-answer-bytes: must be positive, got -1"},
		{[]string{"-workloads", "burst"}, `-workloads: unknown workload "burst"`},
		{[]string{"-rate", "-5"}, "-timeout and -rate must not be negative"},
		{[]string{"-overhead-rounds", "-1"}, "-overhead-rounds: must not be negative, got -1"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
		{[]string{"-policies", "least_outstanding,magic"}, `-policies: "magic" is not least_outstanding, `},
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

func TestParseOpenLoopFlags(t *testing.T) {
	c, err := parseFlags([]string{"-only", "openloop", "-open-rates", "50,90", "-open-replicas", "1,3", "-open-sync", "off",
		"-open-repeats", "2", "-open-duration", "10s", "-open-workloads", "rag", "-open-one-entry", "-open-sync-batch", "1ms",
		"-open-policies", "least_outstanding", "-open-release-hold", "0s", "-share-peers-silent", "-share-profile", "-number-share", "0.2", "-kv-index-agreement", "0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Only, []string{tlbench.ExpOpenLoop}) || !slices.Equal(c.OpenFractions, []float64{0.5, 0.9}) || !slices.Equal(c.OpenReplicas, []int{1, 3}) ||
		!slices.Equal(c.OpenSync, []bool{false}) || c.OpenRepeats != 2 || c.OpenDuration != 10*time.Second ||
		!slices.Equal(c.OpenWorkloads, []loadgen.Kind{loadgen.RAG}) || c.Timeout != 4*time.Hour || !c.OpenOneEntry || c.OpenSyncBatch != time.Millisecond ||
		!slices.Equal(c.OpenPolicies, []string{"least_outstanding"}) || c.OpenReleaseHold == nil || *c.OpenReleaseHold != 0 || !c.SharePeersSilent || !c.ShareProfile || c.NumberShare != 0.2 || c.KVIndexAgreement == nil || *c.KVIndexAgreement != 0 {
		t.Errorf("parsed %+v", c)
	}
	full, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(full.Only, tlbench.ExpOpenLoop) || !slices.Equal(full.OpenSync, []bool{false, true}) || full.Timeout != 15*time.Minute || full.OpenOneEntry || full.OpenReleaseHold != nil || full.SharePeersSilent || full.ShareProfile || full.NumberShare != 0 || full.KVIndexAgreement != nil {
		t.Errorf("defaults: only %v, sync %v, timeout %v", full.Only, full.OpenSync, full.Timeout)
	}
	if q, err := parseFlags([]string{"-quick", "-only", "openloop"}, io.Discard); err != nil || q.Timeout != 10*time.Minute {
		t.Errorf("-quick openloop: timeout %v, %v", q.Timeout, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-open-rates", "50,x"}, `-open-rates: not a positive integer: "x"`},
		{[]string{"-open-replicas", "0"}, `-open-replicas: not a positive integer: "0"`},
		{[]string{"-open-sync", "off,maybe"}, `-open-sync: "maybe" is not off or on`},
		{[]string{"-open-workloads", "shared"}, `-open-workloads: "shared" is not multi-turn or rag`},
		{[]string{"-open-policies", "cache_aware,random"}, `-open-policies: "random" is not least_outstanding or cache_aware`},
		{[]string{"-open-repeats", "-1"}, "-open-repeats: must not be negative, got -1"},
		{[]string{"-open-duration", "-1s"}, "-open-duration: must not be negative, got -1s"},
		{[]string{"-open-duration", "2s"}, "-open-duration: 2s is not longer than the warmup of 2s"},
		{[]string{"-open-release-hold", "-1ms"}, `-open-release-hold: want a duration of 0 or more, got "-1ms"`},
		{[]string{"-open-release-hold", "soon"}, `-open-release-hold: want a duration of 0 or more, got "soon"`},
		{[]string{"-kv-index-agreement", "1.5"}, `-kv-index-agreement: want a share in [0, 1], got "1.5"`},
		{[]string{"-number-share", "1"}, "-number-share: must be in [0, 1), got 1"},
		{[]string{"-number-share", "-0.5"}, "-number-share: must be in [0, 1), got -0.5"},
	} {
		if _, err := parseFlags(tc.args, io.Discard); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestParsePDFlags(t *testing.T) {
	c, err := parseFlags([]string{"-only", "pd", "-pd-rates", "10,22.5", "-pd-repeats", "2", "-pd-duration", "30s", "-pd-splits", "3",
		"-pd-protocols", "sglang"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Only, []string{tlbench.ExpPD}) || !slices.Equal(c.PDRates, []float64{10, 22.5}) || c.PDRepeats != 2 || c.PDDuration != 30*time.Second ||
		!slices.Equal(c.PDSplits, []int{3}) || !slices.Equal(c.PDProtocols, []string{"sglang"}) || c.Timeout != 45*time.Minute {
		t.Errorf("parsed %+v", c)
	}
	q, err := parseFlags([]string{"-quick", "-only", "pd"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if q.PDRepeats != 1 || !slices.Equal(q.PDSplits, []int{2}) || q.Timeout != 10*time.Minute {
		t.Errorf("quick %+v", q)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-pd-rates", "10,0"}, `-pd-rates: not a positive rate: "0"`},
		{[]string{"-pd-splits", "4"}, "-pd-splits: 4 prefill engines of 4 leave none to decode"},
		{[]string{"-pd-protocols", "trtllm"}, `-pd-protocols: "trtllm" is not vllm or sglang`},
		{[]string{"-pd-repeats", "-1"}, "-pd-repeats: must not be negative"},
		{[]string{"-pd-duration", "2s"}, "-pd-duration: 2s is not longer than the warmup of 3s"},
	} {
		if _, err := parseFlags(tc.args, io.Discard); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestParseEnginePreset(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    string // Config.EnginePreset
		wantErr string
	}{
		{nil, "", ""},
		{[]string{"-engine-preset", ""}, "", ""},
		{[]string{"-only", "routing", "-engine-preset", "llama-3.1-8b-h100"}, "llama-3.1-8b-h100", ""},
		{[]string{"-engine-preset", "llama-3.1-70b-fp8-h100", "-quick"}, "llama-3.1-70b-fp8-h100", ""},
		{[]string{"-engine-preset", "llama-3.1-8b"}, "", `-engine-preset: unknown engine preset "llama-3.1-8b" (want llama-3.1-70b-fp8-h100, llama-3.1-8b-h100, or none for the flat timing model)`},
	} {
		c, err := parseFlags(tc.args, io.Discard)
		switch {
		case tc.wantErr != "":
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("parseFlags(%q) = %v, want %q", tc.args, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("parseFlags(%q): %v", tc.args, err)
		case c.EnginePreset != tc.want:
			t.Errorf("parseFlags(%q): engine preset %q, want %q", tc.args, c.EnginePreset, tc.want)
		}
	}
}
