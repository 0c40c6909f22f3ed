package probe

import "errors"

// Errors a probe can fail with; match them with errors.Is.
var (
	// ErrUnknownKind: the kind is not one of Kinds.
	ErrUnknownKind = errors.New("unknown engine kind")
	// ErrInvalidConfig: the Config cannot be probed (see Config.Validate).
	ErrInvalidConfig = errors.New("invalid probe config")
	// ErrUnhealthy: the health endpoint answered with a non-2xx status.
	ErrUnhealthy = errors.New("engine unhealthy")
	// ErrNoModel: model discovery found no model in GET /v1/models.
	ErrNoModel = errors.New("engine serves no model")
	// ErrModelNotServed: GET /v1/models does not list the configured
	// model; the engine serves another.
	ErrModelNotServed = errors.New("configured model not served")
	// ErrMalformedMetrics: /metrics is not a Prometheus text exposition.
	ErrMalformedMetrics = errors.New("malformed metrics")
	// ErrHTTPStatus: an endpoint other than health answered non-2xx.
	ErrHTTPStatus = errors.New("unexpected HTTP status")
	// ErrBodyTooLarge: an answer exceeded the size the prober reads.
	ErrBodyTooLarge = errors.New("response body too large")
)
