package enginesim

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/tlgate/tlgate/enginesim/kvevents"
	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// Roles an engine can play (Config.Role).
const (
	RoleUnified = "unified"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Defaults of the zero Config fields.
const (
	DefaultModel               = "sim"
	DefaultAddr                = "127.0.0.1:0"
	DefaultKVBlocks            = 4096
	DefaultKVFormat            = 1
	DefaultMaxRunning          = 256
	DefaultHeartbeatInterval   = 2 * time.Second
	DefaultHoldTimeout         = 60 * time.Second
	DefaultRemoteDecodeTimeout = 480 * time.Second
	DefaultRoomTimeout         = 300 * time.Second
	DefaultShutdownTimeout     = 10 * time.Second
	DefaultMaxBodyBytes        = 4 << 20
	// BlockTokens is the number of tokens in one KV block.
	BlockTokens = 16
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("enginesim: invalid config")

var workerIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// Config configures one engine. The zero value of every field but Logger
// selects its documented default; the zero Logger logs nothing.
type Config struct {
	// ID is the worker id sent in heartbeats ([A-Za-z0-9._:-]{1,128});
	// default "enginesim-<http port>".
	ID string
	// Model is the served model id, the only one the engine answers to;
	// default "sim".
	Model string
	// Role is "unified" (default), "prefill" or "decode".
	Role string

	// HTTPAddr is the OpenAI-compatible HTTP listen address.
	HTTPAddr string
	// GRPCAddr is the tl.engine.v1.EngineControl listen address (prefill
	// role only).
	GRPCAddr string
	// KVAddr is the tl.kv.v1.KvTransferService listen address (decode role
	// only).
	KVAddr string
	// ControlAddr, when set, also serves GET/POST /sim/faults on a listener
	// that the refuse fault leaves open (so a refusing engine can be told to
	// stop refusing over HTTP).
	ControlAddr string
	// AdvertiseHost replaces an unspecified listen host (0.0.0.0, ::) in the
	// heartbeat's addresses; default 127.0.0.1.
	AdvertiseHost string
	// All listen addresses default to 127.0.0.1:0 (a free port); the
	// accessors and the log say which port was taken.

	// KVBlocks is the KV capacity in blocks of BlockTokens tokens
	// (default 4096).
	KVBlocks int
	// KVFormat is the KV layout version (default 1); prefill and decode
	// engines pair only if equal.
	KVFormat uint32
	// PrefillPerToken is the prefill time per uncached prompt token and
	// DecodePerToken the time per generated token (default 0: instant).
	PrefillPerToken, DecodePerToken time.Duration
	// MaxRunning bounds the sequences running at once (vLLM's
	// max_num_seqs); further requests wait in the queue (default 256).
	MaxRunning int
	// Step, when set, runs the engine on the step scheduler (continuous
	// batching, chunked prefill, preemption, step times from a cost model)
	// instead of the flat mode, where every sequence takes
	// PrefillPerToken and DecodePerToken on its own; those two must then
	// be zero.
	Step *StepConfig

	// KVEvents, when its Endpoint is set, publishes the prefix cache's
	// events as vLLM does (--kv-events-config): BlockStored when blocks
	// are cached, BlockRemoved when evicted, AllBlocksCleared when the
	// cache is reset. Its Logger is the engine's.
	KVEvents kvevents.Config
	// HashSeed is the seed of the root block hash, vLLM's PYTHONHASHSEED
	// (default DefaultHashSeed). Prefill and decode engines must agree.
	HashSeed string

	// WeightsSeed selects the toy model's weights (default: derived from
	// Model, so every engine serving a model id has the same weights).
	WeightsSeed uint64
	// Confidence in (0, 1] is the model's capability: 0.5 (default) is unsure
	// on about half of all prompts, 0.9 is sure on nearly all.
	Confidence float64
	// Adapters are the LoRA adapters loaded from the start, each a model
	// id the engine answers to besides Model (LoadAdapter and POST
	// /v1/load_lora_adapter load more at run time).
	Adapters []string
	// EmbeddingDim is the length of the toy embeddings of /v1/embeddings
	// (default DefaultEmbeddingDim).
	EmbeddingDim int
	// Unserved lists HTTP paths the engine does not serve, e.g.
	// "/v1/embeddings": each is answered 404 {"detail":"Not Found"}, as
	// vLLM answers a path it has no route for (a generative model asked
	// for embeddings, say).
	Unserved []string

	// Gateways are the tl.control.v1 WorkerRegistry addresses to heartbeat
	// (host:port). A host that is a DNS name is resolved every heartbeat
	// interval and every address it resolves to is heartbeated, as the
	// replicas of a gateway behind a headless Service need.
	Gateways []string
	// Resolver resolves the gateways' DNS names; nil means the system's.
	Resolver *net.Resolver
	// HeartbeatInterval is the initial heartbeat interval (default 2s); a
	// HeartbeatAck's interval_ms replaces it.
	HeartbeatInterval time.Duration
	// RegistryToken, if set, is sent as "authorization: Bearer <token>".
	RegistryToken string

	// HoldTimeout frees pushed KV blocks that no request resumed (decode
	// role; default 60s).
	HoldTimeout time.Duration
	// RemoteDecodeTimeout frees the KV a prefill engine holds for a remote
	// decode engine (kv_transfer_params do_remote_decode) that does not
	// pull it (default 480s, vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
	RemoteDecodeTimeout time.Duration
	// BootstrapAddr is SGLang's bootstrap port of a prefill engine, where
	// decode engines join bootstrap rooms (default: none).
	BootstrapAddr string
	// RoomTimeout bounds how long either side of a bootstrap room waits
	// for the other (default 300s, SGLang's
	// SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT).
	RoomTimeout time.Duration
	// ShutdownTimeout bounds Close's wait for in-flight work (default 10s).
	ShutdownTimeout time.Duration
	// MaxBodyBytes bounds request bodies (default 4 MiB; larger gets 413).
	MaxBodyBytes int64

	// Faults are injected from the start (see SetFaults).
	Faults Faults
	// Logger receives the engine's logs.
	Logger zerolog.Logger
	// Tracer, when set, records the engine's spans (inference, tokenize,
	// Prefill, KV push and Release), each continuing the caller's W3C trace
	// context (traceparent in HTTP headers or gRPC metadata).
	Tracer trace.TracerProvider

	// hooks lets the package's tests observe internal events.
	hooks *hooks
}

// hooks are test-only notifications; every channel is optional and sent to
// without blocking.
type hooks struct {
	stalled           chan struct{} // a request started stalling
	queued            chan struct{} // a sequence started waiting for admission
	expired           chan struct{} // a KV hold timed out
	heartbeatSkipped  chan struct{} // a heartbeat was skipped (fault)
	heartbeatReturned chan error    // a heartbeat RPC returned
	// prefilled, if set, is called with the prompt of every sequence
	// admitted for prefill.
	prefilled func(prompt []uint32)
}

func (c Config) withDefaults() (Config, error) {
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.Role == "" {
		c.Role = RoleUnified
	}
	if _, err := roleOf(c.Role); err != nil {
		return c, err
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = DefaultAddr
	}
	if c.GRPCAddr == "" {
		c.GRPCAddr = DefaultAddr
	}
	if c.KVAddr == "" {
		c.KVAddr = DefaultAddr
	}
	if c.AdvertiseHost == "" {
		c.AdvertiseHost = "127.0.0.1"
	}
	if c.KVBlocks == 0 {
		c.KVBlocks = DefaultKVBlocks
	}
	if c.KVFormat == 0 {
		c.KVFormat = DefaultKVFormat
	}
	if c.MaxRunning == 0 {
		c.MaxRunning = DefaultMaxRunning
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.HoldTimeout == 0 {
		c.HoldTimeout = DefaultHoldTimeout
	}
	if c.RemoteDecodeTimeout == 0 {
		c.RemoteDecodeTimeout = DefaultRemoteDecodeTimeout
	}
	if c.RoomTimeout == 0 {
		c.RoomTimeout = DefaultRoomTimeout
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.HashSeed == "" {
		c.HashSeed = DefaultHashSeed
	}
	if c.EmbeddingDim == 0 {
		c.EmbeddingDim = DefaultEmbeddingDim
	}
	switch {
	case c.ID != "" && !workerIDPattern.MatchString(c.ID):
		return c, fmt.Errorf("%w: id %q does not match [A-Za-z0-9._:-]{1,128}", ErrConfig, c.ID)
	case c.KVBlocks < 0:
		return c, fmt.Errorf("%w: kv blocks %d < 0", ErrConfig, c.KVBlocks)
	case c.MaxRunning < 0:
		return c, fmt.Errorf("%w: max running %d < 0", ErrConfig, c.MaxRunning)
	case c.Confidence < 0 || c.Confidence > 1:
		return c, fmt.Errorf("%w: confidence %v outside [0, 1]", ErrConfig, c.Confidence)
	case c.PrefillPerToken < 0 || c.DecodePerToken < 0:
		return c, fmt.Errorf("%w: negative per-token cost", ErrConfig)
	case c.Step != nil && (c.PrefillPerToken != 0 || c.DecodePerToken != 0):
		return c, fmt.Errorf("%w: per-token costs are the flat mode's; the step scheduler times steps by its cost model", ErrConfig)
	case c.Step != nil && c.Step.MaxNumBatchedTokens < 0:
		return c, fmt.Errorf("%w: max num batched tokens %d < 0", ErrConfig, c.Step.MaxNumBatchedTokens)
	case c.BootstrapAddr != "" && c.Role != RolePrefill:
		return c, fmt.Errorf("%w: a bootstrap port is a prefill engine's; this one is %s", ErrConfig, c.Role)
	case c.HeartbeatInterval < 0 || c.HoldTimeout < 0 || c.ShutdownTimeout < 0 || c.RemoteDecodeTimeout < 0 || c.RoomTimeout < 0:
		return c, fmt.Errorf("%w: negative interval or timeout", ErrConfig)
	case c.MaxBodyBytes < 0:
		return c, fmt.Errorf("%w: max body bytes %d < 0", ErrConfig, c.MaxBodyBytes)
	case c.EmbeddingDim < 0 || c.EmbeddingDim > 4096:
		return c, fmt.Errorf("%w: embedding dim %d outside [1, 4096]", ErrConfig, c.EmbeddingDim)
	}
	if c.Step != nil {
		if err := c.Step.Cost.validate(); err != nil {
			return c, err
		}
		if err := c.Step.APIServer.validate(); err != nil {
			return c, err
		}
	}
	for _, a := range c.Adapters {
		if err := c.checkAdapter(a); err != nil {
			return c, err
		}
	}
	for _, p := range c.Unserved {
		if len(p) < 2 || p[0] != '/' {
			return c, fmt.Errorf("%w: unserved path %q must start with /", ErrConfig, p)
		}
	}
	for _, g := range c.Gateways {
		if _, _, err := net.SplitHostPort(g); err != nil {
			return c, fmt.Errorf("%w: gateway address %q: %w", ErrConfig, g, err)
		}
	}
	if err := c.Faults.validate(); err != nil {
		return c, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return c, nil
}

func roleOf(role string) (controlv1.Role, error) {
	switch role {
	case RoleUnified:
		return controlv1.Role_ROLE_UNIFIED, nil
	case RolePrefill:
		return controlv1.Role_ROLE_PREFILL, nil
	case RoleDecode:
		return controlv1.Role_ROLE_DECODE, nil
	}
	return 0, fmt.Errorf("%w: role %q is not unified, prefill or decode", ErrConfig, role)
}
