package gateway

import (
	"net/http"
	"strings"
	"time"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/metrics"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/tracectx"
)

// instrument points the request actors' hooks at the metrics.
func instrument(d *request.Deps, m *metrics.Metrics) {
	d.OnRouted = func(_ *request.Exchange, t router.Target, took time.Duration) {
		m.RouteDecision(t.Reason, took)
		m.CacheAware(t.Route, t.PromptTokens, t.MatchedTokens)
		m.Attempt(t.Route, t.Worker.ID)
	}
	d.OnFailover = func(_ *request.Exchange, t router.Target, reason string) { m.Failover(t.Route, reason) }
	d.OnPD = func(_ *request.Exchange, r request.PDReport) {
		fs := make([]metrics.LegFailure, len(r.Failures))
		for i, f := range r.Failures {
			fs[i] = metrics.LegFailure{Leg: f.Leg, Reason: f.Reason}
		}
		m.Disaggregated(string(r.Protocol), r.Pairs, r.Prefill, r.Decode, r.TransferWait, fs)
	}
	d.OnCascade = func(_ *request.Exchange, route string, step int, accepted bool) { m.Cascade(route, step, accepted) }
	d.OnKV = func(event string, took time.Duration) {
		switch {
		case event == request.PhasePrefill:
			m.Prefill(took)
		case event == request.PhaseRelease:
			m.KVReleased(true)
		case strings.HasPrefix(event, "failure:"):
			phase := strings.TrimPrefix(event, "failure:")
			if phase == request.PhaseRelease {
				m.KVReleased(false)
			}
			m.DisaggFailure(phase)
		}
	}
}

// observe records a finished request.
func observe(m *metrics.Metrics, ex *request.Exchange, o request.Outcome) {
	outcome, route := outcomeOf(o)
	tid := tracectx.SampledTraceID(ex.TraceContext())
	m.RequestDoneTraced(route, outcome, time.Since(ex.Received), tid)
	m.EndpointDone(string(ex.Req.Endpoint), outcome)
	if d := streamedTTFB(o); d > 0 {
		m.FirstByteTraced(route, d, tid)
	}
	if r := objectiveResult(o); r != "" {
		m.Objective(o.Log.Priority, ex.KeyName, r)
	}
}

// streamedTTFB is a streamed request's time from its arrival to the first
// byte written to its client (queueing and failed attempts included), or 0
// for a request not streamed or whose stream never started. It is what
// tlgate_time_to_first_byte_seconds, the console's TTFT and the access
// log's ttfb report; o.Log.FirstByte is the last attempt's alone.
func streamedTTFB(o request.Outcome) time.Duration {
	if !o.Streamed {
		return 0
	}
	return o.Log.TTFT
}

// objectiveResult is how a request with a TTFT objective fared (a
// metrics.Objective constant), or "" when it had none or ended otherwise
// (a client gone, an engine's failure).
func objectiveResult(o request.Outcome) string {
	switch {
	case o.Log.Objective <= 0:
		return ""
	case o.Code == openai.CodeObjectiveUnreachable || o.Code == openai.CodeSaturated || o.Code == openai.CodeOverloaded:
		return metrics.ObjectiveRefused
	case o.Status < 200 || o.Status >= 300 || o.Log.TTFT <= 0 || o.Log.ClientGone:
		return ""
	case o.Log.TTFT <= o.Log.Objective:
		return metrics.ObjectiveMet
	}
	return metrics.ObjectiveMissed
}

// outcomeOf classifies a finished request: its metrics outcome and route
// label (none for a model that was not found).
func outcomeOf(o request.Outcome) (outcome, route string) {
	route = o.Log.Route
	outcome = metrics.OutcomeOK
	switch {
	case o.Log.ClientGone || o.Status == 499:
		outcome = metrics.OutcomeClientGone
	case o.Code == "model_not_found":
		outcome, route = metrics.OutcomeNotFound, ""
	case o.Code == "no_capacity":
		outcome = metrics.OutcomeNoCapacity
	case o.Code == "overloaded":
		outcome = metrics.OutcomeOverloaded
	case o.Code == openai.CodeSaturated:
		outcome = metrics.OutcomeShed
	case o.Code == openai.CodeObjectiveUnreachable:
		outcome = metrics.OutcomeObjective
	case o.Code == "internal_error":
		outcome = metrics.OutcomeInternalError
	case o.Streamed && o.Log.Committed && o.Status == http.StatusOK && !o.Log.Done:
		outcome = metrics.OutcomeUpstreamFailed
	case o.Status >= 400 && o.Status < 500:
		outcome = metrics.OutcomeClientError
	case o.Status >= 500:
		outcome = metrics.OutcomeUpstreamFailed
	}
	return outcome, route
}

// refreshGauges sets the worker gauges from the router's view, at scrape
// time.
func (g *Gateway) refreshGauges() {
	if g.Metrics == nil {
		return
	}
	res, err := g.sys.Root.RequestFuture(g.Router, &router.ListWorkers{}, time.Second).Result()
	if err != nil {
		return
	}
	wr, ok := res.(*router.WorkersResult)
	if !ok {
		return
	}
	listed := make(map[string]bool, len(wr.Workers))
	for _, w := range wr.Workers {
		listed[w.ID] = true
	}
	g.Metrics.DeleteWorkersExcept(listed)
	counts := map[metrics.WorkerKey]int{}
	for _, w := range wr.Workers {
		g.Metrics.SetInFlight(w.ID, w.InFlight)
		state := metrics.StateRoutable
		switch {
		case w.Drained:
			state = metrics.StateDrained
		case w.Draining:
			state = metrics.StateDraining
		case !w.Routable:
			continue
		}
		counts[metrics.WorkerKey{Model: w.Model, Role: string(w.Role), State: state}]++
	}
	g.Metrics.SetWorkers(counts)
	g.KV.SetViews(kvViews(wr.Workers))
	g.Metrics.SetOverload(wr.Queued, ejectedByModel(wr.Workers))
	var waiting []metrics.Waiting
	for q, bands := range wr.Bands {
		for _, b := range bands {
			waiting = append(waiting, metrics.Waiting{Queue: q, Priority: b.Priority, Key: b.Key, N: b.Waiting})
		}
	}
	g.Metrics.SetWaiting(waiting)
	var shares []metrics.KeyShare
	for _, sh := range g.limits.Shares() {
		shares = append(shares, metrics.KeyShare{Key: sh.Key, Limit: sh.Limit, Local: sh.Local})
	}
	g.Keys.SetShares(shares)
	g.Metrics.Epoch(wr.Epoch)
}
