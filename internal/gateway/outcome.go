package gateway

import (
	"net/http"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/internal/metrics"
)

// outcomeOf is how a finished request ended, as tlgate_requests_total and
// the access log name it: a stream the client stopped reading is
// client_gone and one cut by an engine failure upstream_failed, although
// both were answered 200.
func outcomeOf(o request.Outcome) string {
	switch {
	case o.Log.ClientGone || o.Status == 499:
		return metrics.OutcomeClientGone
	case o.Code == "model_not_found":
		return metrics.OutcomeNotFound
	case o.Code == "no_capacity":
		return metrics.OutcomeNoCapacity
	case o.Code == "internal_error":
		return metrics.OutcomeInternalError
	case o.Streamed && o.Log.Committed && o.Status == http.StatusOK && !o.Log.Done:
		return metrics.OutcomeUpstreamFailed
	case o.Status >= 400 && o.Status < 500:
		return metrics.OutcomeClientError
	case o.Status >= 500:
		return metrics.OutcomeUpstreamFailed
	}
	return metrics.OutcomeOK
}
