package request

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// lastStep is a cascade step past any route's last: the router clamps it
// to the last step. APIs whose answers carry no OpenAI logprobs go there,
// as they cannot be judged.
const lastStep = 1 << 20

// pathID returns the {id} of GET or DELETE /v1/responses/{id}.
func pathID(path string) string {
	return strings.TrimPrefix(path, dialect.PathResponses+"/")
}

// retrieval reports whether the exchange is a GET or DELETE of a stored
// response: it runs no model, and the usage it shows was counted when the
// response was made.
func (a *requestActor) retrieval() bool {
	return a.ex.Method == http.MethodGet || a.ex.Method == http.MethodDelete
}

// storedID returns the stored response the exchange refers to: the
// previous_response_id of a POST, the {id} of a GET or DELETE.
func (a *requestActor) storedID() string {
	if a.retrieval() {
		return pathID(a.ex.Path)
	}
	return a.ex.Req.PreviousResponseID
}

// pinStored sets the pin of a request that refers to a stored response:
// the worker that stores it. It answers 404 itself, and reports false,
// when the gateway knows no worker for the id.
func (a *requestActor) pinStored(ctx actor.Context) bool {
	if !a.dialect.Stores() {
		return true
	}
	id := a.storedID()
	if id == "" {
		return true
	}
	var w string
	ok := false
	if a.d.Stored != nil {
		w, ok = a.d.Stored.Worker(id, a.ex.KeyName, time.Now())
	}
	if !ok {
		a.finish(ctx, Outcome{Status: http.StatusNotFound, Code: CodeResponseNotFound,
			Message: fmt.Sprintf("Response %q is not known to the gateway for this API key: it was not produced through it with this key, or its record expired.", id)})
		return false
	}
	a.pin = w
	return true
}

// CodeResponseNotFound answers a Responses API request whose stored
// response cannot be reached (404).
const CodeResponseNotFound = "response_not_found"

// pinnedGone is the answer when the worker that stores id is gone.
func pinnedGone(id, worker string) Outcome {
	return Outcome{Status: http.StatusNotFound, Code: CodeResponseNotFound,
		Message: fmt.Sprintf("Response %q was stored by worker %q, which is no longer in the fleet; stored responses live in the engine's memory and are lost with it.", id, worker)}
}

// pinnedUnavailable is the answer when the worker that stores id cannot
// take the request now (why: ejected, at its limit with no queue).
func pinnedUnavailable(id, worker, why string, retryAfter time.Duration) Outcome {
	if why == "" {
		why = fmt.Sprintf("worker %q, which stores it, cannot take a request now", worker)
	}
	secs := int((retryAfter + time.Second - 1) / time.Second)
	return Outcome{Status: http.StatusServiceUnavailable, Code: openai.CodeNoCapacity,
		Message: fmt.Sprintf("Response %q cannot be reached right now: %s; no other worker knows the id.", id, why),
		Header:  http.Header{"Retry-After": {strconv.Itoa(max(secs, 1))}}}
}

// pinnedFailed is the answer when the attempt on the worker that stores
// id failed: no other worker knows the id, so none is tried.
func pinnedFailed(id, worker string, err error) Outcome {
	o := exhausted("", 1, err)
	o.Message = fmt.Sprintf("Worker %q, which stores response %q, failed to answer (%s); no other worker knows the id.", worker, id, proxy.ReasonOf(err))
	return o
}

// remember records the worker of a stored response from a whole 200
// answer (a POST with store), and forgets a deleted one.
func (a *requestActor) remember(resp *proxy.Response) {
	if !a.dialect.Stores() || a.d.Stored == nil || resp.Status != http.StatusOK {
		return
	}
	switch a.ex.Method {
	case http.MethodDelete:
		a.d.Stored.Forget(pathID(a.ex.Path))
	case http.MethodGet:
	default:
		if a.ex.Req.Store {
			if id := resp.Answer.ID(); id != "" {
				a.d.Stored.Put(id, a.target.Worker.ID, a.ex.KeyName, time.Now())
			}
		}
	}
}

// rememberStreamed records the worker of a stored response from its
// stream's response.created event.
func (a *requestActor) rememberStreamed(r proxy.Result) {
	if !a.dialect.Stores() || a.d.Stored == nil || a.sniff == nil || !r.Committed || !a.ex.Req.Store {
		return
	}
	if id := a.sniff.ResponseID(); id != "" {
		a.d.Stored.Put(id, a.target.Worker.ID, a.ex.KeyName, time.Now())
	}
}
