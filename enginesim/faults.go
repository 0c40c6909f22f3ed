package enginesim

import (
	"errors"
	"fmt"
)

// Faults are the failures an engine injects, for drills and tests. The zero
// value injects none. Set them with Config.Faults, Engine.SetFaults or
// POST /sim/faults (the same JSON as GET /sim/faults returns).
type Faults struct {
	// Refuse closes the listeners so new connections are refused (the
	// ports really close; clearing re-listens on the same ports). Idle HTTP
	// connections and every gRPC connection are closed too, and a request
	// arriving on a surviving HTTP connection is reset, so clients see a
	// dead engine; requests already running finish.
	Refuse bool `json:"refuse"`
	// Unavailable answers 503 to every HTTP request but /sim/ and
	// /metrics, and Unavailable to Prefill and Push.
	Unavailable bool `json:"unavailable"`
	// Die closes the connection of every completions request abruptly
	// after DieAfterTokens tokens (0: before the first byte): a stream ends
	// with no [DONE], a non-streamed request gets no response.
	Die            bool `json:"die"`
	DieAfterTokens int  `json:"die_after_tokens"`
	// StallMS delays completions requests and Prefill by that many
	// milliseconds before their first byte.
	StallMS int `json:"stall_ms"`
	// NoHeartbeat stops heartbeating (the gateway will evict the engine).
	NoHeartbeat bool `json:"no_heartbeat"`
	// RefusePull makes a prefill engine refuse every KV pull, as one that
	// died holding the blocks of its remote decodes: they are freed only
	// by RemoteDecodeTimeout.
	RefusePull bool `json:"refuse_pull"`
	// UnreachablePrefill makes a decode engine fail to reach any prefill
	// engine (KV pulls and bootstrap joins fail with kv_transfer_failed).
	UnreachablePrefill bool `json:"unreachable_prefill"`
}

// ErrFaults is wrapped by errors of invalid faults.
var ErrFaults = errors.New("enginesim: invalid faults")

func (f Faults) validate() error {
	if f.DieAfterTokens < 0 {
		return fmt.Errorf("%w: die_after_tokens %d < 0", ErrFaults, f.DieAfterTokens)
	}
	if f.StallMS < 0 {
		return fmt.Errorf("%w: stall_ms %d < 0", ErrFaults, f.StallMS)
	}
	return nil
}
