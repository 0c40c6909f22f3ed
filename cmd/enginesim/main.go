// Command enginesim runs the reference engine (package enginesim): an
// OpenAI-compatible inference engine with a deterministic toy model that
// speaks the tl.control.v1, tl.engine.v1 and tl.kv.v1 contracts, for running,
// testing, demonstrating and benchmarking the gateway without GPUs.
//
//	enginesim -model smol -http 127.0.0.1:8001 -gateway 127.0.0.1:9090
//
// It stops gracefully on SIGINT or SIGTERM. Run enginesim -h for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/enginesim/kvevents"
	"github.com/tlgate/tlgate/internal/adapter/tracing"
)

// tokenEnv is read for the registry token when -registry-token is not given,
// so the token need not appear in the process list.
const tokenEnv = "ENGINESIM_REGISTRY_TOKEN"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, tc, err := parseFlags(os.Args[1:], os.Stderr, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "enginesim:", err)
		os.Exit(2)
	}
	tp, err := tracing.New(ctx, tc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "enginesim:", err)
		os.Exit(2)
	}
	if tp.Enabled() {
		cfg.Tracer = tp.TracerProvider()
	}
	err = run(ctx, cfg, nil)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if serr := tp.Shutdown(sctx); serr != nil {
		cfg.Logger.Warn().Err(serr).Msg("flushing spans")
	}
	cancel()
	if err != nil {
		cfg.Logger.Error().Err(err).Msg("enginesim failed")
		os.Exit(1)
	}
}

// run starts the engine, sends it on ready (if not nil), and closes it
// gracefully when ctx ends.
func run(ctx context.Context, cfg enginesim.Config, ready chan<- *enginesim.Engine) error {
	e, err := enginesim.Start(ctx, cfg)
	if err != nil {
		return err
	}
	if ready != nil {
		ready <- e
	}
	<-ctx.Done()
	return e.Close()
}

// listFlag collects a repeatable, comma-separated flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// parseFlags turns the command line into a Config (with its logger) and
// the configuration of its span exporter (tracing off without
// -otlp-endpoint).
func parseFlags(args []string, stderr io.Writer, getenv func(string) string) (enginesim.Config, tracing.Config, error) {
	var cfg enginesim.Config
	var tc tracing.Config
	fs := flag.NewFlagSet("enginesim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: enginesim [flags]

Runs the tlgate reference engine: OpenAI-compatible HTTP (/v1/completions,
/v1/chat/completions, /tokenize, /detokenize, /v1/models, /health, /metrics,
/reset_prefix_cache, and /sim/faults for fault injection), tl.engine.v1
EngineControl (prefill role) and tl.kv.v1 KvTransferService (decode role),
heartbeating to gateways over tl.control.v1, and with -kv-events publishing
KV cache events over ZMQ as vLLM does. Port 0 takes a free port; the ports
taken are logged.

Flags:
`)
		fs.PrintDefaults()
	}
	var gateways listFlag
	var dieAfter int
	var logLevel, logFormat string
	fs.StringVar(&cfg.ID, "id", "", "worker `id` in heartbeats, [A-Za-z0-9._:-]{1,128} (default enginesim-<http port>)")
	fs.StringVar(&cfg.Model, "model", enginesim.DefaultModel, "served model `id`: the only model the engine answers to")
	fs.StringVar(&cfg.Role, "role", enginesim.RoleUnified, "`role`: unified, prefill or decode")
	fs.StringVar(&cfg.HTTPAddr, "http", "127.0.0.1:8000", "HTTP listen `address`")
	fs.StringVar(&cfg.GRPCAddr, "grpc", enginesim.DefaultAddr, "EngineControl gRPC listen `address` (prefill role)")
	fs.StringVar(&cfg.KVAddr, "kv", enginesim.DefaultAddr, "KvTransferService gRPC listen `address` (decode role)")
	fs.StringVar(&cfg.ControlAddr, "control", "", "optional listen `address` for /sim/faults that the refuse fault leaves open")
	fs.StringVar(&cfg.AdvertiseHost, "advertise-host", "127.0.0.1", "`host` advertised in heartbeats when listening on 0.0.0.0 or ::")
	fs.IntVar(&cfg.KVBlocks, "kv-blocks", 0, fmt.Sprintf("KV capacity in `blocks` of 16 tokens (0: the preset's with -timing step, %d with -timing flat)", enginesim.DefaultKVBlocks))
	kvFormat := fs.Uint("kv-format", enginesim.DefaultKVFormat, "KV layout `version`; prefill and decode engines pair only if equal")
	timing := fs.String("timing", "step", "`mode`: step (one loop runs steps like vLLM's V1 scheduler: continuous batching, chunked prefill under -max-num-batched-tokens, preemption by recompute; step times from the -preset's cost model) or flat (every sequence takes -prefill-per-token and -decode-per-token on its own); setting either per-token time alone selects flat")
	preset := fs.String("preset", enginesim.PresetLlama8BH100.Name, "step model `preset`: "+strings.Join(enginesim.PresetNames(), ", ")+" (cost model, API server stage, KV blocks and max_num_seqs calibrated to published vLLM figures)")
	maxBatched := fs.Int("max-num-batched-tokens", 0, "step token `budget` (vLLM's max_num_batched_tokens; 0: the preset's)")
	var cost enginesim.StepCost
	fs.DurationVar(&cost.Fixed, "step-fixed", 0, "override the preset's fixed `time` per step (weights read, launch, sampling)")
	fs.DurationVar(&cost.PerPrefillToken, "step-per-prefill-token", 0, "override the preset's step `time` per prefill token")
	fs.DurationVar(&cost.PerDecodeSeq, "step-per-decode-seq", 0, "override the preset's step `time` per decode sequence")
	fs.DurationVar(&cost.PerContextToken, "step-per-context-token", 0, "override the preset's step `time` per context token read")
	var api enginesim.APIServerCost
	fs.DurationVar(&api.PerRequest, "api-per-request", 0, "override the preset's API server `time` per request (parse, chat template, tokenize) before it is scheduled; 0 with the other: no API server stage")
	fs.DurationVar(&api.PerOutputToken, "api-per-output-token", 0, "override the preset's API server `time` per output token (detokenize, stream out); one server does both kinds of work in turn, a request's first")
	fs.DurationVar(&cfg.PrefillPerToken, "prefill-per-token", 0, "flat mode: prefill `time` per uncached prompt token")
	fs.DurationVar(&cfg.DecodePerToken, "decode-per-token", 0, "flat mode: decode `time` per generated token")
	fs.IntVar(&cfg.MaxRunning, "max-running", 0, fmt.Sprintf("sequences running at once, vLLM's max_num_seqs; more wait in the queue (0: the preset's, %d with -timing flat)", enginesim.DefaultMaxRunning))
	fs.StringVar(&cfg.KVEvents.Endpoint, "kv-events", "", "publish KV cache events as vLLM does (--kv-events-config) on a ZMQ PUB socket bound at this `endpoint`, e.g. tcp://127.0.0.1:5557 (port 0 takes a free one); frames [topic, 8-byte big-endian seq, msgpack EventBatch] (default: no events)")
	fs.BoolVar(&cfg.KVEvents.Connect, "kv-events-connect", false, "connect the PUB socket to -kv-events (a subscriber that binds) instead of binding it")
	fs.StringVar(&cfg.KVEvents.ReplayEndpoint, "kv-events-replay", "", "ZMQ ROUTER `endpoint` answering an 8-byte big-endian start sequence with the buffered batches from it, then sequence -1")
	fs.StringVar(&cfg.KVEvents.Topic, "kv-events-topic", "", "`topic` frame of every KV event message")
	kvEncoding := fs.String("kv-events-encoding", "map", "`form` of each event: map (a \"type\" key and named fields, vLLM since mid-2026) or array (tagged positional, older vLLM and SGLang); the batch is always [ts, events, data_parallel_rank]")
	kvHashes := fs.String("kv-events-hash", "int", "`format` of block hashes in events: int (low 64 bits, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1) or bytes (the 32-byte digest)")
	fs.IntVar(&cfg.KVEvents.BufferSteps, "kv-events-buffer-steps", kvevents.DefaultBufferSteps, "KV event `batches` kept for replay")
	fs.StringVar(&cfg.HashSeed, "hash-seed", enginesim.DefaultHashSeed, "`seed` of the root block hash (vLLM's PYTHONHASHSEED); prefill and decode engines must agree")
	fs.Uint64Var(&cfg.WeightsSeed, "weights-seed", 0, "toy model weights `seed` (default derived from -model)")
	fs.Float64Var(&cfg.Confidence, "confidence", 0.5, "model capability in (0, 1]: 0.5 is unsure on about half the prompts, 0.9 sure on nearly all")
	fs.Var(&gateways, "gateway", "gateway registry `address` to heartbeat (repeatable or comma-separated); a DNS name is re-resolved every heartbeat interval and every address it resolves to is heartbeated")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", enginesim.DefaultHeartbeatInterval, "heartbeat `interval` (a gateway's ack may change it)")
	fs.StringVar(&cfg.RegistryToken, "registry-token", "", "bearer `token` for the gateway registry (default $"+tokenEnv+")")
	fs.DurationVar(&cfg.HoldTimeout, "hold-timeout", enginesim.DefaultHoldTimeout, "`time` a decode engine holds pushed KV that nobody resumes")
	fs.DurationVar(&cfg.RemoteDecodeTimeout, "remote-decode-timeout", enginesim.DefaultRemoteDecodeTimeout, "`time` a prefill engine holds KV for a remote decode (kv_transfer_params do_remote_decode) that does not pull it (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT)")
	fs.StringVar(&cfg.BootstrapAddr, "bootstrap", "", "SGLang bootstrap `address` of a prefill engine, where decode engines join bootstrap rooms (default: none)")
	fs.DurationVar(&cfg.RoomTimeout, "room-timeout", enginesim.DefaultRoomTimeout, "`time` either side of an SGLang bootstrap room waits for the other")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", enginesim.DefaultShutdownTimeout, "`time` in-flight requests get to finish at shutdown")
	fs.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", enginesim.DefaultMaxBodyBytes, "largest request body in `bytes`")
	fs.IntVar(&cfg.EmbeddingDim, "embedding-dim", 0, fmt.Sprintf("length of the toy embeddings of /v1/embeddings (0 means %d)", enginesim.DefaultEmbeddingDim))
	var unserved, adapters listFlag
	fs.Var(&adapters, "lora-adapter", "LoRA adapter `id` loaded from the start, answered besides -model (repeatable or comma-separated)")
	fs.Var(&unserved, "unserved", "HTTP `path` answered 404 {\"detail\":\"Not Found\"}, as vLLM answers a path it does not serve (repeatable or comma-separated)")
	fs.BoolVar(&cfg.Faults.Refuse, "fault-refuse", false, "fault: refuse connections")
	fs.BoolVar(&cfg.Faults.Unavailable, "fault-unavailable", false, "fault: answer 503 (gRPC Unavailable)")
	fs.IntVar(&dieAfter, "fault-die-after", -1, "fault: close completions connections abruptly after `N` tokens (0: before the first byte; -1: off)")
	fs.IntVar(&cfg.Faults.StallMS, "fault-stall-ms", 0, "fault: stall `ms` milliseconds before the first byte")
	fs.BoolVar(&cfg.Faults.NoHeartbeat, "fault-no-heartbeat", false, "fault: stop heartbeating")
	fs.BoolVar(&cfg.Faults.KVEventsDrop, "fault-kv-events-drop", false, "fault: number KV event batches but do not send them (replay can fill the gaps)")
	fs.IntVar(&cfg.Faults.KVEventsDelayMS, "fault-kv-events-delay-ms", 0, "fault: send KV event batches `ms` milliseconds late")
	fs.BoolVar(&cfg.Faults.KVEventsRefuseReplay, "fault-kv-events-refuse-replay", false, "fault: answer KV event replay requests with the end marker alone")
	fs.BoolVar(&cfg.Faults.RefusePull, "fault-refuse-pull", false, "fault: a prefill engine refuses KV pulls, as one that died holding its remote decodes' blocks")
	fs.BoolVar(&cfg.Faults.UnreachablePrefill, "fault-unreachable-prefill", false, "fault: a decode engine cannot reach prefill engines (KV pulls and bootstrap joins fail)")
	fs.BoolVar(&cfg.Faults.PrefillStops, "fault-prefill-stops", false, "fault: a prefill engine's remote decodes end stopped at their one token (as vLLM's on EOS or a stop token id): no kv_transfer_params, nothing held")
	fs.StringVar(&logLevel, "log-level", "info", "log `level`: debug, info, warn, error")
	fs.StringVar(&logFormat, "log-format", "console", "log `format`: console or json")
	fs.StringVar(&tc.Endpoint, "otlp-endpoint", "", "OTLP receiver `URL` for the engine's spans, e.g. http://127.0.0.1:4317 (default: no spans)")
	fs.StringVar(&tc.Protocol, "otlp-protocol", tracing.ProtocolGRPC, "OTLP `protocol`: grpc or http")
	fs.Float64Var(&tc.SampleRatio, "otlp-sample-ratio", 1, "share of new traces recorded, in [0, 1] (a caller's traceparent decides for its own)")
	fs.StringVar(&tc.ServiceName, "otlp-service-name", "enginesim", "service.name of the engine's spans")
	err := fs.Parse(args)
	if err != nil {
		return cfg, tc, err
	}
	if fs.NArg() > 0 {
		return cfg, tc, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if tc.Endpoint != "" {
		if err := tc.Validate(); err != nil {
			return cfg, tc, fmt.Errorf("-otlp-*: %w", err)
		}
	}
	cfg.Gateways = gateways
	cfg.Unserved = unserved
	cfg.Adapters = adapters
	cfg.KVFormat = uint32(*kvFormat)
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["timing"] && (set["prefill-per-token"] || set["decode-per-token"]) {
		*timing = "flat"
	}
	switch *timing {
	case "flat":
		for _, f := range []string{"preset", "max-num-batched-tokens", "step-fixed", "step-per-prefill-token", "step-per-decode-seq", "step-per-context-token", "api-per-request", "api-per-output-token"} {
			if set[f] {
				return cfg, tc, fmt.Errorf("-%s is the step mode's; -timing is flat", f)
			}
		}
	case "step":
		if cfg.PrefillPerToken != 0 || cfg.DecodePerToken != 0 {
			return cfg, tc, errors.New("-prefill-per-token and -decode-per-token are the flat mode's; -timing is step")
		}
		p, err := enginesim.LookupPreset(*preset)
		if err != nil {
			return cfg, tc, fmt.Errorf("-preset: %w", err)
		}
		p.Apply(&cfg)
		for _, o := range []struct {
			flag string
			v    time.Duration
			dst  *time.Duration
		}{{"step-fixed", cost.Fixed, &cfg.Step.Cost.Fixed}, {"step-per-prefill-token", cost.PerPrefillToken, &cfg.Step.Cost.PerPrefillToken},
			{"step-per-decode-seq", cost.PerDecodeSeq, &cfg.Step.Cost.PerDecodeSeq}, {"step-per-context-token", cost.PerContextToken, &cfg.Step.Cost.PerContextToken},
			{"api-per-request", api.PerRequest, &cfg.Step.APIServer.PerRequest}, {"api-per-output-token", api.PerOutputToken, &cfg.Step.APIServer.PerOutputToken}} {
			if !set[o.flag] {
				continue
			}
			if o.v < 0 {
				return cfg, tc, fmt.Errorf("-%s %v < 0", o.flag, o.v)
			}
			*o.dst = o.v
		}
		if *maxBatched != 0 {
			cfg.Step.MaxNumBatchedTokens = *maxBatched
		}
	default:
		return cfg, tc, fmt.Errorf("-timing %q is not step or flat", *timing)
	}
	if cfg.KVEvents.Encoder.Encoding, err = kvevents.ParseEncoding(*kvEncoding); err != nil {
		return cfg, tc, fmt.Errorf("-kv-events-encoding: %w", err)
	}
	if cfg.KVEvents.Encoder.Hashes, err = kvevents.ParseHashFormat(*kvHashes); err != nil {
		return cfg, tc, fmt.Errorf("-kv-events-hash: %w", err)
	}
	if cfg.RegistryToken == "" {
		cfg.RegistryToken = getenv(tokenEnv)
	}
	if dieAfter >= 0 {
		cfg.Faults.Die, cfg.Faults.DieAfterTokens = true, dieAfter
	}
	if cfg.Confidence <= 0 || cfg.Confidence > 1 {
		return cfg, tc, fmt.Errorf("-confidence %v outside (0, 1]", cfg.Confidence)
	}
	level, err := zerolog.ParseLevel(logLevel)
	if err != nil {
		return cfg, tc, fmt.Errorf("-log-level: %w", err)
	}
	var out io.Writer
	switch logFormat {
	case "console":
		out = zerolog.ConsoleWriter{Out: stderr, TimeFormat: time.RFC3339}
	case "json":
		out = stderr
	default:
		return cfg, tc, fmt.Errorf("-log-format %q is not console or json", logFormat)
	}
	cfg.Logger = zerolog.New(out).Level(level).With().Timestamp().Logger()
	return cfg, tc, nil
}
