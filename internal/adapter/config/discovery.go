package config

import (
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Discovery source kinds (gateway.discovery[].kind).
const (
	DiscoveryKubernetes    = "kubernetes"
	DiscoveryInferencePool = "inferencepool"
	DiscoveryDNS           = "dns"
)

// DNS record kinds (gateway.discovery[].record).
const (
	RecordA   = "a"   // A and AAAA: addresses, the port from port
	RecordSRV = "srv" // SRV: targets and their ports
)

// Engine roles (gateway.discovery[].role and the values of role_label).
const (
	RoleUnified = "unified"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// The defaults of a discovery source.
const (
	DefaultDiscoveryInterval = 5 * time.Second
	DefaultDiscoveryDrain    = 30 * time.Second
	// DefaultDiscoveryMaxEngines is a source's max_engines: as many as
	// max_workers lets register by heartbeat.
	DefaultDiscoveryMaxEngines = 1024
)

// Discovery is one [[gateway.discovery]] source: a place engines that do
// not heartbeat are found (the Kubernetes API, or DNS). Every engine found
// is probed like a [[gateway.engines]] entry of kind EngineKind.
type Discovery struct {
	// Name identifies the source; its engines' worker ids start with it.
	Name string `toml:"name"`
	// Kind is kubernetes, inferencepool or dns.
	Kind string `toml:"kind"`
	// EngineKind is vllm, sglang, llamacpp or openai, as an engine's kind.
	EngineKind string `toml:"engine_kind"`
	// Port is the engine port: a number, or (kubernetes) a port name.
	// An InferencePool gives its own (its target ports).
	Port Port `toml:"port"`
	// Scheme is http or https.
	Scheme string `toml:"scheme"`
	// Model, when set, is the model every engine found serves; otherwise
	// the model comes from ModelLabel, ModelAnnotation or /v1/models.
	Model string `toml:"model"`
	// Role is the role of every engine found (unified, prefill, decode)
	// unless RoleLabel says otherwise.
	Role string `toml:"role"`
	// MaxEngines caps the engines the source reports: past it, the
	// addresses it found last are left out (logged, and counted in
	// tlgate_discovery_addresses_dropped{reason="cap"}).
	MaxEngines int `toml:"max_engines"`
	// ProbeInterval, AuthHeader and AuthHeaderEnv are as for an engine.
	ProbeInterval Duration `toml:"probe_interval"`
	AuthHeader    string   `toml:"auth_header"`
	AuthHeaderEnv string   `toml:"auth_header_env"`

	// Kubeconfig is a kubeconfig file; empty means the in-cluster config.
	Kubeconfig string `toml:"kubeconfig"`
	// Namespaces are watched (at least one with kind kubernetes; the
	// pool's, exactly one, with kind inferencepool).
	Namespaces []string `toml:"namespaces"`
	// Service names the Service whose EndpointSlices are watched; Selector
	// is a label selector for Pods instead. Exactly one of the two.
	Service  string `toml:"service"`
	Selector string `toml:"selector"`
	// Pool names the InferencePool (inference.networking.k8s.io/v1) whose
	// pods are served (kind inferencepool): its selector picks them and its
	// target ports are their engine ports.
	Pool string `toml:"pool"`
	// ModelLabel and ModelAnnotation name a pod label or annotation holding
	// the model id; RoleLabel a pod label holding the role (Selector or
	// Pool only).
	ModelLabel      string `toml:"model_label"`
	ModelAnnotation string `toml:"model_annotation"`
	RoleLabel       string `toml:"role_label"`
	// BootstrapPort is the bootstrap port of every SGLang prefill engine
	// found (engine_kind sglang; 0: SGLang's default, 8998) unless
	// BootstrapPortLabel or BootstrapPortAnnotation, a pod label or
	// annotation holding it (Selector or Pool only), says otherwise.
	BootstrapPort           int    `toml:"bootstrap_port"`
	BootstrapPortLabel      string `toml:"bootstrap_port_label"`
	BootstrapPortAnnotation string `toml:"bootstrap_port_annotation"`

	// Host is the DNS name resolved (kind dns).
	Host string `toml:"host"`
	// Record is a (A and AAAA) or srv.
	Record string `toml:"record"`
	// Interval is how often Host is resolved.
	Interval Duration `toml:"interval"`
	// Resolver, when set, is the DNS server (host:port) asked instead of
	// the system's.
	Resolver string `toml:"resolver"`
	// DrainPeriod is how long an address gone from DNS keeps draining
	// (routed nothing new) before its engine is forgotten.
	DrainPeriod Duration `toml:"drain_period"`

	// KVEventsPort is the port of every engine's KV events PUB socket, on
	// the engine's host (0: they publish none); KVEventsReplayPort its
	// replay socket's (0: none), KVEventsTopic its topic.
	KVEventsPort       int    `toml:"kv_events_port"`
	KVEventsReplayPort int    `toml:"kv_events_replay_port"`
	KVEventsTopic      string `toml:"kv_events_topic"`
}

// Port is a port number or, for Kubernetes, a port name; in TOML an
// integer or a string.
type Port string

// UnmarshalTOML accepts an integer or a string.
func (p *Port) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case int64:
		*p = Port(strconv.FormatInt(x, 10))
	case string:
		*p = Port(x)
	default:
		return fmt.Errorf("want a port number or name, got %T", v)
	}
	return nil
}

// Number returns the port as a number, or 0 when it is a name or unset.
func (p Port) Number() int {
	n, err := strconv.Atoi(string(p))
	if err != nil || n < 1 || n > 65535 {
		return 0
	}
	return n
}

// portName is an IANA service name as Kubernetes port names are.
var portName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$`)

// labelKey is a Kubernetes label or annotation key: an optional DNS prefix
// and a name.
var labelKey = regexp.MustCompile(`^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// dnsName is a DNS name (an optional trailing dot).
var dnsName = regexp.MustCompile(`^([A-Za-z0-9_]([-A-Za-z0-9_]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9_]([-A-Za-z0-9_]{0,61}[A-Za-z0-9])?\.?$`)

// sourceName is what a source's name may be: a worker id prefix.
var sourceName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$`)

// withDiscoveryDefaults fills the defaults a source's keys have.
func (d *Discovery) withDiscoveryDefaults() {
	if d.Scheme == "" {
		d.Scheme = "http"
	}
	if d.Role == "" {
		d.Role = RoleUnified
	}
	if d.ProbeInterval.Duration == 0 {
		d.ProbeInterval = D(DefaultProbeInterval)
	}
	if d.MaxEngines == 0 {
		d.MaxEngines = DefaultDiscoveryMaxEngines
	}
	if d.Kind == DiscoveryDNS {
		if d.Record == "" {
			d.Record = RecordA
		}
		if d.Interval.Duration == 0 {
			d.Interval = D(DefaultDiscoveryInterval)
		}
		if d.DrainPeriod.Duration == 0 {
			d.DrainPeriod = D(DefaultDiscoveryDrain)
		}
	}
}

// Authorization returns the Authorization header for the source's engines:
// AuthHeader, or the value of AuthHeaderEnv (read now).
func (d Discovery) Authorization() (string, error) {
	if d.AuthHeaderEnv != "" {
		v, err := envValue(d.AuthHeaderEnv)
		if err != nil {
			return "", fmt.Errorf("config: discovery %q: auth_header_env: %w", d.Name, err)
		}
		return v, nil
	}
	return d.AuthHeader, nil
}

func (v *checker) discovery(ds []Discovery) {
	names := map[string]int{}
	for i, d := range ds {
		at := fmt.Sprintf("gateway.discovery[%d]", i)
		switch {
		case !sourceName.MatchString(d.Name):
			v.add(at+".name", "must be 1 to 40 characters of A-Z a-z 0-9 . _ - starting with a letter or digit, got %q", d.Name)
		default:
			if j, dup := names[d.Name]; dup {
				v.add(at+".name", "%q already names discovery[%d]", d.Name, j)
			}
			names[d.Name] = i
		}
		v.kvPorts(at, d)
		switch d.EngineKind {
		case KindVLLM, KindSGLang, KindLlamaCPP, KindOpenAI:
		default:
			v.add(at+".engine_kind", "must be %q, %q, %q or %q, got %q", KindVLLM, KindSGLang, KindLlamaCPP, KindOpenAI, d.EngineKind)
		}
		if d.Scheme != "http" && d.Scheme != "https" {
			v.add(at+".scheme", "must be \"http\" or \"https\", got %q", d.Scheme)
		}
		if d.Model != "" {
			if err := routes.CheckModelID(d.Model); err != nil {
				v.add(at+".model", "%s", err)
			}
		}
		switch d.Role {
		case RoleUnified, RolePrefill, RoleDecode:
		default:
			v.add(at+".role", "must be %q, %q or %q, got %q", RoleUnified, RolePrefill, RoleDecode, d.Role)
		}
		v.bootstrapKeys(at, d)
		if d.ProbeInterval.Duration < 0 {
			v.add(at+".probe_interval", "must be > 0, got %s", d.ProbeInterval.Duration)
		}
		if d.MaxEngines < 1 {
			v.add(at+".max_engines", "must be >= 1, got %d", d.MaxEngines)
		}
		switch {
		case d.AuthHeader != "" && d.AuthHeaderEnv != "":
			v.add(at+".auth_header_env", "cannot be combined with auth_header")
		case d.AuthHeaderEnv != "":
			if _, err := envValue(d.AuthHeaderEnv); err != nil {
				v.add(at+".auth_header_env", "%s", err)
			}
		}
		switch d.Kind {
		case DiscoveryKubernetes:
			v.kubernetesSource(at, d)
		case DiscoveryInferencePool:
			v.inferencePoolSource(at, d)
		case DiscoveryDNS:
			v.dnsSource(at, d)
		default:
			v.add(at+".kind", "must be %q, %q or %q, got %q", DiscoveryKubernetes, DiscoveryInferencePool, DiscoveryDNS, d.Kind)
		}
	}
}

func (v *checker) kubernetesSource(at string, d Discovery) {
	if d.Port == "" {
		v.add(at+".port", "required: the engine port's number or name")
	} else if d.Port.Number() == 0 && !portName.MatchString(string(d.Port)) {
		v.add(at+".port", "must be a number in 1..65535 or a port name (lower-case letters, digits, '-', at most 15), got %q", d.Port)
	}
	if len(d.Namespaces) == 0 {
		v.add(at+".namespaces", "required: at least one namespace to watch")
	}
	v.namespaces(at, d.Namespaces)
	switch {
	case d.Service == "" && d.Selector == "":
		v.add(at+".service", "one of service (watch its EndpointSlices) and selector (watch Pods) is required")
	case d.Service != "" && d.Selector != "":
		v.add(at+".selector", "cannot be combined with service")
	case d.Service != "" && !dnsLabel.MatchString(d.Service):
		v.add(at+".service", "must be a Service name (a DNS label), got %q", d.Service)
	case d.Selector != "" && strings.TrimSpace(d.Selector) == "":
		v.add(at+".selector", "must not be blank")
	}
	v.podKeys(at, d, d.Service != "")
	v.file(at+".kubeconfig", d.Kubeconfig)
	v.notFor(at, "kubernetes", map[string]bool{"pool": d.Pool != "", "host": d.Host != "", "record": d.Record != "", "interval": d.Interval.Duration != 0, "resolver": d.Resolver != "", "drain_period": d.DrainPeriod.Duration != 0})
}

// namespaces checks a source's namespaces: names, none twice.
func (v *checker) namespaces(at string, nss []string) {
	seen := map[string]bool{}
	for j, ns := range nss {
		if !dnsLabel.MatchString(ns) {
			v.add(fmt.Sprintf("%s.namespaces[%d]", at, j), "must be a namespace name (a DNS label), got %q", ns)
		} else if seen[ns] {
			v.add(fmt.Sprintf("%s.namespaces[%d]", at, j), "%q is listed twice", ns)
		}
		seen[ns] = true
	}
}

// podKeys checks the keys that read pod labels and annotations; service
// says the source watches EndpointSlices, which carry none.
func (v *checker) podKeys(at string, d Discovery, service bool) {
	for _, kv := range [][2]string{{"model_label", d.ModelLabel}, {"model_annotation", d.ModelAnnotation}, {"role_label", d.RoleLabel},
		{"bootstrap_port_label", d.BootstrapPortLabel}, {"bootstrap_port_annotation", d.BootstrapPortAnnotation}} {
		key, val := kv[0], kv[1]
		switch {
		case val == "":
		case service:
			v.add(at+"."+key, "needs selector: EndpointSlices carry no pod labels or annotations (set model or role for the Service instead)")
		case !labelKey.MatchString(val):
			v.add(at+"."+key, "must be a label or annotation key such as \"example.com/model\", got %q", val)
		}
	}
	if d.ModelLabel != "" && d.ModelAnnotation != "" {
		v.add(at+".model_annotation", "cannot be combined with model_label")
	}
	if d.Model != "" && (d.ModelLabel != "" || d.ModelAnnotation != "") {
		v.add(at+".model", "cannot be combined with model_label or model_annotation")
	}
}

// objectName is a Kubernetes object name (a DNS subdomain), as an
// InferencePool's.
var objectName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

func (v *checker) inferencePoolSource(at string, d Discovery) {
	switch {
	case d.Pool == "":
		v.add(at+".pool", "required: the InferencePool's name")
	case len(d.Pool) > 253 || !objectName.MatchString(d.Pool):
		v.add(at+".pool", "must be an InferencePool name (lower-case letters, digits, '-' and '.', at most 253), got %q", d.Pool)
	}
	if len(d.Namespaces) != 1 {
		v.add(at+".namespaces", "must name exactly one namespace, the InferencePool's (its pods are in it), got %d", len(d.Namespaces))
	}
	v.namespaces(at, d.Namespaces)
	if d.Port != "" {
		v.add(at+".port", "must be left out with kind = %q: the InferencePool's targetPorts are the engine ports", DiscoveryInferencePool)
	}
	v.podKeys(at, d, false)
	v.file(at+".kubeconfig", d.Kubeconfig)
	v.notFor(at, DiscoveryInferencePool, map[string]bool{"service": d.Service != "", "selector": d.Selector != "", "host": d.Host != "", "record": d.Record != "",
		"interval": d.Interval.Duration != 0, "resolver": d.Resolver != "", "drain_period": d.DrainPeriod.Duration != 0})
}

// dnsLabel is an RFC 1123 label, as Kubernetes names namespaces and
// Services.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

func (v *checker) dnsSource(at string, d Discovery) {
	if d.Host == "" {
		v.add(at+".host", "required: the DNS name to resolve")
	} else if !dnsName.MatchString(d.Host) || len(d.Host) > 254 {
		v.add(at+".host", "must be a DNS name, got %q", d.Host)
	}
	switch d.Record {
	case RecordA:
		if d.Port.Number() == 0 {
			v.add(at+".port", "must be a port number in 1..65535 with record = \"a\", got %q", d.Port)
		}
	case RecordSRV:
		if d.Port != "" {
			v.add(at+".port", "must be left out with record = \"srv\": the SRV records give the ports")
		}
	default:
		v.add(at+".record", "must be %q (A and AAAA) or %q, got %q", RecordA, RecordSRV, d.Record)
	}
	v.positive(at+".interval", d.Interval)
	v.positive(at+".drain_period", d.DrainPeriod)
	if d.Resolver != "" {
		if _, _, err := net.SplitHostPort(d.Resolver); err != nil {
			v.add(at+".resolver", "must be host:port of a DNS server, got %q", d.Resolver)
		}
	}
	v.notFor(at, "dns", map[string]bool{"kubeconfig": d.Kubeconfig != "", "namespaces": len(d.Namespaces) > 0, "service": d.Service != "", "pool": d.Pool != "",
		"selector": d.Selector != "", "model_label": d.ModelLabel != "", "model_annotation": d.ModelAnnotation != "", "role_label": d.RoleLabel != "",
		"bootstrap_port_label": d.BootstrapPortLabel != "", "bootstrap_port_annotation": d.BootstrapPortAnnotation != ""})
}

// bootstrapKeys checks a source's bootstrap port keys, which only SGLang
// engines have.
func (v *checker) bootstrapKeys(at string, d Discovery) {
	if d.BootstrapPort != 0 && (d.BootstrapPort < 1 || d.BootstrapPort > 65535) {
		v.add(at+".bootstrap_port", "must be a port number in 1..65535, got %d", d.BootstrapPort)
	}
	if d.BootstrapPortLabel != "" && d.BootstrapPortAnnotation != "" {
		v.add(at+".bootstrap_port_annotation", "cannot be combined with bootstrap_port_label")
	}
	if d.EngineKind == KindSGLang {
		return
	}
	for _, kv := range []struct {
		key string
		set bool
	}{{"bootstrap_port", d.BootstrapPort != 0}, {"bootstrap_port_label", d.BootstrapPortLabel != ""}, {"bootstrap_port_annotation", d.BootstrapPortAnnotation != ""}} {
		if kv.set {
			v.add(at+"."+kv.key, "applies to engine_kind = %q only (SGLang's prefill engines), got %q", KindSGLang, d.EngineKind)
		}
	}
}

// notFor reports each key set that a source of kind does not use.
func (v *checker) notFor(at, kind string, set map[string]bool) {
	for _, key := range slices.Sorted(maps.Keys(set)) {
		if set[key] {
			v.add(at+"."+key, "does not apply to kind = %q", kind)
		}
	}
}
