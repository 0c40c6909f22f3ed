package metrics

import (
	"sync"
	"unicode/utf8"
)

// Other is the label value that replaces a value outside its label's fixed
// set, an invalid UTF-8 value, and a dynamic value (route, worker, model)
// that arrives once its label already holds its cap of distinct values.
const Other = "other"

// None is the label value of an empty route, worker or model, e.g. the
// route of a request that matched no route.
const None = "none"

// Caps on the distinct values of the dynamic labels. Values beyond a cap are
// counted under Other, so a misbehaving peer cannot grow the exposition
// without bound. DeleteWorker frees a worker's place.
const (
	MaxRoutes  = 1024
	MaxWorkers = 4096
	MaxModels  = 1024
	// MaxCascadeSteps bounds the step label: steps 0 to MaxCascadeSteps-1
	// are labelled by number, any other step as Other.
	MaxCascadeSteps = 16
)

// Outcomes of a client request: the outcome label of tlgate_requests_total.
const (
	OutcomeOK             = "ok"                    // answered in full
	OutcomeClientError    = "client_error"          // 4xx other than 404 (bad request, auth, too large)
	OutcomeNotFound       = "not_found"             // 404 model_not_found; the route label is always None
	OutcomeNoCapacity     = "no_capacity"           // 503: no routable worker, or every attempt failed uncommitted
	OutcomeUpstreamFailed = "upstream_failed"       // the engine failed after the first byte reached the client
	OutcomeClientGone     = "client_gone"           // the client went away before the end
	OutcomeInternalError  = "internal_error"        // 500: a gateway fault
	OutcomeOverloaded     = "overloaded"            // 503: every worker at its limit and no wait possible
	OutcomeShed           = "shed"                  // 429 saturated: a sheddable request, its model saturated
	OutcomeObjective      = "objective_unreachable" // 429: its TTFT objective could not be met
)

// Failover reasons: the reason label of tlgate_failovers_total. The first
// seven are the proxy's attempt failures (proxy.Failure values); tokenize
// and prefill are the disaggregated phases that fail a pair before commit.
const (
	FailoverRefused   = "refused"
	FailoverReset     = "reset"
	FailoverTimeout   = "timeout"
	FailoverStatus503 = "status_503"
	FailoverEOF       = "eof"
	FailoverTransport = "transport"
	FailoverTooLarge  = "too_large"
	FailoverTokenize  = "tokenize"
	FailoverPrefill   = "prefill"
	// The engine answered a 5xx other than 503, or an answer that is
	// neither an OpenAI-shaped success nor an OpenAI-shaped error.
	FailoverStatus5xx = "status_5xx"
	FailoverBadAnswer = "bad_answer"
	// A whole answer whose body ended before its end.
	FailoverTruncated = "truncated"
)

// Reasons an HTTP connection is refused: the reason label of
// tlgate_http_connections_refused_total (connlimit's reasons).
const (
	ConnRefusedTotal     = "total"
	ConnRefusedPerClient = "per_client"
)

// Route decision reasons: the reason label of tlgate_route_decision_seconds,
// equal to the policy package's Reason values.
const (
	DecisionLeastOutstanding = "least_outstanding"
	DecisionWeighted         = "weighted"
	DecisionAffinity         = "affinity"
	DecisionLoad             = "load"
	DecisionCache            = "cache" // cache_aware: the pick holds more of the prompt than another worker
)

// Cascade step outcomes: the outcome label of tlgate_cascade_steps_total.
const (
	CascadeAccepted  = "accepted"  // the step's answer was kept
	CascadeEscalated = "escalated" // the step's answer failed accept_if; the next step was asked
)

// Disaggregated phases: the phase label of
// tlgate_disaggregated_failures_total.
const (
	PhaseTokenize = "tokenize"
	PhasePrefill  = "prefill"
	PhaseDecode   = "decode"
	PhaseRelease  = "release"
)

// Binary outcomes: the outcome label of tlgate_kv_handles_released_total and
// tlgate_probes_total.
const (
	ResultOK    = "ok"
	ResultError = "error"
)

// Worker roles and states: the role and state labels of tlgate_workers.
const (
	RoleUnified = "unified"
	RolePrefill = "prefill"
	RoleDecode  = "decode"

	StateRoutable = "routable" // live, not draining, model not drained
	StateDraining = "draining" // live, the worker itself reports draining
	StateDrained  = "drained"  // live, its model drained by an operator
)

// Registration sources: the source label of
// tlgate_worker_registrations_total (fleet.SourceHeartbeat, fleet.SourceProbe).
const (
	SourceHeartbeat = "heartbeat"
	SourceProbe     = "probe"
)

// Admin write outcomes: the outcome label of tlgate_admin_writes_total,
// equal to the admin API's error codes.
const (
	AdminOK              = "ok"
	AdminIfMatchRequired = "if_match_required"
	AdminETagMismatch    = "etag_mismatch"
	AdminInvalidRoutes   = "invalid_routes"
	AdminModelNotFound   = "model_not_found"
	AdminInternalError   = "internal_error"
	// AdminEpochExhausted: the route epoch is the largest uint64 (409).
	AdminEpochExhausted = "epoch_exhausted"
	// AdminStoreUnavailable: the shared route store could not be reached.
	AdminStoreUnavailable = "store_unavailable"
)

// HTTP edge rejections: the code label of tlgate_http_rejected_total, equal
// to the OpenAI error codes the edge answers before a request is routed.
const (
	RejectInvalidRequest    = "invalid_request"     // 400
	RejectInvalidAPIKey     = "invalid_api_key"     // 401
	RejectInsufficientScope = "insufficient_scope"  // 403
	RejectRequestTooLarge   = "request_too_large"   // 413
	RejectRateLimited       = "rate_limit_exceeded" // 429: over the key's limits
)

// Endpoints: the endpoint label of tlgate_endpoint_requests_total, the
// kinds of inference request (openai.Endpoint).
const (
	EndpointChat        = "chat"
	EndpointCompletions = "completions"
	EndpointEmbeddings  = "embeddings"
	EndpointRerank      = "rerank"
	EndpointScore       = "score"
	EndpointTokenize    = "tokenize"
	EndpointDetokenize  = "detokenize"
	EndpointResponses   = "responses"
	EndpointMessages    = "messages"
)

// The fixed sets, in exposition order.
var (
	endpoints = fixedSet{EndpointChat, EndpointCompletions, EndpointEmbeddings, EndpointRerank, EndpointScore,
		EndpointTokenize, EndpointDetokenize, EndpointResponses, EndpointMessages}
	requestOutcomes = fixedSet{OutcomeOK, OutcomeClientError, OutcomeNotFound, OutcomeNoCapacity,
		OutcomeUpstreamFailed, OutcomeClientGone, OutcomeInternalError, OutcomeOverloaded, OutcomeShed, OutcomeObjective}
	failoverReasons = fixedSet{FailoverRefused, FailoverReset, FailoverTimeout, FailoverStatus503,
		FailoverEOF, FailoverTransport, FailoverTooLarge, FailoverTokenize, FailoverPrefill,
		FailoverStatus5xx, FailoverBadAnswer, FailoverTruncated}
	decisionReasons = fixedSet{DecisionLeastOutstanding, DecisionWeighted, DecisionAffinity, DecisionLoad, DecisionCache}
	phases          = fixedSet{PhaseTokenize, PhasePrefill, PhaseDecode, PhaseRelease}
	roles           = fixedSet{RoleUnified, RolePrefill, RoleDecode}
	states          = fixedSet{StateRoutable, StateDraining, StateDrained}
	sources         = fixedSet{SourceHeartbeat, SourceProbe}
	adminOutcomes   = fixedSet{AdminOK, AdminIfMatchRequired, AdminETagMismatch, AdminInvalidRoutes,
		AdminModelNotFound, AdminInternalError, AdminStoreUnavailable, AdminEpochExhausted}
	rejectCodes = fixedSet{RejectInvalidRequest, RejectInvalidAPIKey, RejectInsufficientScope, RejectRequestTooLarge,
		RejectRateLimited}
	connRefusedReasons = fixedSet{ConnRefusedTotal, ConnRefusedPerClient}
)

// fixedSet is the closed list of values a label may take besides Other.
type fixedSet []string

// index returns v's position in s, or -1 when v is not in s.
func (s fixedSet) index(v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// label returns v when it is in s, else Other.
func (s fixedSet) label(v string) string {
	if s.index(v) >= 0 {
		return v
	}
	return Other
}

// names admits the values of one dynamic label up to a cap.
type names struct {
	mu   sync.Mutex
	seen map[string]struct{}
	max  int
}

func newNames(max int) *names {
	return &names{seen: make(map[string]struct{}), max: max}
}

// label returns the label value for v: None for "", Other for invalid
// UTF-8 or for a new value once max values are admitted, else v itself
// (admitting it).
func (n *names) label(v string) string {
	if v == "" {
		return None
	}
	if !utf8.ValidString(v) {
		return Other
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.seen[v]; ok {
		return v
	}
	if len(n.seen) >= n.max {
		return Other
	}
	n.seen[v] = struct{}{}
	return v
}

// forget frees v's place and reports whether v had been admitted.
func (n *names) forget(v string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.seen[v]; !ok {
		return false
	}
	delete(n.seen, v)
	return true
}
