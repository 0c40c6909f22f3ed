package request

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// exhausted is the answer when a request has no attempt left after
// attempts failures before the first byte, the last one last: 502
// upstream_failed when that one failed on what an engine answered (a 5xx,
// an answer that is not OpenAI-shaped), whose detail is for the log only;
// 503 no_capacity otherwise.
func exhausted(model string, attempts int, last error) Outcome {
	if proxy.IsAnswerFailure(last) {
		return Outcome{Status: http.StatusBadGateway, Code: openai.CodeUpstreamFailed,
			Message: fmt.Sprintf("The engines serving model %q failed to answer: %d attempt(s) failed before the first byte (last: %s).",
				model, attempts, proxy.ReasonOf(last))}
	}
	msg := fmt.Sprintf("No worker could serve model %q: %d attempt(s) failed before the first byte.", model, attempts)
	if r := proxy.ReasonOf(last); r != "" {
		msg = fmt.Sprintf("No worker could serve model %q: %d attempt(s) failed before the first byte (last: %s).", model, attempts, r)
	}
	return Outcome{Status: http.StatusServiceUnavailable, Code: openai.CodeNoCapacity, Message: msg}
}

// tooLarge is the answer when an engine's answer was over what the gateway
// relays (proxy: MaxResponseBytes whole, MaxEventBytes an event): 502
// upstream_failed saying so, without Retry-After, since the same request
// would be answered as large again.
func tooLarge(model string, err error) Outcome {
	var ae *proxy.AttemptError
	detail := err.Error()
	if errors.As(err, &ae) && ae.Err != nil {
		detail = strings.TrimPrefix(ae.Err.Error(), "proxy: ")
	}
	return Outcome{Status: http.StatusBadGateway, Code: openai.CodeUpstreamFailed,
		Message: fmt.Sprintf("The engine serving model %q answered more than the gateway relays (%s); no other worker was asked, since it would answer as much.", model, detail)}
}

// escalatesOnFailure reports whether a failed attempt moves a cascade to
// its next step rather than to another worker of the same step: an engine
// of a step that is not the last answered a 5xx or a malformed answer, which
// the larger model of the next step may well not.
func escalatesOnFailure(t router.Target, err error) bool {
	// A truncated answer is the engine's connection failing, not the
	// model's: another worker of the same step is tried instead.
	return t.CascadeSteps > 1 && t.CascadeStep < t.CascadeSteps-1 && proxy.IsWrongAnswer(err)
}

// noCapacity is the answer when the router found no worker for the
// request before any attempt: 503 no_capacity saying what is missing, with
// the router's Retry-After.
func (a *requestActor) noCapacity(m *router.RouteResult) Outcome {
	msg := fmt.Sprintf("No worker can serve model %q right now.", a.ex.Req.Model)
	var nc *router.NoCapacityError
	if errors.As(m.Err, &nc) && nc.Why != "" {
		a.log.NoCapacity = nc.Why
		msg = fmt.Sprintf("No worker can serve model %q right now: %s.", a.ex.Req.Model, nc.Why)
		a.skipped(nc.Skipped)
	}
	return Outcome{Status: http.StatusServiceUnavailable, Code: openai.CodeNoCapacity, Message: msg,
		Header: retryAfter(m.RetryAfter)}
}

// skipped records cascade steps the router passed over, in the log and the
// trace.
func (a *requestActor) skipped(steps []router.Skip) {
	for _, k := range steps {
		a.log.Skipped = append(a.log.Skipped, k.String())
		a.traceSkipped(k)
	}
}

// MaxGenerationTimeouts is how many workers a non-streamed request tries
// whose engine sends nothing within first_byte_timeout: a generation that
// outlasted it on two workers will on a third, so the request ends there
// (504 upstream_timeout) rather than costing every worker that much work.
const MaxGenerationTimeouts = 2

// generationTimedOut is the answer when a non-streamed request timed out
// generating on n workers.
func generationTimedOut(model string, n int) Outcome {
	return Outcome{Status: http.StatusGatewayTimeout, Code: openai.CodeUpstreamTimeout,
		Message: fmt.Sprintf("The engines serving model %q sent no answer within the first-byte timeout on %d worker(s); ask for fewer tokens (max_tokens) or stream the answer.", model, n)}
}
