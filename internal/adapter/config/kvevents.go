package config

import (
	"fmt"
	"math"
	"net/netip"
	"net/url"
	"slices"
	"time"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/kvindex"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// KVEvents is the [gateway.kv_events] table: how the gateway follows the
// KV cache events of the engines that publish them (an engine's
// kv_events, a discovery source's kv_events_port, a heartbeat's
// kv_events) and weighs what they hold.
type KVEvents struct {
	// Follow subscribes to the events of the engines that publish them;
	// false routes cache_aware on the prefix index alone, whatever the
	// engines publish.
	Follow bool `toml:"follow"`
	// MaxBlocks bounds the blocks the gateway keeps of one engine.
	MaxBlocks int `toml:"max_blocks"`
	// SpeculativeTTL is how long a pick's blocks count as held on its
	// engine before the engine's events say so.
	SpeculativeTTL Duration `toml:"speculative_ttl"`
	// EventTimeout is how long an engine may take to publish the blocks
	// of an answer that began before its view turns stale.
	EventTimeout Duration `toml:"event_timeout"`
	// ReplayTimeout bounds one replay from an engine's replay socket.
	ReplayTimeout Duration `toml:"replay_timeout"`
	// MaxMessageBytes bounds one message an engine sends; BytesPerSecond
	// the batch bytes decoded per second per engine (more are dropped,
	// and the engine's view is stale until its events come in order).
	MaxMessageBytes int `toml:"max_message_bytes"`
	BytesPerSecond  int `toml:"bytes_per_second"`
	// CPUWeight and DiskWeight weigh a cached token held in the CPU tier
	// and in a disk (or any other) tier against one in GPU memory, in
	// [0, 1].
	CPUWeight  float64 `toml:"cpu_weight"`
	DiskWeight float64 `toml:"disk_weight"`
	// IndexAgreement is the share, in [0, 1], of a model's latest picks
	// on the events that the prefix index would have made alike, at or
	// above which the model's requests are routed on the prefix index
	// without being tokenized, but one in AgreementSample; 0: always
	// tokenized.
	IndexAgreement  float64 `toml:"index_agreement"`
	AgreementSample int     `toml:"agreement_sample"`
}

// Bounds of [gateway.kv_events].
const (
	MaxKVEventsBlocks       = 1 << 24
	MaxKVEventsMessageBytes = 1 << 30
	DefaultIndexAgreement   = 0.95
	MaxAgreementSample      = 1 << 20
)

func defaultKVEvents() KVEvents {
	return KVEvents{
		Follow:    true,
		MaxBlocks: kvindex.DefaultMaxBlocks, SpeculativeTTL: D(kvindex.DefaultSpeculativeTTL), EventTimeout: D(kvindex.DefaultEventTimeout),
		ReplayTimeout: D(2 * time.Second), MaxMessageBytes: 16 << 20, BytesPerSecond: 64 << 20,
		CPUWeight: kvindex.DefaultWeights[kvindex.CPU], DiskWeight: kvindex.DefaultWeights[kvindex.Disk],
		IndexAgreement: DefaultIndexAgreement, AgreementSample: router.DefaultAgreementSample,
	}
}

// Index is the exact index's config of the table.
func (k KVEvents) Index() kvindex.Config {
	return kvindex.Config{MaxBlocks: k.MaxBlocks, SpeculativeTTL: k.SpeculativeTTL.Duration, EventTimeout: k.EventTimeout.Duration,
		Weights: [kvindex.NumMedia]float64{1, k.CPUWeight, k.DiskWeight, k.DiskWeight}}
}

func (v *checker) kvEvents(k KVEvents) {
	const at = "gateway.kv_events."
	if k.MaxBlocks < 1 || k.MaxBlocks > MaxKVEventsBlocks {
		v.add(at+"max_blocks", "must be from 1 to %d, got %d", MaxKVEventsBlocks, k.MaxBlocks)
	}
	for _, d := range []struct {
		key string
		d   Duration
	}{{"speculative_ttl", k.SpeculativeTTL}, {"event_timeout", k.EventTimeout}, {"replay_timeout", k.ReplayTimeout}} {
		if d.d.Duration < time.Millisecond || d.d.Duration > time.Hour {
			v.add(at+d.key, "must be from 1ms to 1h, got %s", d.d.Duration)
		}
	}
	if k.MaxMessageBytes < 1<<10 || k.MaxMessageBytes > MaxKVEventsMessageBytes {
		v.add(at+"max_message_bytes", "must be from 1024 to %d, got %d", MaxKVEventsMessageBytes, k.MaxMessageBytes)
	}
	if k.BytesPerSecond < k.MaxMessageBytes {
		v.add(at+"bytes_per_second", "must be at least max_message_bytes (%d), got %d", k.MaxMessageBytes, k.BytesPerSecond)
	}
	for _, w := range []struct {
		key string
		w   float64
	}{{"cpu_weight", k.CPUWeight}, {"disk_weight", k.DiskWeight}} {
		if math.IsNaN(w.w) || w.w < 0 || w.w > 1 {
			v.add(at+w.key, "must be in [0, 1], got %v", w.w)
		}
	}
	if a := k.IndexAgreement; math.IsNaN(a) || a < 0 || a > 1 {
		v.add(at+"index_agreement", "must be in [0, 1] (0: always tokenize), got %v", a)
	}
	if k.AgreementSample < 1 || k.AgreementSample > MaxAgreementSample {
		v.add(at+"agreement_sample", "must be from 1 to %d, got %d", MaxAgreementSample, k.AgreementSample)
	}
}

// kvEndpoints checks an engine's kv_events keys: endpoints as
// fleet.KVEndpoint resolves them on the host of its http address.
func (v *checker) kvEndpoints(at string, e Engine) {
	if e.KVEvents == "" {
		if e.KVEventsReplay != "" || e.KVEventsTopic != "" {
			v.add(at+".kv_events", "required with kv_events_replay or kv_events_topic")
		}
		return
	}
	host := e.HTTPAddress
	if _, err := fleet.KVEndpoint(e.KVEvents, host); err != nil {
		v.add(at+".kv_events", "%s", err)
	}
	if _, err := fleet.KVEndpoint(e.KVEventsReplay, host); err != nil {
		v.add(at+".kv_events_replay", "%s", err)
	}
	if len(e.KVEventsTopic) > fleet.MaxKVTopic {
		v.add(at+".kv_events_topic", "must be at most %d bytes, got %d", fleet.MaxKVTopic, len(e.KVEventsTopic))
	}
}

// kvPorts checks a discovery source's kv_events keys.
func (v *checker) kvPorts(at string, d Discovery) {
	for _, p := range []struct {
		key string
		n   int
	}{{"kv_events_port", d.KVEventsPort}, {"kv_events_replay_port", d.KVEventsReplayPort}} {
		if p.n < 0 || p.n > 65535 {
			v.add(at+"."+p.key, "must be a port number in 1..65535 (0: none), got %d", p.n)
		}
	}
	if d.KVEventsPort == 0 && (d.KVEventsReplayPort != 0 || d.KVEventsTopic != "") {
		v.add(at+".kv_events_port", "required with kv_events_replay_port or kv_events_topic")
	}
	if len(d.KVEventsTopic) > fleet.MaxKVTopic {
		v.add(at+".kv_events_topic", "must be at most %d bytes, got %d", fleet.MaxKVTopic, len(d.KVEventsTopic))
	}
}

// Tokenizer is the [gateway.tokenizer] table: how the gateway gets a
// request's tokens exactly as the engine will see them, for routing on
// the engines' KV cache events.
type Tokenizer struct {
	// Timeout is the deadline of one tokenization: past it the request is
	// routed on the prefix index, as if no engine published events.
	Timeout Duration `toml:"timeout"`
	// CacheTokens bounds the memory the gateway keeps of tokenized
	// prompts (a conversation's earlier turns are not tokenized again), in
	// tokens: each prompt counts its tokens and tokenize.EntryOverhead.
	CacheTokens int `toml:"cache_tokens"`
	// Endpoints are tokenizers per model (a GPU-less vLLM serving
	// POST /tokenize); a model with none is tokenized by one of its
	// engines.
	Endpoints []TokenizerEndpoint `toml:"endpoints"`
}

// TokenizerEndpoint is one [[gateway.tokenizer.endpoints]] entry.
type TokenizerEndpoint struct {
	// Model is the (base) model id whose prompts it tokenizes.
	Model string `toml:"model"`
	// URL is its base URL (http:// or https://, no path): the gateway
	// posts to URL/tokenize, vLLM's.
	URL string `toml:"url"`
}

// Bounds and defaults of [gateway.tokenizer].
const (
	DefaultTokenizerTimeout = 50 * time.Millisecond
	DefaultTokenizerCache   = 1 << 22
	MaxTokenizerCache       = 1 << 28
)

func defaultTokenizer() Tokenizer {
	return Tokenizer{Timeout: D(DefaultTokenizerTimeout), CacheTokens: DefaultTokenizerCache}
}

// tokenizer checks [gateway.tokenizer], its endpoints against nets
// (engine_networks): the gateway dials a tokenizer as it dials an engine,
// refusing an address outside them at every call, so an endpoint whose
// host is an IP address outside them, or one no engine may have
// (unspecified, multicast, link-local), is refused here. A host name is
// checked at each dial, once resolved, as an engine's.
func (v *checker) tokenizer(t Tokenizer, nets []netip.Prefix) {
	const at = "gateway.tokenizer."
	if d := t.Timeout.Duration; d < time.Millisecond || d > time.Minute {
		v.add(at+"timeout", "must be from 1ms to 1m, got %s", d)
	}
	if t.CacheTokens < 0 || t.CacheTokens > MaxTokenizerCache {
		v.add(at+"cache_tokens", "must be from 0 to %d, got %d", MaxTokenizerCache, t.CacheTokens)
	}
	seen := map[string]int{}
	for i, e := range t.Endpoints {
		key := fmt.Sprintf("%sendpoints[%d]", at, i)
		if err := routes.CheckModelID(e.Model); err != nil {
			v.add(key+".model", "%s", err)
		} else if j, dup := seen[e.Model]; dup {
			v.add(key+".model", "%q already has endpoints[%d]", e.Model, j)
		} else {
			seen[e.Model] = i
		}
		u, err := url.Parse(e.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			v.add(key+".url", "want http://host:port or https://host:port with no path, got %q", e.URL)
			continue
		}
		ip, err := netip.ParseAddr(u.Hostname())
		if err != nil {
			continue
		}
		ip = ip.Unmap()
		switch {
		case ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalUnicast():
			v.add(key+".url", "%s is an unspecified, multicast or link-local address, which the gateway never dials", ip)
		case len(nets) > 0 && !slices.ContainsFunc(nets, func(n netip.Prefix) bool { return n.Contains(ip) }):
			v.add(key+".url", "%s is in none of gateway.engine_networks %v: the gateway dials tokenizers as engines, only within them", ip, nets)
		}
	}
}
