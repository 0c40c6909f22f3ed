package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/enginesim/kvevents"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func noEnv(string) string { return "" }

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want func(*enginesim.Config)
	}{
		{"defaults", nil, nil, func(c *enginesim.Config) {}},
		{"everything", []string{
			"-id", "d-1", "-model", "big", "-role", "decode", "-http", "127.0.0.1:0", "-grpc", "127.0.0.1:1",
			"-kv", "127.0.0.1:2", "-control", "127.0.0.1:3", "-advertise-host", "10.0.0.1", "-kv-blocks", "64", "-kv-format", "2",
			"-prefill-per-token", "1ms", "-decode-per-token", "20ms", "-max-running", "8", "-weights-seed", "99",
			"-confidence", "0.9", "-gateway", "a:1,b:2", "-gateway", "c:3", "-heartbeat-interval", "500ms",
			"-registry-token", "tok", "-hold-timeout", "5s", "-shutdown-timeout", "1s", "-max-body-bytes", "1000",
			"-fault-refuse", "-fault-unavailable", "-fault-die-after", "3", "-fault-stall-ms", "100", "-fault-no-heartbeat",
			"-kv-events", "tcp://127.0.0.1:5557", "-kv-events-connect", "-kv-events-replay", "tcp://127.0.0.1:5558",
			"-kv-events-topic", "kv", "-kv-events-encoding", "array", "-kv-events-hash", "bytes", "-kv-events-buffer-steps", "10",
			"-hash-seed", "42", "-remote-decode-timeout", "9s", "-room-timeout", "8s", "-fault-refuse-pull", "-fault-unreachable-prefill",
			"-fault-kv-events-drop", "-fault-kv-events-delay-ms", "5", "-fault-kv-events-refuse-replay",
		}, nil, func(c *enginesim.Config) {
			c.RemoteDecodeTimeout, c.RoomTimeout = 9*time.Second, 8*time.Second
			c.KVEvents = kvevents.Config{Endpoint: "tcp://127.0.0.1:5557", Connect: true, ReplayEndpoint: "tcp://127.0.0.1:5558",
				Topic: "kv", Encoder: kvevents.Encoder{Encoding: kvevents.EncodingArray, Hashes: kvevents.HashBytes}, BufferSteps: 10}
			c.HashSeed = "42"
			c.ID, c.Model, c.Role = "d-1", "big", "decode"
			c.HTTPAddr, c.GRPCAddr, c.KVAddr, c.ControlAddr, c.AdvertiseHost = "127.0.0.1:0", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "10.0.0.1"
			c.KVBlocks, c.KVFormat = 64, 2
			c.PrefillPerToken, c.DecodePerToken, c.MaxRunning = time.Millisecond, 20*time.Millisecond, 8
			c.WeightsSeed, c.Confidence = 99, 0.9
			c.Gateways, c.HeartbeatInterval, c.RegistryToken = []string{"a:1", "b:2", "c:3"}, 500*time.Millisecond, "tok"
			c.HoldTimeout, c.ShutdownTimeout, c.MaxBodyBytes = 5*time.Second, time.Second, 1000
			c.Step = nil // the per-token times select the flat mode
			c.Faults = enginesim.Faults{Refuse: true, Unavailable: true, Die: true, DieAfterTokens: 3, StallMS: 100, NoHeartbeat: true,
				RefusePull: true, UnreachablePrefill: true, KVEventsDrop: true, KVEventsDelayMS: 5, KVEventsRefuseReplay: true}
		}},
		{"token from the environment", nil, map[string]string{tokenEnv: "from-env"}, func(c *enginesim.Config) { c.RegistryToken = "from-env" }},
		{"die before the first byte", []string{"-fault-die-after", "0"}, nil, func(c *enginesim.Config) { c.Faults.Die = true }},
		{"flat, zero cost", []string{"-timing", "flat"}, nil, func(c *enginesim.Config) { c.Step, c.KVBlocks, c.MaxRunning = nil, 0, 0 }},
		{"step overrides", []string{"-preset", "llama-3.1-70b-fp8-h100", "-max-num-batched-tokens", "512", "-step-fixed", "1ms",
			"-step-per-prefill-token", "2us", "-step-per-decode-seq", "3us", "-step-per-context-token", "4ns", "-kv-blocks", "100",
			"-api-per-request", "0", "-api-per-output-token", "5us"}, nil,
			func(c *enginesim.Config) {
				c.KVBlocks = 100
				c.Step = &enginesim.StepConfig{MaxNumBatchedTokens: 512, Cost: enginesim.StepCost{
					Fixed: time.Millisecond, PerPrefillToken: 2 * time.Microsecond, PerDecodeSeq: 3 * time.Microsecond, PerContextToken: 4},
					APIServer: enginesim.APIServerCost{PerOutputToken: 5 * time.Microsecond}}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			got, _, err := parseFlags(tt.args, &bytes.Buffer{}, getenv)
			if err != nil {
				t.Fatalf("parseFlags: %v", err)
			}
			want := enginesim.Config{
				Model: "sim", Role: "unified", HTTPAddr: "127.0.0.1:8000", GRPCAddr: "127.0.0.1:0", KVAddr: "127.0.0.1:0",
				AdvertiseHost: "127.0.0.1", KVBlocks: enginesim.PresetLlama8BH100.KVBlocks, KVFormat: 1, MaxRunning: 256, Confidence: 0.5,
				Step:              &enginesim.PresetLlama8BH100.Step,
				HeartbeatInterval: 2 * time.Second, HoldTimeout: time.Minute, ShutdownTimeout: 10 * time.Second,
				MaxBodyBytes: 4 << 20, HashSeed: enginesim.DefaultHashSeed,
				RemoteDecodeTimeout: enginesim.DefaultRemoteDecodeTimeout, RoomTimeout: enginesim.DefaultRoomTimeout,
				KVEvents: kvevents.Config{BufferSteps: kvevents.DefaultBufferSteps},
			}
			tt.want(&want)
			got.Logger = want.Logger // loggers do not compare; the log flags are tested below
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("config\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

func TestParseFlagsOTLP(t *testing.T) {
	_, tc, err := parseFlags([]string{"-otlp-endpoint", "http://127.0.0.1:4318", "-otlp-protocol", "http", "-otlp-sample-ratio", "0.5"}, &bytes.Buffer{}, noEnv)
	if err != nil || tc.Endpoint != "http://127.0.0.1:4318" || tc.Protocol != "http" || tc.SampleRatio != 0.5 || tc.ServiceName != "enginesim" {
		t.Fatalf("parseFlags: %+v, %v", tc, err)
	}
	if _, tc, _ := parseFlags(nil, &bytes.Buffer{}, noEnv); tc.Endpoint != "" {
		t.Fatalf("tracing on by default: %+v", tc)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-confidence", "0"}, {"-confidence", "2"}, {"-heartbeat-interval", "soon"},
		{"-log-level", "loud"}, {"-log-format", "xml"}, {"extra"}, {"-nope"},
		{"-otlp-endpoint", "127.0.0.1:4317"}, {"-otlp-endpoint", "http://h:4317", "-otlp-protocol", "thrift"},
		{"-otlp-endpoint", "http://h:4317", "-otlp-sample-ratio", "2"},
		{"-kv-events-encoding", "json"},
		{"-timing", "slow"},
		{"-preset", "gpt-5"},
		{"-timing", "flat", "-preset", "llama-3.1-8b-h100"},
		{"-timing", "step", "-decode-per-token", "1ms"},
		{"-step-fixed", "-2ms"},
		{"-api-per-output-token", "-1ms"},
		{"-timing", "flat", "-api-per-request", "1ms"},
		{"-kv-events-hash", "hex"},
	} {
		if _, _, err := parseFlags(args, &bytes.Buffer{}, noEnv); err == nil {
			t.Errorf("parseFlags(%q) succeeded", args)
		}
	}
	var out bytes.Buffer
	if _, _, err := parseFlags([]string{"-h"}, &out, noEnv); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, f := range []string{"-id", "-model", "-role", "-http", "-grpc", "-kv", "-kv-blocks", "-kv-format",
		"-prefill-per-token", "-decode-per-token", "-max-running", "-weights-seed", "-confidence", "-gateway",
		"-heartbeat-interval", "-registry-token", "-hold-timeout", "-fault-refuse", "-fault-unavailable",
		"-fault-die-after", "-fault-stall-ms", "-fault-no-heartbeat", "-kv-events", "-kv-events-connect",
		"-kv-events-replay", "-kv-events-topic", "-kv-events-encoding", "-kv-events-hash", "-kv-events-buffer-steps",
		"-hash-seed", "-timing", "-preset", "-max-num-batched-tokens", "-step-fixed", "-step-per-prefill-token",
		"-step-per-decode-seq", "-step-per-context-token", "-api-per-request", "-api-per-output-token", "-remote-decode-timeout", "-bootstrap", "-room-timeout",
		"-fault-refuse-pull", "-fault-unreachable-prefill", "-fault-kv-events-drop", "-fault-kv-events-delay-ms",
		"-fault-kv-events-refuse-replay"} {
		if !strings.Contains(out.String(), "  "+f+" ") && !strings.Contains(out.String(), "  "+f+"\n") {
			t.Errorf("-h does not document %s", f)
		}
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	cfg, _, err := parseFlags([]string{"-http", "127.0.0.1:0", "-model", "m", "-log-level", "error"}, &bytes.Buffer{}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan *enginesim.Engine, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, ready) }()
	e := <-ready
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(e.URL() + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

func TestRunFailsToListen(t *testing.T) {
	cfg, _, err := parseFlags([]string{"-http", "127.0.0.1:-1", "-log-level", "error"}, &bytes.Buffer{}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), cfg, nil); err == nil {
		t.Fatal("run with a bad address succeeded")
	}
}
