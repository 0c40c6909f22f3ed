package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/routing/prefixindex"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

const examplePath = "../../../configs/example.toml"

// messages splits a joined error into its messages.
func messages(err error) []string {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []string
		for _, e := range j.Unwrap() {
			out = append(out, e.Error())
		}
		return out
	}
	return []string{err.Error()}
}

func TestConfig(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		c, err := Parse(nil)
		if err != nil {
			t.Fatal(err)
		}
		want := Gateway{
			Listen: "127.0.0.1:8080", RegistryListen: "127.0.0.1:9090",
			RoutePolicy: "cache_aware", AffinityLoadFactor: 1.25,
			HeartbeatInterval: D(2 * time.Second), HeartbeatMissLimit: 3,
			MaxAttempts: 3, MaxBodyBytes: 1048576, StateDir: "./tlgate-data",
			ConnectTimeout: D(2 * time.Second), FirstByteTimeout: D(30 * time.Second),
			IdleTimeout: D(60 * time.Second), ReadHeaderTimeout: D(10 * time.Second), ReadBodyTimeout: D(30 * time.Second),
			ServerIdleTimeout: D(120 * time.Second), ShutdownDelay: D(5 * time.Second), ShutdownTimeout: D(10 * time.Second),
			LogFormat: "json", LogFlushInterval: D(100 * time.Millisecond), Console: true,
			CacheAwarePrefillWeight: 1, CacheAwareLoadWeight: 64, CacheAwareBalanceAbs: 64, CacheAwareBalanceRel: 1.5,
			CacheAwareChunkBytes: 128, CacheAwareBytesPerToken: 4, CacheAwareMaxRequestShare: 0.5,
			Store:    Store{Kind: "file", Prefix: "/tlgate/", DialTimeout: D(5 * time.Second)},
			Ejection: Ejection{ConsecutiveFailures: 3, ConsecutiveRefused: 1, BaseTime: D(10 * time.Second), MaxTime: D(5 * time.Minute), MaxPercent: 50},
			Admission: Admission{Enabled: true, LimitScope: "pool", SaturationQueueDepth: 5, ModelConcurrency: map[string]int{}, EngineConcurrency: map[string]int{},
				QueueSize: 1024, QueueTimeout: D(30 * time.Second)},
			MaxWorkers: 1024, RegistryPeerRate: 200, RegistryPeerBurst: 400,
			TokensAdmission: TokensRefuse, MaxRoutes: 4096, MaxTableBytes: 1 << 20, TokensDefaultMaxTokens: 4096,
			MaxConnections: 10000, MaxConnectionsPerClient: 1000, RecentModelWindow: D(24 * time.Hour),
		}
		want.Tracing = Tracing{Protocol: "grpc", SampleRatio: 1, ServiceName: "tlgate"}
		want.Sync = Sync{Kind: "none", SubjectPrefix: "tlgate.sync", BatchInterval: D(time.Millisecond), ReleaseHold: D(5 * time.Millisecond), MaxBatchBytes: 64 << 10,
			MaxQueue: 8192, MaxMessageBytes: 1 << 20, PeerRate: 2000, LoadInterval: D(time.Second), PeerTimeout: D(5 * time.Second),
			StaleAfter: D(10 * time.Second), MaxPeers: 32, MaxPeerInFlight: 256, PeerClaimMargin: 8, EjectionQuorum: 2, SnapshotTimeout: D(2 * time.Second), SnapshotChunks: 16384,
			ConnectTimeout: D(2 * time.Second), ReconnectWait: D(500 * time.Millisecond), KeyLimits: "fleet"}
		want.Responses = Responses{StoreTTL: D(time.Hour), StoreMaxEntries: 100_000}
		want.KVEvents = KVEvents{Follow: true, MaxBlocks: 1 << 18, SpeculativeTTL: D(2 * time.Second), EventTimeout: D(5 * time.Second), ReplayTimeout: D(2 * time.Second),
			MaxMessageBytes: 16 << 20, BytesPerSecond: 64 << 20, CPUWeight: 0.8, DiskWeight: 0.5,
			IndexAgreement: 0.95, AgreementSample: 8}
		want.Tokenizer = Tokenizer{Timeout: D(50 * time.Millisecond), CacheTokens: 1 << 22}
		if !reflect.DeepEqual(c.Gateway, want) {
			t.Fatalf("defaults\n got %+v\nwant %+v", c.Gateway, want)
		}
		if !reflect.DeepEqual(c, Default()) {
			t.Fatal("Parse(nil) differs from Default()")
		}
		if !c.AllLoopback() {
			t.Error("defaults are not all loopback")
		}
		if got := c.Gateway.HeartbeatDeadline(); got != 6*time.Second {
			t.Errorf("HeartbeatDeadline = %v, want 6s", got)
		}
	})

	t.Run("example loads", func(t *testing.T) {
		t.Setenv("TLGATE_OPS_KEY", "ops-secret")
		c, err := Load(examplePath)
		if err != nil {
			t.Fatal(err)
		}
		g := c.Gateway
		if len(g.APIKeys) != 1 || g.APIKeys[0].Name != "ops" || !g.APIKeys[0].HasScope(ScopeAdmin) || g.APIKeys[0].HasScope("root") {
			t.Errorf("api_keys = %+v", g.APIKeys)
		}
		d, err := g.APIKeys[0].Digest()
		if err != nil || d != sha256.Sum256([]byte("ops-secret")) {
			t.Errorf("Digest = %x, %v", d, err)
		}
		wantRoutes := []routes.Route{
			{Model: "smol", Aliases: []string{"smol-latest"}, Backends: []routes.Backend{{Model: "smol-v3", Weight: 0.9}, {Model: "smol-v4", Weight: 0.1}}, Priority: 10, TTFTObjectiveMs: 500},
			{Model: "auto", Cascade: []routes.Step{{Model: "smol", AcceptIf: "mean_logprob > -1.2"}, {Model: "big"}}, OnEscalationFailure: routes.EscalationAnswer},
			{Model: "big-pd", Backends: []routes.Backend{{Model: "big", Weight: 1}}, Targets: []string{"disaggregated"}},
		}
		if !reflect.DeepEqual(g.Routes, wantRoutes) {
			t.Errorf("routes\n got %+v\nwant %+v", g.Routes, wantRoutes)
		}
		if _, err := routes.NewTable(g.Routes); err != nil {
			t.Error(err)
		}
		// The example sets every default explicitly.
		d0 := Default().Gateway
		g.APIKeys, g.Routes = nil, nil
		if len(g.EngineNetworks) == 0 {
			g.EngineNetworks = nil // the example's [] is the default
		}
		if len(g.EngineTokens) == 0 {
			g.EngineTokens = nil
		}
		if !reflect.DeepEqual(g, d0) {
			t.Errorf("example differs from the defaults\n got %+v\nwant %+v", g, d0)
		}
	})

	t.Run("example without its key variable", func(t *testing.T) {
		t.Setenv("TLGATE_OPS_KEY", "")
		os.Unsetenv("TLGATE_OPS_KEY")
		_, err := Load(examplePath)
		if err == nil || !strings.Contains(err.Error(), "gateway.api_keys[0].key_env: environment variable TLGATE_OPS_KEY is not set") {
			t.Fatalf("Load error = %v", err)
		}
	})

	t.Run("unknown keys rejected by name", func(t *testing.T) {
		for _, tc := range []struct{ doc, want string }{
			{"[gateway]\nlistn = \"127.0.0.1:1\"\n", "gateway.listn"},
			{"[gateway]\n[gateway.extra]\nx = 1\n", "gateway.extra"},
			{"[gatway]\nlisten = \"x\"\n", "gatway"},
			{"top = 1\n", "top"},
			{"[[gateway.routes]]\nmodle = \"a\"\n", "gateway.routes.modle"},
			{"[[gateway.routes]]\nmodel = \"a\"\nbackends = [{ model = \"b\", wieght = 1 }]\n", "gateway.routes.backends.wieght"},
			{"[[gateway.api_keys]]\nname = \"a\"\nkey = \"k\"\nscope = [\"admin\"]\n", "gateway.api_keys.scope"},
			{"[[gateway.engines]]\nid = \"e\"\nhttp_addr = \"x:1\"\n", "gateway.engines.http_addr"},
		} {
			_, err := Parse([]byte(tc.doc))
			if !errors.Is(err, ErrUnknownKey) || !strings.Contains(err.Error(), "unknown key "+tc.want) {
				t.Errorf("Parse(%q) error = %v, want unknown key %s", tc.doc, err, tc.want)
			}
		}
		for _, tc := range []struct{ doc, want string }{
			{"[gateway]\nheartbeat_intervall = \"2s\"\n", "gateway.heartbeat_intervall (did you mean gateway.heartbeat_interval?)"},
			{"[gateway]\nlistn = \"127.0.0.1:1\"\n", "gateway.listn (did you mean gateway.listen?)"},
			{"[[gateway.routes]]\nmodel = \"a\"\nbackends = [{ model = \"b\", wieght = 1 }]\n", "gateway.routes.backends.wieght (did you mean gateway.routes.backends.weight?)"},
			{"[[gateway.engines]]\nid = \"e\"\nhttp_addr = \"x:1\"\n", "gateway.engines.http_addr (did you mean gateway.engines.http_address?)"},
			{"[gateway.ejection]\nconsecutive_failure = 3\n", "gateway.ejection.consecutive_failure (did you mean gateway.ejection.consecutive_failures?)"},
			{"[gatway]\nlisten = \"x\"\n", "gatway (did you mean gateway?)"},
		} {
			if _, err := Parse([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), "unknown key "+tc.want) {
				t.Errorf("Parse(%q) error = %v, want unknown key %s", tc.doc, err, tc.want)
			}
		}
		if _, err := Parse([]byte("[gateway]\nfrobnicate = 1\n")); err == nil || strings.Contains(err.Error(), "did you mean") {
			t.Errorf("a key like none: %v, want no suggestion", err)
		}
		_, err := Parse([]byte("[gateway]\nb = 1\na = 2\n"))
		if got, want := messages(err), []string{"config: unknown key gateway.a", "config: unknown key gateway.b"}; !slices.Equal(got, want) {
			t.Errorf("two unknown keys: %q, want %q", got, want)
		}
	})

	t.Run("syntax and type errors", func(t *testing.T) {
		for _, tc := range []struct{ doc, want string }{
			{"[gateway\n", "toml"},
			{"[gateway]\nheartbeat_miss_limit = \"3\"\n", "heartbeat_miss_limit"},
			{"[gateway]\nheartbeat_interval = 2\n", "heartbeat_interval"},
			{"[gateway]\nheartbeat_interval = \"2 seconds\"\n", `want a duration such as "2s"`},
			{"[gateway]\nlisten = \"a\"\nlisten = \"b\"\n", "listen"},
		} {
			_, err := Parse([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse(%q) error = %v, want it to mention %q", tc.doc, err, tc.want)
			}
		}
	})
}

func TestConfigValidation(t *testing.T) {
	dir := t.TempDir()
	cert := filepath.Join(dir, "cert.pem")
	if err := os.WriteFile(cert, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	t.Setenv("TLGATE_TEST_SET", "value")
	t.Setenv("TLGATE_TEST_EMPTY", "")
	hash := hex.EncodeToString(make([]byte, 32))

	tests := []struct {
		name string
		doc  string
		want []string // every message, in order; nil means valid
	}{
		{"listen not host:port", `listen = "8080"`, []string{`gateway.listen: want host:port, got "8080"`}},
		{"listen bad port", `listen = "127.0.0.1:http"`, []string{`gateway.listen: port must be a number from 0 to 65535, got "http"`}},
		{"listen port too large", `listen = "127.0.0.1:65536"`, []string{`gateway.listen: port must be a number from 0 to 65535, got "65536"`}},
		{"listen bad host", `listen = "a b:80"`, []string{`gateway.listen: invalid host "a b"`}},
		{"listen port zero is fine", `listen = "127.0.0.1:0"` + "\n" + `registry_listen = "127.0.0.1:0"`, nil},
		{"ipv6 and localhost listeners", `listen = "[::1]:8080"` + "\n" + `registry_listen = "localhost:9090"`, nil},
		{"registry_listen same as listen", `registry_listen = "127.0.0.1:8080"`, []string{`gateway.registry_listen: must differ from listen, both are "127.0.0.1:8080"`}},
		{"route_policy", `route_policy = "random"`, []string{`gateway.route_policy: must be "least_outstanding", "weighted", "affinity" or "cache_aware", got "random"`}},
		{"weighted", `route_policy = "weighted"`, nil},
		{"affinity", `route_policy = "affinity"`, nil},
		{"cache_aware", `route_policy = "cache_aware"`, nil},
		{"cache_aware weights", "cache_aware_prefill_weight = -1\ncache_aware_load_weight = nan", []string{
			"gateway.cache_aware_prefill_weight: must be >= 0, got -1", "gateway.cache_aware_load_weight: must be >= 0, got NaN"}},
		{"cache_aware weights both 0", "cache_aware_prefill_weight = 0.0\ncache_aware_load_weight = 0.0", []string{
			"gateway.cache_aware_load_weight: must be > 0 when cache_aware_prefill_weight is 0"}},
		{"cache_aware load only", "cache_aware_prefill_weight = 0.0", nil},
		{"cache_aware thresholds", "cache_aware_balance_abs = -1\ncache_aware_balance_rel = 0.5", []string{
			"gateway.cache_aware_balance_abs: must be >= 0, got -1", "gateway.cache_aware_balance_rel: must be >= 1, got 0.5"}},
		{"cache_aware chunking", "cache_aware_chunk_bytes = 8\ncache_aware_bytes_per_token = 0.0", []string{
			"gateway.cache_aware_chunk_bytes: must be in 16..4096, got 8", "gateway.cache_aware_bytes_per_token: must be > 0 and <= 64, got 0"}},
		{"cache_aware request share", "cache_aware_max_request_share = 1.5", []string{"gateway.cache_aware_max_request_share: must be > 0 and <= 1, got 1.5"}},
		{"cache_aware request share zero", "cache_aware_max_request_share = 0.0", []string{"gateway.cache_aware_max_request_share: must be > 0 and <= 1, got 0"}},
		{"affinity_load_factor", `affinity_load_factor = 0.8`, []string{"gateway.affinity_load_factor: must be > 1, got 0.8"}},
		{"affinity_load_factor one", `affinity_load_factor = 1.0`, []string{"gateway.affinity_load_factor: must be > 1, got 1"}},
		{"affinity_load_factor nan", `affinity_load_factor = nan`, []string{"gateway.affinity_load_factor: must be > 1, got NaN"}},
		{"affinity_load_factor inf", `affinity_load_factor = inf`, []string{"gateway.affinity_load_factor: must be > 1, got +Inf"}},
		{"heartbeat_interval", `heartbeat_interval = "0s"`, []string{"gateway.heartbeat_interval: must be > 0, got 0s"}},
		{"heartbeat_miss_limit", `heartbeat_miss_limit = 0`, []string{"gateway.heartbeat_miss_limit: must be >= 1, got 0"}},
		{"recent_model_window", `recent_model_window = "-1s"`, []string{"gateway.recent_model_window: must be >= 0, got -1s"}},
		{"max_workers", `max_workers = 0`, []string{"gateway.max_workers: must be >= 1, got 0"}},
		{"engine_tokens", "[[gateway.engine_tokens]]\nname = \"a\"\ntoken = \"x\"\nworker_ids = [\"e1\", \"bad id\"]\n[[gateway.engine_tokens]]\nname = \"a\"\nworker_ids = [\"e1\"]\n", []string{
			`gateway.engine_tokens[0].worker_ids[1]: "bad id" must match [A-Za-z0-9._:-]{1,128}`,
			`gateway.engine_tokens[1].name: "a" already names engine_tokens[0]`,
			"gateway.engine_tokens[1]: exactly one of token and token_env is required, got none",
			`gateway.engine_tokens[1].worker_ids[0]: "e1" is already in engine_tokens[0]`,
		}},
		{"registry_peer_rate", `registry_peer_rate = -1`, []string{"gateway.registry_peer_rate: must be a finite number >= 0 (0 disables the limit), got -1"}},
		{"registry_peer_burst", `registry_peer_burst = 0`, []string{"gateway.registry_peer_burst: must be >= 1 when registry_peer_rate is set, got 0"}},
		{"engine_networks", `engine_networks = ["10.0.0.0/8", "nope", "10.1.2.3/8"]`, []string{`gateway.engine_networks[1]: must be a CIDR network such as "10.0.0.0/8", got "nope"`, `gateway.engine_networks[2]: "10.1.2.3/8" has host bits set; the network is "10.0.0.0/8"`}},
		{"max_attempts", `max_attempts = -1`, []string{"gateway.max_attempts: must be >= 1, got -1"}},
		{"max_connections", `max_connections = -1`, []string{"gateway.max_connections: must be >= 0 (0: no cap), got -1"}},
		{"max_connections_per_client", `max_connections_per_client = -2`, []string{"gateway.max_connections_per_client: must be >= 0 (0: no cap), got -2"}},
		{"max_body_bytes", `max_body_bytes = 0`, []string{"gateway.max_body_bytes: must be > 0, got 0"}},
		{"tokens_admission", `tokens_admission = "wait"`, []string{`gateway.tokens_admission: must be "refuse" or "clamp", got "wait"`}},
		{"tokens_default_max_tokens", `tokens_default_max_tokens = 0`, []string{"gateway.tokens_default_max_tokens: must be from 1 to 1048576, got 0"}},
		{"state_dir", `state_dir = " "`, []string{"gateway.state_dir: required"}},
		{"timeouts", "connect_timeout = \"-1s\"\nfirst_byte_timeout = \"0s\"\nidle_timeout = \"0s\"\nread_header_timeout = \"0s\"\nserver_idle_timeout = \"0s\"\nshutdown_timeout = \"0s\"", []string{
			"gateway.connect_timeout: must be > 0, got -1s", "gateway.first_byte_timeout: must be > 0, got 0s", "gateway.idle_timeout: must be > 0, got 0s",
			"gateway.read_header_timeout: must be > 0, got 0s", "gateway.server_idle_timeout: must be > 0, got 0s", "gateway.shutdown_timeout: must be > 0, got 0s",
		}},
		{"engine tokens same secret", "[[gateway.engine_tokens]]\nname = \"a\"\ntoken = \"s\"\nworker_ids = [\"e1\"]\n[[gateway.engine_tokens]]\nname = \"b\"\ntoken_env = \"TLGATE_TEST_SET\"\nworker_ids = [\"e2\"]\n[[gateway.engine_tokens]]\nname = \"c\"\ntoken = \"value\"\nworker_ids = [\"e3\"]", []string{
			"gateway.engine_tokens[2]: same secret as engine_tokens[1]"}},
		{"engine token same secret as registry_token", "registry_token = \"s\"\n[[gateway.engine_tokens]]\nname = \"a\"\ntoken = \"s\"\nworker_ids = [\"e1\"]", []string{
			"gateway.engine_tokens[0]: same secret as registry_token"}},
		{"engine token same secret as registry_token_env", "registry_token_env = \"TLGATE_TEST_SET\"\n[[gateway.engine_tokens]]\nname = \"a\"\ntoken = \"value\"\nworker_ids = [\"e1\"]", []string{
			"gateway.engine_tokens[0]: same secret as registry_token_env"}},
		{"engine tokens own secrets", "registry_token = \"r\"\n[[gateway.engine_tokens]]\nname = \"a\"\ntoken = \"s\"\nworker_ids = [\"e1\"]\n[[gateway.engine_tokens]]\nname = \"b\"\ntoken_env = \"TLGATE_TEST_SET\"\nworker_ids = [\"e2\"]", nil},
		{"registry token both", "registry_token = \"t\"\nregistry_token_env = \"TLGATE_TEST_SET\"", []string{"gateway.registry_token_env: cannot be combined with registry_token"}},
		{"registry token env unset", `registry_token_env = "TLGATE_TEST_UNSET"`, []string{"gateway.registry_token_env: environment variable TLGATE_TEST_UNSET is not set"}},
		{"registry token env empty", `registry_token_env = "TLGATE_TEST_EMPTY"`, []string{"gateway.registry_token_env: environment variable TLGATE_TEST_EMPTY is empty"}},
		{"tls cert without key", `tls_cert_file = "` + cert + `"`, []string{"gateway.tls_key_file: required with tls_cert_file"}},
		{"tls key without cert", `tls_key_file = "` + cert + `"`, []string{"gateway.tls_cert_file: required with tls_key_file"}},
		{"tls files exist", "tls_cert_file = \"" + cert + "\"\ntls_key_file = \"" + cert + "\"", nil},
		{"tls key missing", "tls_cert_file = \"" + cert + "\"\ntls_key_file = \"" + missing + "\"", []string{"gateway.tls_key_file: stat " + missing + ": no such file or directory"}},
		{"engine_ca_file is a directory", `engine_ca_file = "` + dir + `"`, []string{`gateway.engine_ca_file: "` + dir + `" is a directory`}},
		{"log_format", `log_format = "text"`, []string{`gateway.log_format: must be "json" or "console", got "text"`}},
		{"console", `log_format = "console"`, nil},
		{"log_flush_interval negative", `log_flush_interval = "-1s"`, []string{`gateway.log_flush_interval: must be from 0 (every line written as it comes) to 10s, got -1s`}},
		{"log_flush_interval too long", `log_flush_interval = "1m"`, []string{`gateway.log_flush_interval: must be from 0 (every line written as it comes) to 10s, got 1m0s`}},
		{"log_flush_interval off", `log_flush_interval = "0s"`, nil},
		{"no keys off loopback", `listen = "0.0.0.0:8080"`, []string{`gateway.api_keys: required when a listener is not on loopback (listen = "0.0.0.0:8080", registry_listen = "127.0.0.1:9090"): without keys auth is off`}},
		{"no keys on every interface", `registry_listen = ":9090"`, []string{`gateway.api_keys: required when a listener is not on loopback (listen = "127.0.0.1:8080", registry_listen = ":9090"): without keys auth is off`}},
		{"keys off loopback", "listen = \"0.0.0.0:8080\"\n[[gateway.api_keys]]\nname = \"a\"\nkey = \"k\"\nscopes = [\"inference\"]", nil},
		{"key source none", "[[gateway.api_keys]]\nname = \"a\"\nscopes = [\"inference\"]", []string{"gateway.api_keys[0]: exactly one of key, key_env, key_sha256 is required, got none"}},
		{"key source two", "[[gateway.api_keys]]\nname = \"a\"\nkey = \"k\"\nkey_sha256 = \"" + hash + "\"\nscopes = [\"inference\"]", []string{"gateway.api_keys[0]: exactly one of key, key_env, key_sha256 is required, got key and key_sha256"}},
		{"key_sha256 short", "[[gateway.api_keys]]\nname = \"a\"\nkey_sha256 = \"abc\"\nscopes = [\"inference\"]", []string{"gateway.api_keys[0].key_sha256: must be 64 hex digits (the SHA-256 of the key), got 3 characters"}},
		{"key_sha256 not hex", "[[gateway.api_keys]]\nname = \"a\"\nkey_sha256 = \"" + strings.Repeat("z", 64) + "\"\nscopes = [\"inference\"]", []string{"gateway.api_keys[0].key_sha256: must be 64 hex digits (the SHA-256 of the key), got 64 characters"}},
		{"key_env unset", "[[gateway.api_keys]]\nname = \"a\"\nkey_env = \"TLGATE_TEST_UNSET\"\nscopes = [\"inference\"]", []string{"gateway.api_keys[0].key_env: environment variable TLGATE_TEST_UNSET is not set"}},
		{"key_env empty", "[[gateway.api_keys]]\nname = \"a\"\nkey_env = \"TLGATE_TEST_EMPTY\"\nscopes = [\"inference\"]", []string{"gateway.api_keys[0].key_env: environment variable TLGATE_TEST_EMPTY is empty"}},
		{"key name required", "[[gateway.api_keys]]\nkey = \"k\"\nscopes = [\"inference\"]", []string{"gateway.api_keys[0].name: required"}},
		{"key names unique", "[[gateway.api_keys]]\nname = \"a\"\nkey = \"k1\"\nscopes = [\"inference\"]\n[[gateway.api_keys]]\nname = \"a\"\nkey = \"k2\"\nscopes = [\"admin\"]", []string{`gateway.api_keys[1].name: "a" already names api_keys[0]`}},
		{"same secret twice", "[[gateway.api_keys]]\nname = \"a\"\nkey_env = \"TLGATE_TEST_SET\"\nscopes = [\"inference\"]\n[[gateway.api_keys]]\nname = \"b\"\nkey_sha256 = \"" + hexSum("value") + "\"\nscopes = [\"admin\"]", []string{"gateway.api_keys[1]: same secret as api_keys[0]"}},
		{"unknown scope", "[[gateway.api_keys]]\nname = \"a\"\nkey = \"k\"\nscopes = [\"inference\", \"root\"]", []string{`gateway.api_keys[0].scopes[1]: unknown scope "root" (want inference, debug, admin or trace)`}},
		{"no scopes", "[[gateway.api_keys]]\nname = \"a\"\nkey = \"k\"", []string{`gateway.api_keys[0].scopes: at least one of "inference", "debug", "admin" required`}},
		{"cache isolation", "[[gateway.api_keys]]\nname = \"a\"\nkey = \"k1\"\nscopes = [\"inference\"]\ncache_isolation = \"key\"\n[[gateway.api_keys]]\nname = \"b\"\nkey = \"k2\"\nscopes = [\"inference\"]\ncache_isolation = \"shared\"\n[[gateway.api_keys]]\nname = \"c\"\nkey = \"k3\"\nscopes = [\"inference\"]\ncache_isolation = \"tenant\"", []string{
			`gateway.api_keys[2].cache_isolation: must be "shared" or "key", got "tenant"`}},
		{"key limits", "[[gateway.api_keys]]\nname = \"a\"\nkey = \"k\"\nscopes = [\"inference\"]\nrequests_per_minute = -1\ntokens_per_minute = 2000000000\nmax_concurrent = 4", []string{
			"gateway.api_keys[0].requests_per_minute: must be from 0 (unlimited) to 1000000000, got -1",
			"gateway.api_keys[0].tokens_per_minute: must be from 0 (unlimited) to 1000000000, got 2000000000"}},
		{"route error prefixed", "[[gateway.routes]]\nmodel = \"a\"\n[[gateway.routes]]\nmodel = \"auto\"\ncascade = [{ model = \"smol\", accept_if = \"mean_logprob => -1.2\" }, { model = \"big\" }]", []string{`gateway.routes[1].cascade[0].accept_if: unknown operator "=>" at column 14 (want > or >=)`}},
		{"routes beyond max_routes", "max_routes = 1\n[[gateway.routes]]\nmodel = \"a\"\nbackends = [{ model = \"x\", weight = 1 }]\n[[gateway.routes]]\nmodel = \"b\"\nbackends = [{ model = \"x\", weight = 1 }]",
			[]string{"gateway.routes: 2 routes, more than gateway.max_routes (1): the store would refuse the table"}},
		{"routes at max_routes", "max_routes = 1\n[[gateway.routes]]\nmodel = \"a\"\nbackends = [{ model = \"x\", weight = 1 }]", nil},
		{"route errors all", "[[gateway.routes]]\nmodel = \"\"\n[[gateway.routes]]\nmodel = \"b\"\nbackends = [{ model = \"x\", weight = 0 }]", []string{"gateway.routes[0].model: required", "gateway.routes[1].backends[0].weight: must be > 0, got 0"}},
		{"engine model discovered", "[[gateway.engines]]\nid = \"v1\"\nhttp_address = \"127.0.0.1:8000\"\nkind = \"vllm\"", nil},
		{"engine ok", "[[gateway.engines]]\nid = \"llama-1\"\nhttp_address = \"127.0.0.1:8081\"\nmodel = \"smol-v3\"\nkind = \"llamacpp\"\nauth_header_env = \"TLGATE_TEST_SET\"", nil},
		{"engine fields", "[[gateway.engines]]\nid = \"bad id\"\nhttp_address = \":8081\"\nmodel = \"a b\"\nkind = \"tgi\"\nprobe_interval = \"-1s\"", []string{
			`gateway.engines[0].id: invalid id "bad id": byte 4 is ' ' (allowed: A-Z a-z 0-9 . _ : -)`,
			`gateway.engines[0].http_address: host required, got ":8081"`,
			`gateway.engines[0].model: invalid model id "a b": byte 2 is ' ' (allowed: A-Z a-z 0-9 . _ : / -)`,
			`gateway.engines[0].kind: must be "vllm", "sglang", "llamacpp" or "openai", got "tgi"`,
			"gateway.engines[0].probe_interval: must be > 0, got -1s",
		}},
		{"engine id long and port zero", "[[gateway.engines]]\nid = \"" + strings.Repeat("e", 129) + "\"\nhttp_address = \"h:0\"\nmodel = \"m\"\nkind = \"vllm\"", []string{
			"gateway.engines[0].id: must be at most 128 bytes, got 129", "gateway.engines[0].http_address: port must be from 1 to 65535, got 0",
		}},
		{"engine ids unique", "[[gateway.engines]]\nid = \"e\"\nhttp_address = \"h:1\"\nmodel = \"m\"\nkind = \"vllm\"\n[[gateway.engines]]\nid = \"e\"\nhttp_address = \"h:2\"\nmodel = \"m\"\nkind = \"sglang\"", []string{
			`gateway.engines[1].id: "e" already names engines[0]`,
		}},
		{"engine roles ok", "[[gateway.engines]]\nid = \"p\"\nhttp_address = \"h:1\"\nkind = \"sglang\"\nrole = \"prefill\"\nbootstrap_port = 9000\n" +
			"[[gateway.engines]]\nid = \"d\"\nhttp_address = \"h:2\"\nkind = \"vllm\"\nrole = \"decode\"", nil},
		{"engine role and bootstrap port", "[[gateway.engines]]\nid = \"p\"\nhttp_address = \"h:1\"\nkind = \"vllm\"\nrole = \"both\"\nbootstrap_port = 9000\n" +
			"[[gateway.engines]]\nid = \"q\"\nhttp_address = \"h:2\"\nkind = \"sglang\"\nrole = \"prefill\"\nbootstrap_port = 70000\n" +
			"[[gateway.engines]]\nid = \"r\"\nhttp_address = \"h:3\"\nkind = \"sglang\"\nbootstrap_port = 8998", []string{
			`gateway.engines[0].role: must be "unified", "prefill" or "decode", got "both"`,
			`gateway.engines[0].bootstrap_port: applies to SGLang prefill engines only (kind = "sglang", role = "prefill"), got kind = "vllm", role = "both"`,
			"gateway.engines[1].bootstrap_port: must be a port number in 1..65535, got 70000",
			`gateway.engines[2].bootstrap_port: applies to SGLang prefill engines only (kind = "sglang", role = "prefill"), got kind = "sglang", role = "unified"`,
		}},
		{"discovery bootstrap keys", "[[gateway.discovery]]\nname = \"sg\"\nkind = \"kubernetes\"\nengine_kind = \"sglang\"\nnamespaces = [\"a\"]\nselector = \"app=sglang\"\nport = 30000\nbootstrap_port = 9000\nbootstrap_port_label = \"tlgate.io/bootstrap-port\"\nbootstrap_port_annotation = \"x/y\"\n" +
			"[[gateway.discovery]]\nname = \"vl\"\nkind = \"kubernetes\"\nengine_kind = \"vllm\"\nnamespaces = [\"a\"]\nservice = \"vllm\"\nport = 8000\nbootstrap_port = 0\nbootstrap_port_label = \"p\"\n" +
			"[[gateway.discovery]]\nname = \"dn\"\nkind = \"dns\"\nengine_kind = \"sglang\"\nhost = \"sg.test\"\nport = 30000\nbootstrap_port = -1\nbootstrap_port_annotation = \"a\"", []string{
			"gateway.discovery[0].bootstrap_port_annotation: cannot be combined with bootstrap_port_label",
			`gateway.discovery[1].bootstrap_port_label: applies to engine_kind = "sglang" only (SGLang's prefill engines), got "vllm"`,
			"gateway.discovery[1].bootstrap_port_label: needs selector: EndpointSlices carry no pod labels or annotations (set model or role for the Service instead)",
			"gateway.discovery[2].bootstrap_port: must be a port number in 1..65535, got -1",
			`gateway.discovery[2].bootstrap_port_annotation: does not apply to kind = "dns"`,
		}},
		{"engine auth both", "[[gateway.engines]]\nid = \"e\"\nhttp_address = \"h:1\"\nmodel = \"m\"\nkind = \"openai\"\nauth_header = \"Bearer x\"\nauth_header_env = \"TLGATE_TEST_SET\"", []string{"gateway.engines[0].auth_header_env: cannot be combined with auth_header"}},
		{"dns source ok", "[[gateway.discovery]]\nname = \"vllm\"\nkind = \"dns\"\nengine_kind = \"vllm\"\nhost = \"vllm.default.svc.cluster.local\"\nport = 8000", nil},
		{"dns srv source ok", "[[gateway.discovery]]\nname = \"vllm\"\nkind = \"dns\"\nengine_kind = \"vllm\"\nhost = \"_http._tcp.vllm.default.svc.cluster.local.\"\nrecord = \"srv\"\nresolver = \"10.96.0.10:53\"", nil},
		{"kubernetes source ok", "[[gateway.discovery]]\nname = \"sg\"\nkind = \"kubernetes\"\nengine_kind = \"sglang\"\nnamespaces = [\"a\", \"b\"]\nselector = \"app=sglang\"\nport = \"http\"\nrole_label = \"tlgate.io/role\"\nmodel_annotation = \"tlgate.io/model\"", nil},
		{"discovery max_engines", "[[gateway.discovery]]\nname = \"vllm\"\nkind = \"dns\"\nengine_kind = \"vllm\"\nhost = \"vllm.test\"\nport = 8000\nmax_engines = -1", []string{
			"gateway.discovery[0].max_engines: must be >= 1, got -1",
		}},
		{"discovery fields", "[[gateway.discovery]]\nname = \"a b\"\nkind = \"consul\"\nengine_kind = \"tgi\"\nscheme = \"ftp\"\nrole = \"both\"", []string{
			`gateway.discovery[0].name: must be 1 to 40 characters of A-Z a-z 0-9 . _ - starting with a letter or digit, got "a b"`,
			`gateway.discovery[0].engine_kind: must be "vllm", "sglang", "llamacpp" or "openai", got "tgi"`,
			`gateway.discovery[0].scheme: must be "http" or "https", got "ftp"`,
			`gateway.discovery[0].role: must be "unified", "prefill" or "decode", got "both"`,
			`gateway.discovery[0].kind: must be "kubernetes", "inferencepool" or "dns", got "consul"`,
		}},
		{"dns source keys", "[[gateway.discovery]]\nname = \"d\"\nkind = \"dns\"\nengine_kind = \"vllm\"\nhost = \"a b\"\nport = \"http\"\nselector = \"app=x\"\ninterval = \"-1s\"", []string{
			`gateway.discovery[0].host: must be a DNS name, got "a b"`,
			`gateway.discovery[0].port: must be a port number in 1..65535 with record = "a", got "http"`,
			"gateway.discovery[0].interval: must be > 0, got -1s",
			`gateway.discovery[0].selector: does not apply to kind = "dns"`,
		}},
		{"kubernetes source keys", "[[gateway.discovery]]\nname = \"k\"\nkind = \"kubernetes\"\nengine_kind = \"vllm\"\nservice = \"vllm\"\nrole_label = \"role\"\nhost = \"x\"", []string{
			"gateway.discovery[0].port: required: the engine port's number or name",
			"gateway.discovery[0].namespaces: required: at least one namespace to watch",
			"gateway.discovery[0].role_label: needs selector: EndpointSlices carry no pod labels or annotations (set model or role for the Service instead)",
			`gateway.discovery[0].host: does not apply to kind = "kubernetes"`,
		}},
		{"kubernetes service or selector", "[[gateway.discovery]]\nname = \"k\"\nkind = \"kubernetes\"\nengine_kind = \"vllm\"\nnamespaces = [\"x\"]\nport = 8000", []string{
			"gateway.discovery[0].service: one of service (watch its EndpointSlices) and selector (watch Pods) is required",
		}},
		{"inferencepool source ok", "[[gateway.discovery]]\nname = \"pool\"\nkind = \"inferencepool\"\nengine_kind = \"vllm\"\nnamespaces = [\"inference\"]\npool = \"vllm-llama3.8b\"\nrole_label = \"tlgate.io/role\"\nmodel_label = \"tlgate.io/model\"", nil},
		{"inferencepool source keys", "[[gateway.discovery]]\nname = \"p\"\nkind = \"inferencepool\"\nengine_kind = \"vllm\"\nnamespaces = [\"a\", \"B\"]\nport = 8000\nselector = \"app=x\"\nmodel_label = \"m\"\nmodel_annotation = \"n\"\ninterval = \"1s\"", []string{
			"gateway.discovery[0].pool: required: the InferencePool's name",
			"gateway.discovery[0].namespaces: must name exactly one namespace, the InferencePool's (its pods are in it), got 2",
			`gateway.discovery[0].namespaces[1]: must be a namespace name (a DNS label), got "B"`,
			`gateway.discovery[0].port: must be left out with kind = "inferencepool": the InferencePool's targetPorts are the engine ports`,
			"gateway.discovery[0].model_annotation: cannot be combined with model_label",
			`gateway.discovery[0].interval: does not apply to kind = "inferencepool"`,
			`gateway.discovery[0].selector: does not apply to kind = "inferencepool"`,
		}},
		{"inferencepool source name", "[[gateway.discovery]]\nname = \"p\"\nkind = \"inferencepool\"\nengine_kind = \"vllm\"\nnamespaces = [\"a\"]\npool = \"Vllm_Pool\"\nhost = \"x\"", []string{
			`gateway.discovery[0].pool: must be an InferencePool name (lower-case letters, digits, '-' and '.', at most 253), got "Vllm_Pool"`,
			`gateway.discovery[0].host: does not apply to kind = "inferencepool"`,
		}},
		{"kubernetes source pool", "[[gateway.discovery]]\nname = \"k\"\nkind = \"kubernetes\"\nengine_kind = \"vllm\"\nnamespaces = [\"x\"]\nselector = \"app=x\"\nport = 8000\npool = \"p\"", []string{
			`gateway.discovery[0].pool: does not apply to kind = "kubernetes"`,
		}},
		{"engine auth env unset", "[[gateway.engines]]\nid = \"e\"\nhttp_address = \"h:1\"\nmodel = \"m\"\nkind = \"openai\"\nauth_header_env = \"TLGATE_TEST_UNSET\"", []string{"gateway.engines[0].auth_header_env: environment variable TLGATE_TEST_UNSET is not set"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := "[gateway]\n" + tc.doc + "\n"
			// Gateway keys must come before the array tables.
			if i := strings.Index(tc.doc, "[["); i > 0 {
				doc = "[gateway]\n" + tc.doc[:i] + "\n" + tc.doc[i:] + "\n"
			}
			c, err := Parse([]byte(doc))
			got := messages(err)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Parse errors\n got %q\nwant %q", got, tc.want)
			}
			if err != nil {
				if c != nil {
					t.Fatal("Parse returned a config with an error")
				}
				var fe *FieldError
				if !errors.Is(err, ErrInvalid) || !errors.As(err, &fe) {
					t.Fatalf("error %v is not a *FieldError wrapping ErrInvalid", err)
				}
			}
		})
	}
}

func hexSum(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:])
}

func TestSecrets(t *testing.T) {
	t.Setenv("TLGATE_TEST_KEY", "s3cret")
	t.Setenv("TLGATE_TEST_TOKEN", "tok")
	sum := sha256.Sum256([]byte("s3cret"))
	for _, k := range []APIKey{
		{Name: "plain", Key: "s3cret"},
		{Name: "env", KeyEnv: "TLGATE_TEST_KEY"},
		{Name: "hash", KeySHA256: hexSum("s3cret")},
		{Name: "HASH", KeySHA256: strings.ToUpper(hexSum("s3cret"))},
	} {
		d, err := k.Digest()
		if err != nil || d != sum {
			t.Errorf("%s: Digest = %x, %v", k.Name, d, err)
		}
	}
	for _, k := range []APIKey{
		{Name: "none"},
		{Name: "two", Key: "a", KeyEnv: "TLGATE_TEST_KEY"},
		{Name: "unset", KeyEnv: "TLGATE_TEST_UNSET"},
		{Name: "short", KeySHA256: "ab"},
	} {
		if _, err := k.Digest(); err == nil {
			t.Errorf("%s: Digest succeeded", k.Name)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error leaks the secret: %v", k.Name, err)
		}
	}

	for _, tc := range []struct {
		g       Gateway
		want    string
		wantErr bool
	}{
		{Gateway{}, "", false},
		{Gateway{RegistryToken: "t"}, "t", false},
		{Gateway{RegistryTokenEnv: "TLGATE_TEST_TOKEN"}, "tok", false},
		{Gateway{RegistryTokenEnv: "TLGATE_TEST_UNSET"}, "", true},
		{Gateway{RegistryToken: "t", RegistryTokenEnv: "TLGATE_TEST_TOKEN"}, "", true},
	} {
		got, err := tc.g.RegistryTokenValue()
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("RegistryTokenValue(%+v) = %q, %v", tc.g, got, err)
		}
	}
	for _, tc := range []struct {
		e       Engine
		want    string
		wantErr bool
	}{
		{Engine{ID: "e"}, "", false},
		{Engine{ID: "e", AuthHeader: "Bearer x"}, "Bearer x", false},
		{Engine{ID: "e", AuthHeaderEnv: "TLGATE_TEST_TOKEN"}, "tok", false},
		{Engine{ID: "e", AuthHeaderEnv: "TLGATE_TEST_UNSET"}, "", true},
		{Engine{ID: "e", AuthHeader: "x", AuthHeaderEnv: "TLGATE_TEST_TOKEN"}, "", true},
	} {
		got, err := tc.e.Authorization()
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("Authorization(%+v) = %q, %v", tc.e, got, err)
		}
	}
}

func TestEngineDefaults(t *testing.T) {
	c, err := Parse([]byte("[[gateway.engines]]\nid = \"a\"\nhttp_address = \"127.0.0.1:8081\"\nmodel = \"m\"\nkind = \"vllm\"\n" +
		"[[gateway.engines]]\nid = \"b\"\nhttp_address = \"engine-b:8000\"\nmodel = \"m\"\nkind = \"sglang\"\nprobe_interval = \"500ms\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Gateway.Engines[0].ProbeInterval.Duration; got != DefaultProbeInterval {
		t.Errorf("default probe_interval = %v", got)
	}
	if got := c.Gateway.Engines[1].ProbeInterval.Duration; got != 500*time.Millisecond {
		t.Errorf("probe_interval = %v", got)
	}
}

func TestAllLoopback(t *testing.T) {
	for _, tc := range []struct {
		listen, registry string
		want             bool
	}{
		{"127.0.0.1:8080", "127.0.0.1:9090", true},
		{"127.1.2.3:8080", "[::1]:9090", true},
		{"localhost:8080", "LOCALHOST:9090", true},
		{"0.0.0.0:8080", "127.0.0.1:9090", false},
		{"127.0.0.1:8080", ":9090", false},
		{"[::]:8080", "127.0.0.1:9090", false},
		{"10.0.0.1:8080", "127.0.0.1:9090", false},
		{"gateway.local:8080", "127.0.0.1:9090", false},
		{"garbage", "127.0.0.1:9090", false},
	} {
		c := Default()
		c.Gateway.Listen, c.Gateway.RegistryListen = tc.listen, tc.registry
		if got := c.AllLoopback(); got != tc.want {
			t.Errorf("AllLoopback(%q, %q) = %v, want %v", tc.listen, tc.registry, got, tc.want)
		}
	}
}

func TestDuration(t *testing.T) {
	var d Duration
	if err := json.Unmarshal([]byte(`"1m30s"`), &d); err != nil || d.Duration != 90*time.Second {
		t.Fatalf("UnmarshalJSON = %v, %v", d, err)
	}
	b, err := json.Marshal(D(1500 * time.Millisecond))
	if err != nil || string(b) != `"1.5s"` {
		t.Fatalf("MarshalJSON = %s, %v", b, err)
	}
	for _, bad := range []string{`90`, `"soon"`, `null x`} {
		if err := json.Unmarshal([]byte(bad), &d); err == nil {
			t.Errorf("UnmarshalJSON(%s) succeeded", bad)
		}
	}
	txt, _ := D(2 * time.Second).MarshalText()
	if string(txt) != "2s" {
		t.Errorf("MarshalText = %s", txt)
	}
}

// TestEveryKeyDocumented checks that configs/README.md and
// configs/example.toml mention every key of the schema.
func TestEveryKeyDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../../configs/README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[Gateway](), reflect.TypeFor[APIKey](), reflect.TypeFor[Engine](), reflect.TypeFor[Discovery](), reflect.TypeFor[EngineToken](), reflect.TypeFor[routes.Route](), reflect.TypeFor[routes.Backend](), reflect.TypeFor[routes.Step](), reflect.TypeFor[Ejection](), reflect.TypeFor[Admission](), reflect.TypeFor[Tracing](), reflect.TypeFor[Store](), reflect.TypeFor[Sync](), reflect.TypeFor[Responses](), reflect.TypeFor[KVEvents](), reflect.TypeFor[Tokenizer](), reflect.TypeFor[TokenizerEndpoint]()} {
		for f := range typ.Fields() {
			key := f.Tag.Get("toml")
			if !strings.Contains(string(readme), "`"+key+"`") {
				t.Errorf("configs/README.md does not document %s.%s", typ.Name(), key)
			}
			if !strings.Contains(string(example), key+" =") && !strings.Contains(string(example), "[[gateway."+key+"]]") && !strings.Contains(string(example), "[gateway."+key+"]") {
				t.Errorf("configs/example.toml does not set %s.%s", typ.Name(), key)
			}
		}
	}
}

func FuzzConfig(f *testing.F) {
	example, err := os.ReadFile(examplePath)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		string(example), "", "[gateway]\nlisten = \"0.0.0.0:1\"\n", "[[gateway.routes]]\nmodel = \"a\"\ncascade = [{model=\"a\", accept_if=\"min_logprob>0\"},{model=\"b\"}]\n",
		"[gateway]\nheartbeat_interval = \"1h\"\naffinity_load_factor = inf\n", "[[gateway.engines]]\nid=\"e\"\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if (c == nil) == (err == nil) {
			t.Fatalf("Parse(%q) = %v, %v: want exactly one of a config and an error", data, c, err)
		}
		if c != nil {
			if err := c.Validate(); err != nil {
				t.Fatalf("a parsed config does not validate again: %v", err)
			}
			if _, err := routes.NewTable(c.Gateway.Routes); err != nil {
				t.Fatalf("a parsed config's routes do not build a table: %v", err)
			}
		}
	})
}

// TestRegistryOpen: the start-up warning's condition, a registry off
// loopback that takes heartbeats with no token at all.
func TestRegistryOpen(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(g *Gateway)
		want bool
	}{
		{"loopback, no token", func(g *Gateway) {}, false},
		{"all interfaces, no token", func(g *Gateway) { g.RegistryListen = ":9090" }, true},
		{"off loopback, token", func(g *Gateway) { g.RegistryListen, g.RegistryToken = "10.0.0.1:9090", "t" }, false},
		{"off loopback, token_env", func(g *Gateway) { g.RegistryListen, g.RegistryTokenEnv = "10.0.0.1:9090", "T" }, false},
		{"off loopback, engine tokens", func(g *Gateway) {
			g.RegistryListen, g.EngineTokens = "10.0.0.1:9090", []EngineToken{{Name: "a", Token: "x", WorkerIDs: []string{"e"}}}
		}, false},
	} {
		g := Default().Gateway
		tc.f(&g)
		if got := g.RegistryOpen(); got != tc.want {
			t.Errorf("%s: RegistryOpen = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestPrefixIndexSettings: the cache_aware_* settings reach the prefix
// index, and the defaults are the index's own.
func TestPrefixIndexSettings(t *testing.T) {
	g := Default().Gateway
	want := prefixindex.Config{ChunkBytes: prefixindex.DefaultChunkBytes, BytesPerToken: prefixindex.DefaultBytesPerToken, MaxRequestShare: prefixindex.DefaultMaxRequestShare}
	if got := g.PrefixIndex(); got != want {
		t.Fatalf("defaults: %+v, want %+v", got, want)
	}
	g.CacheAwareChunkBytes, g.CacheAwareBytesPerToken, g.CacheAwareMaxRequestShare = 64, 3.5, 0.25
	if got := g.PrefixIndex(); got != (prefixindex.Config{ChunkBytes: 64, BytesPerToken: 3.5, MaxRequestShare: 0.25}) {
		t.Fatalf("set: %+v", got)
	}
}
