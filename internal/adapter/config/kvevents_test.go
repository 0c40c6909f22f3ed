package config

import (
	"strings"
	"testing"
)

func TestKVEventsValidation(t *testing.T) {
	ok, err := Parse([]byte(`
[[gateway.engines]]
id = "v"
http_address = "10.0.0.5:8000"
kind = "vllm"
kv_events = "tcp://:5557"
kv_events_replay = "tcp://10.0.0.5:5558"
kv_events_topic = "kv@v"

[[gateway.discovery]]
name = "d"
kind = "dns"
engine_kind = "vllm"
host = "vllm.svc"
port = 8000
kv_events_port = 5557

[gateway.kv_events]
max_blocks = 1024
cpu_weight = 1

[gateway.tokenizer]
timeout = "5ms"
[[gateway.tokenizer.endpoints]]
model = "m"
url = "http://tok:8100"
`))
	if err != nil {
		t.Fatal(err)
	}
	if e := ok.Gateway.Engines[0]; e.KVEvents != "tcp://:5557" || e.KVEventsReplay == "" || e.KVEventsTopic != "kv@v" {
		t.Errorf("engine %+v", e)
	}
	if !ok.Gateway.KVEvents.Follow {
		t.Error("follow is off by default")
	}
	off, err := Parse([]byte("[gateway.kv_events]\nfollow = false\n"))
	if err != nil || off.Gateway.KVEvents.Follow {
		t.Errorf("follow = false: %v, follow %v", err, off.Gateway.KVEvents.Follow)
	}
	if k := ok.Gateway.KVEvents.Index(); k.MaxBlocks != 1024 || k.Weights[1] != 1 || k.Weights[2] != 0.5 {
		t.Errorf("index config %+v", k)
	}
	if tk := ok.Gateway.Tokenizer; tk.Timeout.Duration.Milliseconds() != 5 || len(tk.Endpoints) != 1 {
		t.Errorf("tokenizer %+v", tk)
	}
	engine := "[[gateway.engines]]\nid = \"v\"\nhttp_address = \"10.0.0.5:8000\"\nkind = \"vllm\"\n"
	source := "[[gateway.discovery]]\nname = \"d\"\nkind = \"dns\"\nengine_kind = \"vllm\"\nhost = \"h\"\nport = 1\n"
	cases := []struct{ toml, want string }{
		{engine + `kv_events = "udp://h:1"`, "gateway.engines[0].kv_events: invalid kv_events"},
		{engine + `kv_events = "tcp://h"`, "gateway.engines[0].kv_events: invalid kv_events"},
		{engine + `kv_events = "tcp://h:1"` + "\n" + `kv_events_replay = "tcp://h:0"`, "gateway.engines[0].kv_events_replay: invalid kv_events"},
		{engine + `kv_events_topic = "t"`, "gateway.engines[0].kv_events: required with kv_events_replay or kv_events_topic"},
		{engine + `kv_events = "tcp://h:1"` + "\nkv_events_topic = \"" + strings.Repeat("t", 300) + `"`, "gateway.engines[0].kv_events_topic: must be at most 256 bytes"},
		{source + "kv_events_port = 70000", "gateway.discovery[0].kv_events_port: must be a port number in 1..65535"},
		{source + "kv_events_replay_port = 5", "gateway.discovery[0].kv_events_port: required"},
		{"[gateway.kv_events]\nmax_blocks = 0", "gateway.kv_events.max_blocks: must be from 1"},
		{"[gateway.kv_events]\nspeculative_ttl = \"0s\"", "gateway.kv_events.speculative_ttl: must be from 1ms to 1h"},
		{"[gateway.kv_events]\nevent_timeout = \"2h\"", "gateway.kv_events.event_timeout: must be from 1ms to 1h"},
		{"[gateway.kv_events]\nmax_message_bytes = 10", "gateway.kv_events.max_message_bytes: must be from 1024"},
		{"[gateway.kv_events]\nbytes_per_second = 2048", "gateway.kv_events.bytes_per_second: must be at least max_message_bytes"},
		{"[gateway.kv_events]\ncpu_weight = 1.5", "gateway.kv_events.cpu_weight: must be in [0, 1]"},
		{"[gateway.kv_events]\ndisk_weight = -0.1", "gateway.kv_events.disk_weight: must be in [0, 1]"},
		{"[gateway.kv_events]\nindex_agreement = 1.01", "gateway.kv_events.index_agreement: must be in [0, 1] (0: always tokenize), got 1.01"},
		{"[gateway.kv_events]\nindex_agreement = nan", "gateway.kv_events.index_agreement: must be in [0, 1]"},
		{"[gateway.kv_events]\nagreement_sample = 0", "gateway.kv_events.agreement_sample: must be from 1 to 1048576, got 0"},
		{"[gateway.tokenizer]\ntimeout = \"0s\"", "gateway.tokenizer.timeout: must be from 1ms to 1m"},
		{"[gateway.tokenizer]\ncache_tokens = -1", "gateway.tokenizer.cache_tokens: must be from 0"},
		{"[[gateway.tokenizer.endpoints]]\nmodel = \"m\"\nurl = \"tok:8100\"", "gateway.tokenizer.endpoints[0].url: want http://host:port"},
		{"[[gateway.tokenizer.endpoints]]\nmodel = \"m\"\nurl = \"http://t:1/v1\"", "gateway.tokenizer.endpoints[0].url: want http://host:port"},
		{"[[gateway.tokenizer.endpoints]]\nmodel = \"m\"\nurl = \"http://t:1\"\n[[gateway.tokenizer.endpoints]]\nmodel = \"m\"\nurl = \"http://t:2\"", "gateway.tokenizer.endpoints[1].model: \"m\" already has endpoints[0]"},
		{"[[gateway.tokenizer.endpoints]]\nurl = \"http://t:1\"", "gateway.tokenizer.endpoints[0].model:"},
		// A tokenizer is dialled as an engine: within engine_networks.
		{"[gateway]\nengine_networks = [\"10.0.0.0/8\"]\n[[gateway.tokenizer.endpoints]]\nmodel = \"m\"\nurl = \"http://192.168.1.9:8100\"", "gateway.tokenizer.endpoints[0].url: 192.168.1.9 is in none of gateway.engine_networks [10.0.0.0/8]"},
		{"[gateway]\nengine_networks = [\"fd00::/8\"]\n[[gateway.tokenizer.endpoints]]\nmodel = \"m\"\nurl = \"http://[fe80::1]:8100\"", "gateway.tokenizer.endpoints[0].url: fe80::1 is an unspecified, multicast or link-local address"},
	}
	for _, tc := range cases {
		_, err := Parse([]byte(tc.toml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.toml, err, tc.want)
		}
	}
}

// TestTokenizerWithinEngineNetworks: a tokenizer whose address is in
// engine_networks, or a host name (checked at each dial), is accepted.
func TestTokenizerWithinEngineNetworks(t *testing.T) {
	for _, u := range []string{"http://10.1.2.3:8100", "https://tok.internal:8100"} {
		if _, err := Parse([]byte("[gateway]\nengine_networks = [\"10.0.0.0/8\"]\n[[gateway.tokenizer.endpoints]]\nmodel = \"m\"\nurl = \"" + u + "\"")); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
}
