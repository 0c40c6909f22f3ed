package enginesim

import (
	"errors"
	"fmt"
	"time"

	"github.com/tlgate/tlgate/enginesim/kvevents"
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
	// PrefillStops makes a prefill engine's remote decodes (vLLM's
	// kv_transfer_params do_remote_decode) end stopped at their one
	// token, as when vLLM samples the EOS token or one of the request's
	// stop_token_ids there: NixlConnector holds KV only for a request that
	// finished length-capped, so the answer has finish_reason "stop", no
	// kv_transfer_params, and the blocks are freed at once.
	PrefillStops bool `json:"prefill_stops"`
	// UnreachablePrefill makes a decode engine fail to reach any prefill
	// engine (KV pulls and bootstrap joins fail with kv_transfer_failed).
	UnreachablePrefill bool `json:"unreachable_prefill"`
	// KVEventsDrop numbers KV event batches and keeps them for replay but
	// does not send them: subscribers see gaps that replay can fill.
	KVEventsDrop bool `json:"kv_events_drop"`
	// KVEventsDelayMS sends every KV event batch that many milliseconds
	// late (in order).
	KVEventsDelayMS int `json:"kv_events_delay_ms"`
	// KVEventsRestartSeq, when it turns on, numbers the next KV event
	// batch 0 again and empties the replay buffer, as a restarted engine's
	// publisher does (turn it off and on to restart again).
	KVEventsRestartSeq bool `json:"kv_events_restart_seq"`
	// KVEventsRefuseReplay answers every replay request with the end
	// marker alone.
	KVEventsRefuseReplay bool `json:"kv_events_refuse_replay"`
}

// kvEvents returns the publisher's share of the faults.
func (f Faults) kvEvents() kvevents.Faults {
	return kvevents.Faults{Drop: f.KVEventsDrop, Delay: time.Duration(f.KVEventsDelayMS) * time.Millisecond,
		RefuseReplay: f.KVEventsRefuseReplay}
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
	if f.KVEventsDelayMS < 0 {
		return fmt.Errorf("%w: kv_events_delay_ms %d < 0", ErrFaults, f.KVEventsDelayMS)
	}
	return nil
}
