// Package config loads the gateway's TOML configuration: every key of the
// [gateway] table with its default, strict decoding (an unknown key is an
// error naming it), and validation that reports every problem at once, each
// naming its key. Relative paths in the file are relative to the working
// directory of the process.
package config

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/prefixindex"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Route policies (gateway.route_policy).
const (
	PolicyLeastOutstanding = "least_outstanding"
	PolicyWeighted         = "weighted"
	PolicyAffinity         = "affinity"
	PolicyCacheAware       = "cache_aware"
)

// API key scopes (gateway.api_keys[].scopes).
const (
	ScopeInference = "inference"
	ScopeDebug     = "debug"
	ScopeTrace     = "trace"
	ScopeAdmin     = "admin"
)

// DefaultLogFlushInterval is gateway.log_flush_interval's default;
// MaxLogFlushInterval bounds it.
const (
	DefaultLogFlushInterval = 100 * time.Millisecond
	MaxLogFlushInterval     = 10 * time.Second
)

// Log formats (gateway.log_format).
const (
	LogJSON    = "json"
	LogConsole = "console"
)

// Kinds of probed engines (gateway.engines[].kind).
const (
	KindVLLM     = "vllm"
	KindSGLang   = "sglang"
	KindLlamaCPP = "llamacpp"
	KindOpenAI   = "openai"
)

var (
	// ErrInvalid is wrapped by every *FieldError of Validate and Parse.
	ErrInvalid = errors.New("config: invalid configuration")
	// ErrUnknownKey is wrapped by the error for a key the schema does not
	// know.
	ErrUnknownKey = errors.New("config: unknown key")
)

// Config is the whole configuration file.
type Config struct {
	Gateway Gateway `toml:"gateway"`
}

// Gateway is the [gateway] table. Defaults are those of Default.
type Gateway struct {
	// Listen is the OpenAI API, admin and ops HTTP listener (host:port).
	Listen string `toml:"listen"`
	// RegistryListen is the tl.control.v1 gRPC listener (host:port).
	RegistryListen string `toml:"registry_listen"`
	// RoutePolicy is least_outstanding, weighted or affinity.
	RoutePolicy string `toml:"route_policy"`
	// AffinityLoadFactor is c in the bounded-load cap ceil(c*(m+1)/n), > 1.
	AffinityLoadFactor float64 `toml:"affinity_load_factor"`
	// HeartbeatInterval is T, the engines' heartbeat period.
	HeartbeatInterval Duration `toml:"heartbeat_interval"`
	// HeartbeatMissLimit is k: a worker is evicted k*T after its last
	// heartbeat.
	HeartbeatMissLimit int `toml:"heartbeat_miss_limit"`
	// MaxAttempts is how many workers a request tries before 503.
	MaxAttempts int `toml:"max_attempts"`
	// RecentModelWindow is how long a model stays known (503
	// no_capacity, never 404 model_not_found) after its last worker left;
	// 0: forgotten at once.
	RecentModelWindow Duration `toml:"recent_model_window"`
	// MaxBodyBytes bounds request bodies (413 above).
	MaxBodyBytes int64 `toml:"max_body_bytes"`
	// StateDir holds the persisted route table.
	StateDir string `toml:"state_dir"`

	// ConnectTimeout bounds dialing an engine.
	ConnectTimeout Duration `toml:"connect_timeout"`
	// FirstByteTimeout bounds the wait for an engine's first response byte.
	FirstByteTimeout Duration `toml:"first_byte_timeout"`
	// IdleTimeout bounds the gap between two chunks of an engine's stream.
	IdleTimeout Duration `toml:"idle_timeout"`
	// ReadHeaderTimeout is the HTTP server's ReadHeaderTimeout.
	ReadHeaderTimeout Duration `toml:"read_header_timeout"`
	// ReadBodyTimeout bounds reading an inference request's body once its
	// headers are in (a client dribbling its body is cut off).
	ReadBodyTimeout Duration `toml:"read_body_timeout"`
	// ServerIdleTimeout is the HTTP server's IdleTimeout (keep-alive).
	ServerIdleTimeout Duration `toml:"server_idle_timeout"`
	// ShutdownDelay is how long the gateway keeps serving new requests
	// after SIGTERM, with /readyz answering 503, so load balancers and
	// Kubernetes endpoints move away before it stops accepting; >= 0.
	ShutdownDelay Duration `toml:"shutdown_delay"`
	// ShutdownTimeout bounds the graceful drain of in-flight requests,
	// after ShutdownDelay.
	ShutdownTimeout Duration `toml:"shutdown_timeout"`

	// RegistryToken, when set, is the bearer token engines must present on
	// their heartbeats. RegistryTokenEnv names an environment variable that
	// holds it instead; at most one of the two.
	RegistryToken    string `toml:"registry_token"`
	RegistryTokenEnv string `toml:"registry_token_env"`

	// TLSCertFile and TLSKeyFile serve both listeners over TLS (both or
	// neither). EngineCAFile verifies engines that serve TLS.
	TLSCertFile  string `toml:"tls_cert_file"`
	TLSKeyFile   string `toml:"tls_key_file"`
	EngineCAFile string `toml:"engine_ca_file"`

	// LogFormat is json or console.
	LogFormat string `toml:"log_format"`
	// LogFlushInterval is how long a log line may wait to be written with
	// others (internal/adapter/logbuf); warnings and errors are written at
	// once. 0 writes every line as it comes.
	LogFlushInterval Duration `toml:"log_flush_interval"`
	// Console serves the web console under /ui/ (default true). Off, the
	// console's paths answer 404; the admin API it reads stays.
	Console bool `toml:"console"`
	// Pprof serves the Go runtime's profiles under /debug/pprof/ to keys
	// with the admin scope (default false).
	Pprof bool `toml:"pprof"`

	// APIKeys are the client keys; with none, auth is off and every
	// listener must be on loopback.
	APIKeys []APIKey `toml:"api_keys"`
	// Routes is the initial route table (the persisted one in StateDir,
	// when present, is the caller's business).
	Routes []routes.Route `toml:"routes"`
	// Engines are engines that do not heartbeat; the gateway probes them.
	Engines []Engine `toml:"engines"`
	// Discovery are the sources where more such engines are found
	// (Kubernetes, DNS); each engine found is probed alike.
	Discovery []Discovery `toml:"discovery"`
	// CacheAwarePrefillWeight and CacheAwareLoadWeight weigh the
	// cache_aware cost: prompt tokens to prefill on a worker and its load in
	// engine slots (>= 0, not both 0).
	CacheAwarePrefillWeight float64 `toml:"cache_aware_prefill_weight"`
	CacheAwareLoadWeight    float64 `toml:"cache_aware_load_weight"`
	// CacheAwareBalanceAbs (>= 0) and CacheAwareBalanceRel (>= 1) are the
	// balance guard: a worker more than abs slots and rel times above the
	// least loaded is passed over for it.
	CacheAwareBalanceAbs int     `toml:"cache_aware_balance_abs"`
	CacheAwareBalanceRel float64 `toml:"cache_aware_balance_rel"`
	// CacheAwareChunkBytes is the prefix index's chunk of rendered prompt
	// (bytes, 16..4096); CacheAwareBytesPerToken converts bytes to tokens
	// (> 0, <= 64).
	CacheAwareChunkBytes    int     `toml:"cache_aware_chunk_bytes"`
	CacheAwareBytesPerToken float64 `toml:"cache_aware_bytes_per_token"`
	// CacheAwareMaxRequestShare is the share of a worker's prefix index
	// one prompt may take (in (0, 1]).
	CacheAwareMaxRequestShare float64 `toml:"cache_aware_max_request_share"`
	// Store is where the route table and the drains are kept: state_dir
	// (one replica) or etcd (several replicas as one).
	Store Store `toml:"store"`

	// Ejection is passive health: workers failing in a row are ejected.
	Ejection Ejection `toml:"ejection"`
	// Admission is the per-worker concurrency limit and per-model queue.
	Admission Admission `toml:"admission"`
	// Tracing is the [gateway.tracing] table: OpenTelemetry traces over
	// OTLP, off unless an endpoint is set.
	Tracing Tracing `toml:"tracing"`
	// Sync is the [gateway.sync] table: fleet sync between replicas over
	// NATS, off (kind = "none") by default.
	Sync Sync `toml:"sync"`
	// Responses is the [gateway.responses] table: how long and how many
	// stored Responses API responses the gateway routes follow-ups of.
	Responses Responses `toml:"responses"`
	// KVEvents is the [gateway.kv_events] table: following the engines'
	// KV cache events; Tokenizer the [gateway.tokenizer] table: the
	// requests' tokens, to route on them.
	KVEvents  KVEvents  `toml:"kv_events"`
	Tokenizer Tokenizer `toml:"tokenizer"`

	// MaxConnections caps the HTTP listener's open connections; more are
	// closed as soon as they are accepted (0: no cap).
	MaxConnections int `toml:"max_connections"`
	// MaxConnectionsPerClient caps the open HTTP connections of one client
	// IP likewise (0: no cap).
	MaxConnectionsPerClient int `toml:"max_connections_per_client"`
	// MaxWorkers caps the workers registered by heartbeat; a new worker id
	// beyond it is refused (ResourceExhausted) until one is evicted.
	MaxWorkers int `toml:"max_workers"`
	// RegistryPeerRate and RegistryPeerBurst limit the heartbeats of one
	// peer IP address (per second, and at once); 0 disables the limit.
	RegistryPeerRate  float64 `toml:"registry_peer_rate"`
	RegistryPeerBurst int     `toml:"registry_peer_burst"`
	// EngineNetworks, when not empty, are the CIDR networks heartbeated
	// engine addresses must be in (IP addresses only).
	EngineNetworks []string `toml:"engine_networks"`
	// EngineTokens are per-engine registry tokens, each naming the worker
	// ids a heartbeat presenting it may use.
	EngineTokens []EngineToken `toml:"engine_tokens"`

	// MaxRoutes and MaxTableBytes bound the route table: a PUT with more
	// routes is refused, and so is a stored table (etcd) with more routes
	// or a larger body; 0 is no bound.
	MaxRoutes     int `toml:"max_routes"`
	MaxTableBytes int `toml:"max_table_bytes"`

	// TokensAdmission is what happens to a request of a key with
	// tokens_per_minute whose reservation (prompt estimate + max_tokens)
	// the key's bucket cannot hold: refused (TokensRefuse) or admitted with
	// max_tokens cut to what it holds (TokensClamp).
	TokensAdmission string `toml:"tokens_admission"`
	// TokensDefaultMaxTokens is the completion budget reserved, and sent as
	// max_tokens, for a request of such a key that sets no max_tokens.
	TokensDefaultMaxTokens int `toml:"tokens_default_max_tokens"`
}

// Token admission modes (gateway.tokens_admission).
const (
	TokensRefuse = "refuse"
	TokensClamp  = "clamp"
)

// MaxDefaultMaxTokens is the largest tokens_default_max_tokens accepted.
const MaxDefaultMaxTokens = 1 << 20

// EngineToken is a registry token for some engines only: a heartbeat that
// presents it may name only WorkerIDs. Exactly one of Token and TokenEnv
// is set.
type EngineToken struct {
	// Name identifies the token in logs; unique.
	Name string `toml:"name"`
	// Token is the secret itself; TokenEnv names an environment variable
	// holding it instead.
	Token    string `toml:"token"`
	TokenEnv string `toml:"token_env"`
	// WorkerIDs are the worker ids the token may register; each id in one
	// token at most.
	WorkerIDs []string `toml:"worker_ids"`
}

// Value returns the token: Token, or the value of TokenEnv (read now).
func (e EngineToken) Value() (string, error) {
	if e.TokenEnv != "" {
		v, err := envValue(e.TokenEnv)
		if err != nil {
			return "", fmt.Errorf("config: engine token %q: token_env: %w", e.Name, err)
		}
		return v, nil
	}
	return e.Token, nil
}

// Tracing is the [gateway.tracing] table.
type Tracing struct {
	// Endpoint is the OTLP receiver's URL (http://host:4317 for grpc,
	// http://host:4318 for http); empty turns tracing off.
	Endpoint string `toml:"endpoint"`
	// Protocol is grpc or http.
	Protocol string `toml:"protocol"`
	// SampleRatio is the share of new traces recorded, in [0, 1]; requests
	// that bring a traceparent follow its sampled flag.
	SampleRatio float64 `toml:"sample_ratio"`
	// ServiceName is the service.name of the gateway's spans.
	ServiceName string `toml:"service_name"`
	// HeadersEnv names an environment variable holding headers for the
	// receiver, "key=value,key2=value2" (OTEL_EXPORTER_OTLP_HEADERS works
	// too).
	HeadersEnv string `toml:"headers_env"`
}

// Tracing protocols (gateway.tracing.protocol).
const (
	TracingGRPC = "grpc"
	TracingHTTP = "http"
)

// APIKey is one client key. Exactly one of Key, KeyEnv and KeySHA256 is set.
type APIKey struct {
	// Name identifies the key in logs and metrics; unique.
	Name string `toml:"name"`
	// Key is the secret itself (discouraged: prefer KeyEnv or KeySHA256).
	Key string `toml:"key"`
	// KeyEnv names an environment variable holding the secret; it must be
	// set and non-empty when the configuration is loaded.
	KeyEnv string `toml:"key_env"`
	// KeySHA256 is the hex SHA-256 of the secret (64 hex digits).
	KeySHA256 string `toml:"key_sha256"`
	// Scopes are a non-empty subset of inference, debug, admin.
	Scopes []string `toml:"scopes"`
	// RequestsPerMinute, TokensPerMinute (prompt + completion) and
	// MaxConcurrent limit the key's inference requests; 0 or absent means
	// unlimited. Over a limit the key is answered 429 rate_limit_exceeded.
	RequestsPerMinute int `toml:"requests_per_minute"`
	TokensPerMinute   int `toml:"tokens_per_minute"`
	MaxConcurrent     int `toml:"max_concurrent"`
	// CacheIsolation is CacheShared (empty means it) or CacheIsolationKey:
	// whether the key's requests without a cache_salt share the engines'
	// prefix caches (and the gateway's prefix index) with other keys'.
	CacheIsolation string `toml:"cache_isolation"`
	// Priority is the admission priority of the key's requests (absent:
	// the route's); MaxPriority caps every priority they get, the
	// x-tlgate-priority header's included (absent: the header may not
	// raise a request above what it would have without it).
	Priority    *int `toml:"priority"`
	MaxPriority *int `toml:"max_priority"`
	// TTFTObjectiveMs is the key's default time-to-first-token objective
	// in milliseconds (0: the route's); ServeLate has its requests wait
	// rather than be refused when their objective can no longer be met.
	TTFTObjectiveMs int  `toml:"ttft_objective_ms"`
	ServeLate       bool `toml:"serve_late"`
}

// Cache isolation of a key (gateway.api_keys[].cache_isolation). Whatever
// it says, a client's cache_salt is bound to its key: two keys sending the
// same salt never share entries.
const (
	// CacheShared: a request without cache_salt shares the prefix cache
	// with every other key's unsalted requests.
	CacheShared = "shared"
	// CacheIsolationKey: every request of the key is salted with the key's
	// own salt, as if it sent one.
	CacheIsolationKey = "key"
)

// IsolatesCache reports whether every request of the key is salted.
func (k APIKey) IsolatesCache() bool { return k.CacheIsolation == CacheIsolationKey }

// Engine is an engine the gateway probes instead of waiting for its
// heartbeats (one that does not speak tl.control.v1).
type Engine struct {
	// ID is a worker id, [A-Za-z0-9._:-]{1,128}, unique among engines.
	ID string `toml:"id"`
	// HTTPAddress is the engine's OpenAI-compatible HTTP host:port.
	HTTPAddress string `toml:"http_address"`
	// Model is the model id the engine serves.
	Model string `toml:"model"`
	// Kind is vllm, sglang, llamacpp or openai: how to read its load,
	// and which disaggregation protocol a prefill or decode engine speaks
	// (vllm: kv_transfer_params; sglang: bootstrap rooms).
	Kind string `toml:"kind"`
	// Role is unified (empty means unified), prefill or decode: the part
	// the engine takes in serving its model. Routes with targets =
	// ["disaggregated"] pair a prefill and a decode engine of one kind.
	Role string `toml:"role"`
	// BootstrapPort is an SGLang prefill engine's bootstrap port (its
	// --disaggregation-bootstrap-port); 0 means SGLang's default, 8998.
	BootstrapPort int `toml:"bootstrap_port"`
	// ProbeInterval is the probe period; zero or absent means 2s.
	ProbeInterval Duration `toml:"probe_interval"`
	// AuthHeader is sent as Authorization to the engine ("Bearer xyz");
	// AuthHeaderEnv names an environment variable holding it instead.
	AuthHeader    string `toml:"auth_header"`
	AuthHeaderEnv string `toml:"auth_header_env"`
	// KVEvents is the engine's KV events PUB socket (tcp://host:port, a
	// missing host being its http address's, or ipc:///path), when it
	// publishes them (vLLM's and SGLang's --kv-events-config);
	// KVEventsReplay its replay socket, KVEventsTopic its topic.
	KVEvents       string `toml:"kv_events"`
	KVEventsReplay string `toml:"kv_events_replay"`
	KVEventsTopic  string `toml:"kv_events_topic"`
}

// DefaultProbeInterval is an engine's probe period when none is given.
const DefaultProbeInterval = 2 * time.Second

// Default returns the configuration with every default and no keys,
// routes or engines.
func Default() *Config {
	return &Config{Gateway: Gateway{
		Listen:             "127.0.0.1:8080",
		RegistryListen:     "127.0.0.1:9090",
		RoutePolicy:        PolicyCacheAware,
		AffinityLoadFactor: 1.25,
		HeartbeatInterval:  D(2 * time.Second),
		HeartbeatMissLimit: 3,
		MaxAttempts:        3,
		RecentModelWindow:  D(router.DefaultRecentModels),
		MaxBodyBytes:       1 << 20,
		StateDir:           "./tlgate-data",
		ConnectTimeout:     D(2 * time.Second),
		FirstByteTimeout:   D(30 * time.Second),
		IdleTimeout:        D(60 * time.Second),
		ReadHeaderTimeout:  D(10 * time.Second),
		ReadBodyTimeout:    D(30 * time.Second),
		ServerIdleTimeout:  D(120 * time.Second),
		ShutdownDelay:      D(5 * time.Second),
		ShutdownTimeout:    D(10 * time.Second),
		LogFormat:          LogJSON,
		LogFlushInterval:   D(DefaultLogFlushInterval),
		Console:            true,

		CacheAwarePrefillWeight:   1,
		CacheAwareLoadWeight:      64,
		CacheAwareBalanceAbs:      64,
		CacheAwareBalanceRel:      1.5,
		CacheAwareChunkBytes:      128,
		CacheAwareBytesPerToken:   prefixindex.DefaultBytesPerToken,
		CacheAwareMaxRequestShare: 0.5,
		MaxWorkers:                1024,
		RegistryPeerRate:          200,
		RegistryPeerBurst:         400,
		TokensAdmission:           TokensRefuse,
		MaxRoutes:                 4096,
		MaxTableBytes:             1 << 20,
		TokensDefaultMaxTokens:    4096,
		Store:                     Store{Kind: StoreFile, Prefix: DefaultStorePrefix, DialTimeout: D(DefaultStoreDialTimeout)},
		Ejection:                  defaultEjection(),
		Admission:                 defaultAdmission(),
		Tracing:                   Tracing{Protocol: TracingGRPC, SampleRatio: 1, ServiceName: "tlgate"},
		Sync:                      defaultSync(),
		Responses:                 defaultResponses(),
		KVEvents:                  defaultKVEvents(),
		Tokenizer:                 defaultTokenizer(),

		MaxConnections:          10000,
		MaxConnectionsPerClient: 1000,
	}}
}

// Load reads the file at path and parses it (see Parse).
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse decodes a TOML document over Default, rejects keys the schema does
// not know (naming each), fills engines' default probe interval and
// validates (see Validate). Environment variables named by key_env,
// registry_token_env and auth_header_env are read here.
func Parse(data []byte) (*Config, error) {
	c := Default()
	md, err := toml.Decode(string(data), c)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		sort.Slice(und, func(i, j int) bool { return und[i].String() < und[j].String() })
		errs := make([]error, len(und))
		for i, k := range und {
			errs[i] = fmt.Errorf("%w %s", ErrUnknownKey, k)
			if s := suggestion(k); s != "" {
				errs[i] = fmt.Errorf("%w %s (did you mean %s?)", ErrUnknownKey, k, s)
			}
		}
		return nil, errors.Join(errs...)
	}
	for i := range c.Gateway.Engines {
		if c.Gateway.Engines[i].ProbeInterval.Duration == 0 {
			c.Gateway.Engines[i].ProbeInterval = D(DefaultProbeInterval)
		}
	}
	for i := range c.Gateway.Discovery {
		c.Gateway.Discovery[i].withDiscoveryDefaults()
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// HeartbeatDeadline is how long after its last heartbeat a worker is
// evicted: heartbeat_miss_limit × heartbeat_interval.
func (g Gateway) HeartbeatDeadline() time.Duration {
	return time.Duration(g.HeartbeatMissLimit) * g.HeartbeatInterval.Duration
}

// PrefixIndex is the cache_aware prefix index's chunking and capacity
// settings (cache_aware_chunk_bytes, _bytes_per_token and
// _max_request_share).
func (g Gateway) PrefixIndex() prefixindex.Config {
	return prefixindex.Config{ChunkBytes: g.CacheAwareChunkBytes, BytesPerToken: g.CacheAwareBytesPerToken, MaxRequestShare: g.CacheAwareMaxRequestShare}
}

// HasScope reports whether the key grants scope.
func (k APIKey) HasScope(scope string) bool {
	for _, s := range k.Scopes {
		if s == scope {
			return true
		}
	}
	return false
}

// envValue reads a required environment variable; the error names the
// variable, never a value.
func envValue(name string) (string, error) {
	v, ok := os.LookupEnv(name)
	switch {
	case !ok:
		return "", fmt.Errorf("environment variable %s is not set", name)
	case strings.TrimSpace(v) == "":
		return "", fmt.Errorf("environment variable %s is empty", name)
	}
	return v, nil
}
