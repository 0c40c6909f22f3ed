package router

import (
	"sort"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// The states of a worker in the admin API's list (WorkerView.State).
const (
	StateRoutable = "routable"
	StateSuspect  = "suspect"  // routable; its last attempts failed, one request at a time
	StateEjected  = "ejected"  // passive health keeps it out for a while
	StateDraining = "draining" // the engine says it is draining
	StateDrained  = "drained"  // an operator drained its model
	StateStale    = "stale"    // it missed its heartbeats; its eviction is on its way
	StateDown     = "down"     // a probed engine whose probes fail (fleet.Down)
)

// WorkerView is one worker as the admin API lists it.
type WorkerView struct {
	fleet.Worker
	// State says why the worker is or is not routable (State*);
	// LastError and DownSince say why and since when a down engine is.
	State     string    `json:"state"`
	LastError string    `json:"last_error,omitempty"`
	DownSince time.Time `json:"down_since,omitzero"`
	InFlight  int       `json:"in_flight"`
	// Routable: new requests may go to the worker: live, not draining or
	// drained, and not ejected.
	Routable bool `json:"routable"`
	// PeerInFlight is the other replicas' requests in flight on the
	// worker, as fleet sync reports them (0 with sync off).
	PeerInFlight int `json:"peer_in_flight"`
	// PrefixIndexChunks is the worker's share of the cache_aware prefix
	// index, in chunks (0 under other policies).
	PrefixIndexChunks int `json:"prefix_index_chunks"`
	// CacheView is how cache_aware sees the worker's KV cache: "exact"
	// (from its KV events), "stale" (its events were lost or are late:
	// routed on the prefix index until they flow again) or "approximate"
	// (it publishes none: the prefix index). KVBlocks are the blocks its
	// exact view holds, per tier (gpu, cpu, disk, other).
	CacheView string         `json:"cache_view"`
	KVBlocks  map[string]int `json:"kv_blocks,omitempty"`
	// Ejection and admission (ejection.go, admission.go).
	EjectedUntil     time.Time `json:"ejected_until,omitzero"`
	EjectionReason   string    `json:"ejection_reason,omitempty"`
	Ejections        int       `json:"ejections"`
	ConcurrencyLimit int       `json:"concurrency_limit"`
	// ConsecutiveFailures are the worker's attempt failures in a row
	// since its last answer (0 while ejected); while > 0 it is suspect
	// and takes one new request at a time.
	ConsecutiveFailures int `json:"consecutive_failures"`
}

// Workers lists every known worker at now, and every down engine, sorted
// by id.
func (s *State) Workers(now time.Time) []WorkerView {
	out := make([]WorkerView, 0, len(s.workers)+len(s.down))
	for _, w := range s.workers {
		v := WorkerView{Worker: *w, InFlight: s.InFlight(w.ID), PeerInFlight: s.PeerInFlight(w.ID), Routable: w.Routable(now), PrefixIndexChunks: s.indexChunks(w.ID)}
		v.CacheView, v.KVBlocks = s.exactStats(w.ID, now)
		v = s.overloadView(v, now)
		v.State = s.viewState(&v, now)
		out = append(out, v)
	}
	out = append(out, s.downViews()...)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// viewState is the State of a worker's view: its state for any request
// (stateOf), a worker at its concurrency limit being routable, and a
// routable one with failures in a row suspect.
func (s *State) viewState(v *WorkerView, now time.Time) string {
	switch s.stateOf(&v.Worker, &Request{}, now, false) {
	case stateStale:
		return StateStale
	case stateDrained:
		return StateDrained
	case stateDraining:
		return StateDraining
	case stateEjected:
		return StateEjected
	}
	if v.ConsecutiveFailures > 0 {
		return StateSuspect
	}
	return StateRoutable
}

// Ready reports whether at least one worker is routable at now.
func (s *State) Ready(now time.Time) bool {
	for _, w := range s.workers {
		if w.Routable(now) {
			return true
		}
	}
	return false
}

// Models lists route models, aliases, the model ids known workers serve
// (base models and adapters) and every other model known at now (Known).
func (s *State) Models(now time.Time) []string {
	seen := map[string]bool{}
	var out []string
	add := func(m string) {
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	for _, m := range s.table.Models() {
		add(m)
	}
	for _, w := range s.workers {
		for _, m := range w.Models() {
			add(m)
		}
	}
	for _, m := range s.knownElsewhere(now) {
		add(m)
	}
	sort.Strings(out)
	return out
}

// Adapters maps each LoRA adapter a known worker serves to its base model
// (the smallest, should workers disagree).
func (s *State) Adapters() map[string]string {
	out := map[string]string{}
	for _, w := range s.workers {
		for _, a := range w.Adapters {
			if base, ok := out[a]; !ok || w.Model < base {
				out[a] = w.Model
			}
		}
	}
	return out
}
