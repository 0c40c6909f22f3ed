// Package probe watches inference engines that send no tl.control.v1
// heartbeats (vLLM, SGLang, llama.cpp, or any OpenAI-compatible server): it
// polls their health, model list and Prometheus /metrics over HTTP and maps
// what it reads to the *controlv1.WorkerStatus a heartbeat would carry, so
// the same worker registry can take both. Tracker adds the flap rule that
// decides when a probed engine counts as live.
//
// A probe fails when the engine is unreachable, its health check answers
// non-2xx, model discovery fails, or the probe outlasts its timeout. An
// engine whose health check passes but whose /metrics is missing or
// malformed is still up: the probe succeeds with fallback figures (see
// Figures) and says why in Result.MetricsErr.
//
// Manager runs a probe loop per configured engine and feeds the registry
// actor: an engine is registered by the heartbeat of its 2nd consecutive
// good probe, is kept (with its last good figures) through fewer than
// heartbeat_miss_limit (k) consecutive failures by a heartbeat per probe,
// and is removed with registry.Forget at the k-th, about k·P after its last
// good probe for a probe interval P. This holds while P stays below k·T (T
// the registry's heartbeat interval), which bounds the registry's own
// deadline, last probe + k·T; that deadline still evicts an engine whose
// probes stop. See Manager for the exact relation.
package probe

import (
	"fmt"
	"strings"
	"time"
)

// Kind names the engine behind an address, which fixes its health endpoint
// and the names of its metrics.
type Kind string

// The kinds of engine a Prober understands.
const (
	// KindVLLM is a vLLM OpenAI-compatible server: GET /health, vllm:* metrics.
	KindVLLM Kind = "vllm"
	// KindSGLang is an SGLang server started with --enable-metrics: GET
	// /health, sglang:* metrics. SGLang's /health runs a generation as
	// /health_generate does (unless the server's
	// SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is false), so its probes get
	// more time (see healthWait).
	KindSGLang Kind = "sglang"
	// KindLlamaCpp is llama.cpp's llama-server started with --metrics: GET
	// /health (503 while the model loads), llamacpp:* metrics, GET /props.
	KindLlamaCpp Kind = "llamacpp"
	// KindOpenAI is any OpenAI-compatible server: GET /v1/models is its health
	// check and it has no metrics, so its figures are the fallback ones.
	KindOpenAI Kind = "openai"
)

// Kinds lists every kind ParseKind accepts, in a stable order.
var Kinds = []Kind{KindVLLM, KindSGLang, KindLlamaCpp, KindOpenAI}

// ParseKind reads a kind from configuration. It ignores case and surrounding
// spaces and also accepts "llama.cpp" for KindLlamaCpp.
func ParseKind(s string) (Kind, error) {
	switch k := Kind(strings.ToLower(strings.TrimSpace(s))); k {
	case KindVLLM, KindSGLang, KindLlamaCpp, KindOpenAI:
		return k, nil
	case "llama.cpp":
		return KindLlamaCpp, nil
	}
	return "", fmt.Errorf("probe: %w %q (want one of vllm, sglang, llamacpp, openai)", ErrUnknownKind, s)
}

// Valid reports whether k is one of the kinds in Kinds.
func (k Kind) Valid() bool {
	switch k {
	case KindVLLM, KindSGLang, KindLlamaCpp, KindOpenAI:
		return true
	}
	return false
}

// healthPath is the endpoint whose 2xx answer means the engine can serve.
func (k Kind) healthPath() string {
	if k == KindOpenAI {
		return modelsPath
	}
	return "/health"
}

// sglangHealthWait is what an SGLang probe gets beyond its timeout. SGLang's
// GET /health submits a one-token generation and then checks once a second
// whether the engine has produced any output since: it answers 200 after
// 1 s at the soonest, after 2 s when a prefill longer than a second is
// running, which would leave little or nothing of a 2 s probe to
// /v1/models and /metrics. With the default timeout and probe interval a
// probe still ends well within the registry's default k·T (6 s).
const sglangHealthWait = 1500 * time.Millisecond

// healthWait is how much longer than its timeout a probe of the kind may
// take because of its health check.
func (k Kind) healthWait() time.Duration {
	if k == KindSGLang {
		return sglangHealthWait
	}
	return 0
}

// defaultBlockTokens is the number of tokens per KV block the kind's figures
// are expressed in when its metrics do not say otherwise: vLLM's default
// block_size (16), SGLang's default --page-size (1: its token pool is
// allocated token by token), llama.cpp's KV cells (one token each), and for
// the generic kind, which reports no KV figures, the reference engine's 16.
func (k Kind) defaultBlockTokens() uint32 {
	switch k {
	case KindSGLang, KindLlamaCpp:
		return 1
	}
	return 16
}
