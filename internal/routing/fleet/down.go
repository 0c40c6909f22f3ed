package fleet

import "time"

// Down is an engine the gateway probes (configured under
// [[gateway.engines]] or found by discovery) that is not live: its probes
// fail, or it serves another model than the one configured. It is listed
// with why, so an operator sees it, and never routed to; its model stays
// known, so its clients get no_capacity, not model_not_found, for as long
// as it is down.
type Down struct {
	ID          string
	HTTPAddress string
	// Model is the configured model, else the one its last good probe
	// read, else empty (never probed successfully, model not configured).
	Model string
	Role  Role
	Kind  string
	// LastError is why its last probe failed.
	LastError string
	// Since is when it went down: the first failed probe of the run.
	Since time.Time
}
