package request

import (
	"net/http"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// MaxEngineAnswers is how many workers a request tries whose engine
// answers it with an OpenAI-shaped 5xx error (proxy.FailEngineError)
// before that answer is the client's: the first may be the engine's
// trouble, a second one like it says the request is at fault.
const MaxEngineAnswers = 2

// engineAnswered handles an attempt that failed with an engine's
// OpenAI-shaped error (its failure was reported with a reason that does
// not count towards ejection): the first one is tried once more
// elsewhere, remembering the worker; a second one, or one with no attempt
// left, is relayed to the client. It reports whether the request ended.
func (a *requestActor) engineAnswered(ctx actor.Context, err error, worker string) bool {
	ans := proxy.EngineAnswer(err)
	if ans == nil {
		return false
	}
	a.engineAnswers++
	a.engineAnswer = ans
	if a.engineAnswers == 1 {
		a.doubted, a.doubtedStep = worker, a.target.CascadeStep
	}
	if a.engineAnswers < MaxEngineAnswers && a.failures() < a.d.MaxAttempts {
		return false
	}
	a.doubted = "" // the request is at fault, not the first worker
	a.releaseHeld(ctx)
	a.relayEngineAnswer(ctx)
	return true
}

// relayEngineAnswer answers the client with the last engine error.
func (a *requestActor) relayEngineAnswer(ctx actor.Context) {
	ans := a.engineAnswer
	h := http.Header{}
	if ct := ans.Header.Get("Content-Type"); ct != "" {
		h.Set("Content-Type", ct)
	}
	a.finish(ctx, Outcome{Status: ans.Status, Header: h, Body: ans.Body})
}

// blameDoubted runs when an attempt answered with status: a 2xx from
// another worker of the same cascade step (the same model) shows that the
// worker which answered this request with an engine error failed it,
// which then counts towards its ejection. A later step's answer shows
// nothing of the sort: a larger model may answer what a smaller one
// cannot.
func (a *requestActor) blameDoubted(ctx actor.Context, status int) {
	if a.doubted == "" || status/100 != 2 || a.target.CascadeStep != a.doubtedStep {
		return
	}
	ctx.Send(a.d.Router, &router.AttemptFailed{WorkerID: a.doubted, Reason: string(proxy.FailStatus5xx)})
	a.doubted = ""
}
