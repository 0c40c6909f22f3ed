package fleet

import (
	"net"
	"strconv"
	"testing"
)

func TestProtocolsAndPairs(t *testing.T) {
	hb := func(format uint32) *Worker { return &Worker{Source: SourceHeartbeat, KVFormat: format} }
	probe := func(kind string) *Worker { return &Worker{Source: SourceProbe, Kind: kind} }
	for _, tc := range []struct {
		w     *Worker
		proto Protocol
		ok    bool
	}{
		{hb(1), ProtocolTLGate, true}, {probe("vllm"), ProtocolVLLM, true}, {probe("sglang"), ProtocolSGLang, true},
		{probe("llamacpp"), "", false}, {probe("openai"), "", false},
	} {
		if p, ok := tc.w.Protocol(); p != tc.proto || ok != tc.ok {
			t.Errorf("%+v: protocol %q %v, want %q %v", tc.w, p, ok, tc.proto, tc.ok)
		}
	}
	for _, tc := range []struct {
		p, d *Worker
		want bool
	}{
		{hb(1), hb(1), true}, {hb(1), hb(2), false}, {probe("vllm"), probe("vllm"), true}, {probe("sglang"), probe("sglang"), true},
		{probe("vllm"), probe("sglang"), false}, {hb(0), probe("vllm"), false}, {probe("sglang"), hb(0), false},
		{probe("llamacpp"), probe("llamacpp"), false},
	} {
		if got := Pairs(tc.p, tc.d); got != tc.want {
			t.Errorf("Pairs(%+v, %+v) = %v, want %v", tc.p, tc.d, got, tc.want)
		}
		pk, pok := PairKeyOf(tc.p)
		dk, dok := PairKeyOf(tc.d)
		if got := pok && dok && pk == dk; got != tc.want {
			t.Errorf("pair keys %+v %+v disagree with Pairs (%v)", pk, dk, tc.want)
		}
	}
}

// TestBootstrapAddress: an SGLang prefill worker's bootstrap address is
// its HTTP address's host and its bootstrap port (8998 by default), an
// IPv6 host bracketed: SGLang's decode engine joins the room at
// f"{bootstrap_host}:{bootstrap_port}" (disaggregation/decode.py), which a
// bare "fd00::1" would make "fd00::1:8998".
func TestBootstrapAddress(t *testing.T) {
	for _, tc := range []struct {
		addr string
		port int
		host string
		want int
	}{
		{"10.0.0.7:30000", 0, "10.0.0.7", DefaultBootstrapPort},
		{"http://prefill-0.sglang:30000", 9001, "prefill-0.sglang", 9001},
		{"[fd00::1]:30000", 0, "[fd00::1]", DefaultBootstrapPort},
		{"http://[fd00::12]:30000", 9001, "[fd00::12]", 9001},
		{"[fe80::1%eth0]:30000", 0, "[fe80::1%eth0]", DefaultBootstrapPort},
	} {
		w := &Worker{HTTPAddress: tc.addr, BootstrapPort: tc.port}
		if h, p := w.BootstrapAddress(); h != tc.host || p != tc.want {
			t.Errorf("%s (%d): %s %d, want %s %d", tc.addr, tc.port, h, p, tc.host, tc.want)
		}
		if h, p := w.BootstrapAddress(); h+":"+strconv.Itoa(p) != net.JoinHostPort(HostOf(tc.addr), strconv.Itoa(tc.want)) {
			t.Errorf("%s: SGLang's decode engine would dial %s:%d", tc.addr, h, p)
		}
	}
	for s, want := range map[string]int{"8998": 8998, " 9000 ": 9000, "0": 0, "65536": 0, "x": 0} {
		if got, ok := ParseBootstrapPort(s); got != want || ok != (want != 0) {
			t.Errorf("ParseBootstrapPort(%q) = %d %v", s, got, ok)
		}
	}
}
