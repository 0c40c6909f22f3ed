package request

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/internal/wire/chatbridge"
	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// bridgeToChat turns a Messages or Responses exchange into a chat
// completions one, for engines driven over chat completions (the legs of
// a disaggregated pair): the client's body is translated once and parsed
// as chat, the engines' answers are translated back (bridged,
// streamWriter), and the request goes on as chat (its cascade step stays
// the last, route). It answers 400 itself, and reports false, for a
// request that chat completions cannot carry, naming the field.
func (a *requestActor) bridgeToChat(ctx actor.Context) bool {
	if a.bridge != nil {
		return true
	}
	api, ok := chatbridge.Of(a.dialect)
	if !ok || a.ex.Method != http.MethodPost || a.ex.Path != api.String() {
		a.finish(ctx, Outcome{Status: http.StatusBadRequest, Code: openai.CodeInvalidRequest,
			Message: fmt.Sprintf("Model %q is served disaggregated (prefill/decode), which %s %s does not support.", a.ex.Req.Model, a.ex.Method, a.ex.Path)})
		return false
	}
	refuse := func(err error) bool {
		o := Outcome{Status: http.StatusBadRequest, Code: openai.CodeInvalidRequest}
		var fe *openai.FieldError
		if errors.As(err, &fe) {
			o.Message, o.Param = fe.Msg, fe.Param
		} else {
			o.Message = err.Error()
		}
		o.Message = fmt.Sprintf("Model %q is served disaggregated (prefill/decode), over chat completions, which cannot carry this request: %s", a.ex.Req.Model, o.Message)
		a.finish(ctx, o)
		return false
	}
	b, chat, err := chatbridge.New(api, a.ex.Req.Object.Bytes())
	if err != nil {
		return refuse(err)
	}
	req, err := openai.ParseRequest(chat, true)
	if err != nil {
		return refuse(fmt.Errorf("as chat completions: %w", err))
	}
	req.CacheSalt = a.ex.Req.CacheSalt // the key's, as the edge set it
	req.AsksUsage = true               // the bridge ends the client's stream with it
	req.Endpoint = a.ex.Req.Endpoint   // the client's, for metrics; answers are judged as chat (expect)
	// The prompt as routing rendered it: the request's prefix hashes,
	// kept across its Routes (a failover's), were taken from it.
	req.Prompt, req.PrefixKey = a.ex.Req.Prompt, a.ex.Req.PrefixKey
	a.ex.Req, a.dialect, a.bridge = req, dialect.OpenAI, b
	return true
}

// enginePath is the path attempts are sent to: chat completions' once
// the exchange is bridged, else the client's.
func (a *requestActor) enginePath() string {
	if a.bridge != nil {
		return chatbridge.ChatPath
	}
	return a.ex.Path
}

// expect is the endpoint whose answer an attempt must get: chat
// completions once the exchange is bridged, else the client's.
func (a *requestActor) expect() openai.Endpoint {
	if a.bridge != nil {
		return openai.EndpointChat
	}
	return a.ex.Req.Endpoint
}

// bridged translates a whole answer of a bridged exchange into the
// client's API: a chat completion into its answer, an engine's error into
// its error shape. An answer that is not a chat completion is a bad
// gateway.
func (a *requestActor) bridged(o Outcome) Outcome {
	if a.bridge == nil || o.Streamed || len(o.Body) == 0 {
		return o
	}
	body, err := a.bridge.Answer(o.Status, o.Body)
	if err != nil {
		return Outcome{Status: http.StatusBadGateway, Code: openai.CodeUpstreamFailed,
			Message: fmt.Sprintf("The engine's answer to the %s request, sent as chat completions, could not be read back: %v", a.bridge.API(), err)}
	}
	if o.Header == nil {
		o.Header = http.Header{}
	}
	o.Header.Set("Content-Type", "application/json")
	o.Body = body
	return o
}
