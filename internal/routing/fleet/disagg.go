package fleet

import (
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Protocol is how a prefill worker hands a prompt's KV to a decode worker,
// and so how the gateway drives a pair of them.
type Protocol string

// The disaggregation protocols the gateway drives.
const (
	// ProtocolTLGate is tlgate's own contract: tl.engine.v1 Prefill on the
	// prefill worker, which pushes the KV to the decode worker's tl.kv.v1
	// address, then the decode worker's HTTP surface with X-TL-KV-Handle.
	// Every worker that heartbeats speaks it.
	ProtocolTLGate Protocol = "tlgate"
	// ProtocolVLLM is vLLM's KV connector proxy protocol (NixlConnector and
	// the connectors that follow it): the prefill engine is asked with
	// kv_transfer_params {do_remote_decode: true}, max_tokens 1 and no
	// stream, and its answer's kv_transfer_params go to the decode engine
	// with the client's request.
	ProtocolVLLM Protocol = "vllm"
	// ProtocolSGLang is SGLang's bootstrap rooms: the same request goes at
	// once to the prefill and the decode engine with the prefill engine's
	// bootstrap_host and bootstrap_port and a random bootstrap_room.
	ProtocolSGLang Protocol = "sglang"
)

// DefaultBootstrapPort is an SGLang prefill engine's bootstrap port when
// none is configured (SGLang's --disaggregation-bootstrap-port default).
const DefaultBootstrapPort = 8998

// Protocol returns the disaggregation protocol w speaks, and false when it
// speaks none: a worker that heartbeats speaks tlgate's contract; a probed
// engine speaks its kind's (vllm, sglang); other probed kinds (llamacpp,
// openai) none.
func (w *Worker) Protocol() (Protocol, bool) {
	if w.Source != SourceProbe {
		return ProtocolTLGate, true
	}
	switch Protocol(w.Kind) {
	case ProtocolVLLM:
		return ProtocolVLLM, true
	case ProtocolSGLang:
		return ProtocolSGLang, true
	}
	return "", false
}

// Pairs reports whether a prefill worker p and a decode worker d can form
// a disaggregated pair: both speak the same protocol and, for tlgate's
// contract, lay their KV blocks out alike (kv_format). Engines of two
// kinds never pair: neither reads the other's KV.
func Pairs(p, d *Worker) bool {
	pp, ok := p.Protocol()
	if !ok {
		return false
	}
	dp, ok := d.Protocol()
	return ok && pp == dp && (pp != ProtocolTLGate || p.KVFormat == d.KVFormat)
}

// PairKey is what two workers that pair share: their protocol and, for
// tlgate's contract, their kv_format.
type PairKey struct {
	Protocol Protocol
	KVFormat uint32
}

// PairKeyOf returns w's pair key, and false when w pairs with nothing.
func PairKeyOf(w *Worker) (PairKey, bool) {
	p, ok := w.Protocol()
	if !ok {
		return PairKey{}, false
	}
	k := PairKey{Protocol: p}
	if p == ProtocolTLGate {
		k.KVFormat = w.KVFormat
	}
	return k, true
}

// BootstrapAddress is where an SGLang prefill worker's decode partners
// join its bootstrap rooms, as bootstrap_host and bootstrap_port take it:
// the host of its HTTP address, an IPv6 address in brackets, and its
// bootstrap port (DefaultBootstrapPort when it has none). SGLang's decode
// engine dials f"{bootstrap_host}:{bootstrap_port}", so a bare IPv6 host
// would not parse; SGLang's own routers bracket it
// (maybe_wrap_ipv6_address).
func (w *Worker) BootstrapAddress() (host string, port int) {
	port = w.BootstrapPort
	if port <= 0 {
		port = DefaultBootstrapPort
	}
	host = HostOf(w.HTTPAddress)
	if strings.Contains(host, ":") { // IPv6, with a zone or not; no name has a colon
		host = "[" + host + "]"
	}
	return host, port
}

// HostOf returns the host of an engine's HTTP address, "host:port" or a
// URL ("http://host:port"), without brackets; the address itself when it
// has no port.
func HostOf(addr string) string {
	if strings.Contains(addr, "://") {
		if u, err := url.Parse(addr); err == nil {
			return u.Hostname()
		}
	}
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// ValidBootstrapPort reports whether port is a TCP port number (1-65535).
func ValidBootstrapPort(port int) bool { return port >= 1 && port <= 65535 }

// ParseBootstrapPort reads a bootstrap port from a label or annotation.
func ParseBootstrapPort(s string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || !ValidBootstrapPort(n) {
		return 0, false
	}
	return n, true
}
