package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/tlgate/tlgate/internal/routing/routes"
)

// MaxEngineIDLen is the longest engine (worker) id accepted.
const MaxEngineIDLen = 128

// FieldError is one validation error naming its key by its path
// ("gateway.api_keys[0].scopes[1]").
type FieldError struct {
	Key string
	Msg string
}

// Error returns "key: message".
func (e *FieldError) Error() string { return e.Key + ": " + e.Msg }

// Unwrap lets errors.Is(err, ErrInvalid) match.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// Validate checks every key and returns every problem, joined with
// errors.Join; each is a *FieldError such as
// `gateway.affinity_load_factor: must be > 1, got 0.8`. Route table errors
// are those of routes.Validate with "gateway." in front. It reads the
// environment variables that the configuration names (never reporting
// their values).
func (c *Config) Validate() error {
	v := &checker{}
	g := &c.Gateway
	listenOK := v.hostPort("gateway.listen", g.Listen, false, true)
	registryOK := v.hostPort("gateway.registry_listen", g.RegistryListen, false, true)
	if g.Listen != "" && g.Listen == g.RegistryListen && !strings.HasSuffix(g.Listen, ":0") {
		v.add("gateway.registry_listen", "must differ from listen, both are %q", g.Listen)
	}
	switch g.RoutePolicy {
	case PolicyLeastOutstanding, PolicyWeighted, PolicyAffinity, PolicyCacheAware:
	default:
		v.add("gateway.route_policy", "must be %q, %q, %q or %q, got %q", PolicyLeastOutstanding, PolicyWeighted, PolicyAffinity, PolicyCacheAware, g.RoutePolicy)
	}
	validateCacheAware(v, g)
	if !(g.AffinityLoadFactor > 1) || math.IsInf(g.AffinityLoadFactor, 0) {
		v.add("gateway.affinity_load_factor", "must be > 1, got %v", g.AffinityLoadFactor)
	}
	v.positive("gateway.heartbeat_interval", g.HeartbeatInterval)
	if g.HeartbeatMissLimit < 1 {
		v.add("gateway.heartbeat_miss_limit", "must be >= 1, got %d", g.HeartbeatMissLimit)
	}
	if g.MaxAttempts < 1 {
		v.add("gateway.max_attempts", "must be >= 1, got %d", g.MaxAttempts)
	}
	if g.RecentModelWindow.Duration < 0 {
		v.add("gateway.recent_model_window", "must be >= 0, got %v", g.RecentModelWindow.Duration)
	}
	if g.MaxBodyBytes <= 0 {
		v.add("gateway.max_body_bytes", "must be > 0, got %d", g.MaxBodyBytes)
	}
	if g.MaxRoutes < 0 {
		v.add("gateway.max_routes", "must be >= 0 (0: no bound), got %d", g.MaxRoutes)
	}
	if g.MaxTableBytes < 0 {
		v.add("gateway.max_table_bytes", "must be >= 0 (0: no bound), got %d", g.MaxTableBytes)
	}
	switch g.TokensAdmission {
	case TokensRefuse, TokensClamp:
	default:
		v.add("gateway.tokens_admission", "must be %q or %q, got %q", TokensRefuse, TokensClamp, g.TokensAdmission)
	}
	if g.TokensDefaultMaxTokens < 1 || g.TokensDefaultMaxTokens > MaxDefaultMaxTokens {
		v.add("gateway.tokens_default_max_tokens", "must be from 1 to %d, got %d", MaxDefaultMaxTokens, g.TokensDefaultMaxTokens)
	}
	if strings.TrimSpace(g.StateDir) == "" {
		v.add("gateway.state_dir", "required")
	}
	v.positive("gateway.connect_timeout", g.ConnectTimeout)
	v.positive("gateway.first_byte_timeout", g.FirstByteTimeout)
	v.positive("gateway.idle_timeout", g.IdleTimeout)
	v.positive("gateway.read_header_timeout", g.ReadHeaderTimeout)
	v.positive("gateway.read_body_timeout", g.ReadBodyTimeout)
	v.positive("gateway.server_idle_timeout", g.ServerIdleTimeout)
	v.positive("gateway.shutdown_timeout", g.ShutdownTimeout)
	if g.ShutdownDelay.Duration < 0 {
		v.add("gateway.shutdown_delay", "must be >= 0, got %v", g.ShutdownDelay.Duration)
	}
	if g.MaxConnections < 0 {
		v.add("gateway.max_connections", "must be >= 0 (0: no cap), got %d", g.MaxConnections)
	}
	if g.MaxConnectionsPerClient < 0 {
		v.add("gateway.max_connections_per_client", "must be >= 0 (0: no cap), got %d", g.MaxConnectionsPerClient)
	}

	switch {
	case g.RegistryToken != "" && g.RegistryTokenEnv != "":
		v.add("gateway.registry_token_env", "cannot be combined with registry_token")
	case g.RegistryTokenEnv != "":
		if _, err := envValue(g.RegistryTokenEnv); err != nil {
			v.add("gateway.registry_token_env", "%s", err)
		}
	}

	v.together("gateway.tls_cert_file", g.TLSCertFile, "gateway.tls_key_file", g.TLSKeyFile)
	v.file("gateway.tls_cert_file", g.TLSCertFile)
	v.file("gateway.tls_key_file", g.TLSKeyFile)
	v.file("gateway.engine_ca_file", g.EngineCAFile)

	switch g.LogFormat {
	case LogJSON, LogConsole:
	default:
		v.add("gateway.log_format", "must be %q or %q, got %q", LogJSON, LogConsole, g.LogFormat)
	}
	if d := g.LogFlushInterval.Duration; d < 0 || d > MaxLogFlushInterval {
		v.add("gateway.log_flush_interval", "must be from 0 (every line written as it comes) to %v, got %v", MaxLogFlushInterval, d)
	}

	v.apiKeys(g.APIKeys)
	if len(g.APIKeys) == 0 && listenOK && registryOK && !c.AllLoopback() {
		v.add("gateway.api_keys", "required when a listener is not on loopback (listen = %q, registry_listen = %q): without keys auth is off", g.Listen, g.RegistryListen)
	}

	if err := routes.Validate(g.Routes); err != nil {
		v.routeErrors(err)
	}
	if g.MaxRoutes > 0 && len(g.Routes) > g.MaxRoutes {
		v.add("gateway.routes", "%d routes, more than gateway.max_routes (%d): the store would refuse the table", len(g.Routes), g.MaxRoutes)
	}
	v.engines(g.Engines)
	v.discovery(g.Discovery)
	v.registryLimits(g)
	v.store(&g.Store)
	v.overload(g.Ejection, g.Admission)
	v.tracing(g.Tracing)
	v.sync(&g.Sync)
	v.responses(g.Responses)
	v.kvEvents(g.KVEvents)
	v.tokenizer(g.Tokenizer, g.EngineNetworkPrefixes())
	return errors.Join(v.errs...)
}

// AllLoopback reports whether both listeners are on a loopback address
// (127.0.0.0/8, ::1 or localhost). An empty host means every interface,
// which is not loopback.
func (c *Config) AllLoopback() bool {
	return isLoopback(c.Gateway.Listen) && isLoopback(c.Gateway.RegistryListen)
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

type checker struct{ errs []error }

func (v *checker) add(key, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Key: key, Msg: fmt.Sprintf(format, args...)})
}

func (v *checker) positive(key string, d Duration) {
	if d.Duration <= 0 {
		v.add(key, "must be > 0, got %s", d.Duration)
	}
}

// hostPort checks a host:port address and reports whether it is valid. A
// listener may leave the host empty (every interface) and use port 0 (any
// free port); an engine address may not.
func (v *checker) hostPort(key, addr string, needHost, allowPortZero bool) bool {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		v.add(key, "want host:port, got %q", addr)
		return false
	}
	p, err := strconv.Atoi(port)
	switch {
	case err != nil || p < 0 || p > 65535:
		v.add(key, "port must be a number from 0 to 65535, got %q", port)
		return false
	case p == 0 && !allowPortZero:
		v.add(key, "port must be from 1 to 65535, got 0")
		return false
	}
	if host == "" {
		if needHost {
			v.add(key, "host required, got %q", addr)
			return false
		}
		return true
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		if !(c == '.' || c == '-' || c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			v.add(key, "invalid host %q", host)
			return false
		}
	}
	return true
}

// file checks that a configured file exists and is not a directory.
// together reports a pair of keys that must be set both or neither (a
// certificate and its key), naming the one missing.
func (v *checker) together(keyA, a, keyB, b string) {
	base := func(k string) string { return k[strings.LastIndexByte(k, '.')+1:] }
	switch {
	case a != "" && b == "":
		v.add(keyB, "required with %s", base(keyA))
	case b != "" && a == "":
		v.add(keyA, "required with %s", base(keyB))
	}
}

func (v *checker) file(key, path string) {
	if path == "" {
		return
	}
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		v.add(key, "%s", err)
	case fi.IsDir():
		v.add(key, "%q is a directory", path)
	}
}

func (v *checker) apiKeys(keys []APIKey) {
	names := map[string]int{}
	digests := map[[sha256.Size]byte]int{}
	for i, k := range keys {
		at := fmt.Sprintf("gateway.api_keys[%d]", i)
		if strings.TrimSpace(k.Name) == "" {
			v.add(at+".name", "required")
		} else if j, dup := names[k.Name]; dup {
			v.add(at+".name", "%q already names api_keys[%d]", k.Name, j)
		} else {
			names[k.Name] = i
		}

		var given []string
		for _, f := range []struct{ name, val string }{{"key", k.Key}, {"key_env", k.KeyEnv}, {"key_sha256", k.KeySHA256}} {
			if f.val != "" {
				given = append(given, f.name)
			}
		}
		ok := false
		switch len(given) {
		case 0:
			v.add(at, "exactly one of key, key_env, key_sha256 is required, got none")
		case 1:
			ok = true
			switch {
			case k.KeyEnv != "":
				if _, err := envValue(k.KeyEnv); err != nil {
					v.add(at+".key_env", "%s", err)
					ok = false
				}
			case k.KeySHA256 != "":
				if b, err := hex.DecodeString(k.KeySHA256); err != nil || len(b) != sha256.Size {
					v.add(at+".key_sha256", "must be %d hex digits (the SHA-256 of the key), got %d characters", 2*sha256.Size, len(k.KeySHA256))
					ok = false
				}
			}
		default:
			v.add(at, "exactly one of key, key_env, key_sha256 is required, got %s", strings.Join(given, " and "))
		}
		if ok {
			if d, err := k.Digest(); err == nil {
				if j, dup := digests[d]; dup {
					v.add(at, "same secret as api_keys[%d]", j)
				} else {
					digests[d] = i
				}
			}
		}

		if len(k.Scopes) == 0 {
			v.add(at+".scopes", "at least one of %q, %q, %q required", ScopeInference, ScopeDebug, ScopeAdmin)
		}
		for j, s := range k.Scopes {
			switch s {
			case ScopeInference, ScopeDebug, ScopeAdmin, ScopeTrace:
			default:
				v.add(fmt.Sprintf("%s.scopes[%d]", at, j), "unknown scope %q (want %s, %s, %s or %s)", s, ScopeInference, ScopeDebug, ScopeAdmin, ScopeTrace)
			}
		}
		v.keyLimit(at+".requests_per_minute", k.RequestsPerMinute)
		v.keyLimit(at+".tokens_per_minute", k.TokensPerMinute)
		v.keyLimit(at+".max_concurrent", k.MaxConcurrent)
		switch k.CacheIsolation {
		case "", CacheShared, CacheIsolationKey:
		default:
			v.add(at+".cache_isolation", "must be %q or %q, got %q", CacheShared, CacheIsolationKey, k.CacheIsolation)
		}
		v.keyClass(at, k)
	}
}

// keyClass checks a key's priorities and objective.
func (v *checker) keyClass(at string, k APIKey) {
	for _, p := range []struct {
		name string
		val  *int
	}{{"priority", k.Priority}, {"max_priority", k.MaxPriority}} {
		if p.val != nil && (*p.val < -routes.MaxPriority || *p.val > routes.MaxPriority) {
			v.add(at+"."+p.name, "must be from %d to %d, got %d", -routes.MaxPriority, routes.MaxPriority, *p.val)
		}
	}
	if k.Priority != nil && k.MaxPriority != nil && *k.Priority > *k.MaxPriority {
		v.add(at+".priority", "must be <= max_priority (%d), got %d", *k.MaxPriority, *k.Priority)
	}
	if k.TTFTObjectiveMs < 0 || k.TTFTObjectiveMs > routes.MaxTTFTObjectiveMs {
		v.add(at+".ttft_objective_ms", "must be from 0 (none) to %d, got %d", routes.MaxTTFTObjectiveMs, k.TTFTObjectiveMs)
	}
}

// MaxKeyLimit is the largest per-key limit (requests_per_minute,
// tokens_per_minute, max_concurrent) accepted.
const MaxKeyLimit = 1_000_000_000

// keyLimit checks one per-key limit: 0 (unlimited) to MaxKeyLimit.
func (v *checker) keyLimit(key string, n int) {
	if n < 0 || n > MaxKeyLimit {
		v.add(key, "must be from 0 (unlimited) to %d, got %d", MaxKeyLimit, n)
	}
}

// routeErrors adds the route table's errors with "gateway." in front.
func (v *checker) routeErrors(err error) {
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	for _, e := range list {
		var fe *routes.FieldError
		if errors.As(e, &fe) {
			v.add("gateway."+fe.Path, "%s", fe.Msg)
		} else {
			v.add("gateway.routes", "%s", e)
		}
	}
}

func (v *checker) engines(es []Engine) {
	ids := map[string]int{}
	for i, e := range es {
		at := fmt.Sprintf("gateway.engines[%d]", i)
		if err := checkEngineID(e.ID); err != nil {
			v.add(at+".id", "%s", err)
		} else if j, dup := ids[e.ID]; dup {
			v.add(at+".id", "%q already names engines[%d]", e.ID, j)
		} else {
			ids[e.ID] = i
		}
		v.hostPort(at+".http_address", e.HTTPAddress, true, false)
		if e.Model != "" { // empty: discovered from the engine's GET /v1/models
			if err := routes.CheckModelID(e.Model); err != nil {
				v.add(at+".model", "%s", err)
			}
		}
		switch e.Kind {
		case KindVLLM, KindSGLang, KindLlamaCPP, KindOpenAI:
		default:
			v.add(at+".kind", "must be %q, %q, %q or %q, got %q", KindVLLM, KindSGLang, KindLlamaCPP, KindOpenAI, e.Kind)
		}
		if e.ProbeInterval.Duration < 0 {
			v.add(at+".probe_interval", "must be > 0, got %s", e.ProbeInterval.Duration)
		}
		v.engineRole(at, e.Kind, e.Role, e.BootstrapPort)
		v.kvEndpoints(at, e)
		switch {
		case e.AuthHeader != "" && e.AuthHeaderEnv != "":
			v.add(at+".auth_header_env", "cannot be combined with auth_header")
		case e.AuthHeaderEnv != "":
			if _, err := envValue(e.AuthHeaderEnv); err != nil {
				v.add(at+".auth_header_env", "%s", err)
			}
		}
	}
}

// engineRole checks an engine's role and bootstrap port: the port is an
// SGLang prefill engine's, a TCP port when set.
func (v *checker) engineRole(at, kind, role string, bootstrapPort int) {
	switch role {
	case "", RoleUnified, RolePrefill, RoleDecode:
	default:
		v.add(at+".role", "must be %q, %q or %q, got %q", RoleUnified, RolePrefill, RoleDecode, role)
	}
	switch {
	case bootstrapPort == 0:
	case bootstrapPort < 1 || bootstrapPort > 65535:
		v.add(at+".bootstrap_port", "must be a port number in 1..65535, got %d", bootstrapPort)
	case kind != KindSGLang || role != RolePrefill:
		v.add(at+".bootstrap_port", "applies to SGLang prefill engines only (kind = %q, role = %q), got kind = %q, role = %q", KindSGLang, RolePrefill, kind, roleOrUnified(role))
	}
}

// roleOrUnified is role, "unified" when empty.
func roleOrUnified(role string) string {
	if role == "" {
		return RoleUnified
	}
	return role
}

// checkEngineID reports whether id is a valid worker id:
// [A-Za-z0-9._:-]{1,128}.
func checkEngineID(id string) error {
	if id == "" {
		return errors.New("required")
	}
	if len(id) > MaxEngineIDLen {
		return fmt.Errorf("must be at most %d bytes, got %d", MaxEngineIDLen, len(id))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c == '.' || c == '_' || c == ':' || c == '-' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return fmt.Errorf("invalid id %q: byte %d is %q (allowed: A-Z a-z 0-9 . _ : -)", id, i+1, c)
		}
	}
	return nil
}
