package config

import (
	"time"

	"github.com/tlgate/tlgate/internal/routing/sticky"
)

// Responses is the [gateway.responses] table: the gateway's record of
// which worker stores each Responses API response (store: true), so that
// a request naming it (previous_response_id, GET, DELETE) reaches that
// worker.
type Responses struct {
	// StoreTTL is how long the worker of a stored response is remembered
	// after the response was made.
	StoreTTL Duration `toml:"store_ttl"`
	// StoreMaxEntries bounds the responses remembered (the oldest are
	// forgotten first). With fleet sync, the peers' responses are kept
	// apart under the same bound.
	StoreMaxEntries int `toml:"store_max_entries"`
}

// Bounds of [gateway.responses].
const (
	MaxResponsesStoreTTL        = 7 * 24 * time.Hour
	MaxResponsesStoreMaxEntries = 10_000_000
)

func defaultResponses() Responses {
	return Responses{StoreTTL: D(sticky.DefaultTTL), StoreMaxEntries: sticky.DefaultMaxEntries}
}

// responses checks the [gateway.responses] table.
func (v *checker) responses(r Responses) {
	if d := r.StoreTTL.Duration; d < time.Second || d > MaxResponsesStoreTTL {
		v.add("gateway.responses.store_ttl", "must be from 1s to %s, got %s", MaxResponsesStoreTTL, d)
	}
	if n := r.StoreMaxEntries; n < 1 || n > MaxResponsesStoreMaxEntries {
		v.add("gateway.responses.store_max_entries", "must be from 1 to %d, got %d", MaxResponsesStoreMaxEntries, n)
	}
}
