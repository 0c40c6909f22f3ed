// Package request is the per-request actor. One is spawned for every client
// request by the HTTP edge; it runs the request protocol by messages:
// route → attempt → on an uncommitted failure exclude the worker and route
// again (at most MaxAttempts workers) → done; cascades step from a small
// model to a larger one on the answer's logprobs; disaggregated routes run
// tokenize → prefill → decode → release. Every piece of I/O runs in a
// goroutine off the mailbox and reports back as a message; the actor never
// blocks. It releases what it acquired (in-flight slots, KV handles) on
// every path, also when it panics: it is supervised with a stop directive
// and its Stopped handler releases whatever is still held.
package request

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/trace"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/prefixindex"
	"github.com/tlgate/tlgate/internal/wire/chatbridge"
	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/proxy"
)

// Deps are the actor's collaborators.
type Deps struct {
	Router      *actor.PID
	Proxy       *proxy.Proxy
	Engines     Engines
	MaxAttempts int
	// Scheme of the engines' HTTP surface: "http" (default) or "https".
	Scheme string
	// NoCapacityRetryAfter is the Retry-After of a no_capacity answer the
	// router did not give one for (every attempt failed); zero: 1 s.
	NoCapacityRetryAfter time.Duration
	// Hooks for metrics and tests; each may be nil. They run inside the
	// actor and must not block.
	OnRouted   func(ex *Exchange, t router.Target, took time.Duration)
	OnFailover func(ex *Exchange, t router.Target, reason string)
	OnCascade  func(ex *Exchange, route string, step int, accepted bool)
	// OnAnswered receives every whole answer an attempt got, before the
	// actor takes what it needs from it.
	OnAnswered func(ex *Exchange, resp *proxy.Response)
	OnKV       func(event string, d time.Duration) // "prefill", "release", "failure:<phase>"
	// OnPD receives a disaggregated request's report when it ends.
	OnPD func(ex *Exchange, r PDReport)
	// Tracer records the request's spans (trace.go); nil: tracing off.
	Tracer trace.Tracer
	// Dispatcher runs the request actors' mailboxes (an actorsys.Pool);
	// nil: protoactor's default, a new goroutine each time.
	Dispatcher actor.Dispatcher
	// Stored records the worker of each stored Responses API response
	// (internal/routing/sticky); nil: no follow-up can be routed.
	Stored StoredResponses
	// Tokenizer gets prompts' tokens for routing on the engines' KV cache
	// events (tokens.go), within TokenizeTimeout; nil: requests are routed
	// on the prefix index. OnTokenized and OnTokenCache are its metrics'
	// hooks (each may be nil).
	Tokenizer       Tokenizer
	TokenizeTimeout time.Duration
	OnTokenized     func(outcome string, d time.Duration)
	OnTokenCache    func(result string)
	// Detached counts the calls a request leaves running after its answer
	// (a KV handle's Release), so that shutdown can wait for them before
	// it closes the engine client; nil: the answer waits for them.
	Detached *sync.WaitGroup
}

// StoredResponses maps stored response ids to the worker that holds them
// and the API key (its name) that owns them: Worker finds only a key's
// own.
type StoredResponses interface {
	Put(id, worker, key string, now time.Time)
	Worker(id, key string, now time.Time) (string, bool)
	Forget(id string)
}

// Props returns the props of one request actor for ex. Spawn it with the
// supervisor returned by Guardian, so a panic stops it (and its Stopped
// handler cleans up) instead of restarting it with a half-done request.
func Props(d *Deps, ex *Exchange) *actor.Props {
	p := actor.PropsFromProducer(func() actor.Actor { return &requestActor{d: d, ex: ex} },
		actor.WithGuardian(Guardian))
	if d.Dispatcher != nil {
		p.Configure(actor.WithDispatcher(d.Dispatcher))
	}
	return p
}

// Guardian stops a failing request actor.
var Guardian = actor.NewOneForOneStrategy(0, 0, func(any) actor.Directive { return actor.StopDirective })

// Messages from the actor's goroutines.
type (
	fetched struct {
		resp *proxy.Response
		err  error
	}
	streamed  struct{ res proxy.Result }
	tokenized struct {
		ids   []uint32
		model string // the served model whose tokenizer gave ids
		err   error
	}
	prefilled struct {
		handle string
		took   time.Duration
		err    error
	}
)

type requestActor struct {
	d       *Deps
	ex      *Exchange
	dialect *dialect.Dialect // the exchange's API
	pin     string           // the only worker that may serve a Responses follow-up
	media   uint8            // the request has media (noAsk): 0 not known yet, 1 no, 2 yes

	attempts int
	// judged counts the attempts a cascade step answered and escalated:
	// attempts that did not fail, so they leave the failover budget
	// (MaxAttempts) alone.
	judged   int
	step     int
	exclude  map[string]bool // the workers failed; nil until the first failure
	target   router.Target
	held     []string // worker ids whose in-flight slot is held
	handle   string   // KV handle held on target's decode worker
	cancel   context.CancelFunc
	log      Log
	seed     uint64
	ids      []uint32 // the prompt's token ids, tokenized for idsModel
	idsModel string
	finished bool
	// prefillFailed lists prefill workers whose Prefill failed once.
	prefillFailed []string
	// sniff reads the usage of the current streamed attempt.
	sniff *dialect.Writer
	// routing: a Route request is outstanding (it may wait in the router's
	// queue); leaving: its client went away and Leave was sent; unwatch
	// stops the client watch (overload.go).
	routing, leaving bool
	unwatch          func() bool
	reported         int         // the attempt whose outcome the router was told
	tr               *traceState // nil: tracing off
	lastErr          error       // the last failed attempt's error
	// engineAnswers counts the attempts an engine answered with an
	// OpenAI-shaped 5xx error (proxy.FailEngineError); engineAnswer is the
	// last one, for the client, and doubted the worker that answered the
	// first, blamed only if another worker answers the request (engine.go).
	engineAnswers int
	engineAnswer  *proxy.Response
	doubted       string
	doubtedStep   int // the cascade step doubted answered on
	// generations counts the attempts that timed out generating a whole
	// answer (proxy.IsGenerating).
	generations int
	// pd is a disaggregated request's state across its pairs (pd.go).
	pd *pdState
	// bridge translates a Messages or Responses exchange to chat
	// completions and back, once it is sent to engines driven over chat
	// (a disaggregated pair's legs); nil: the engines speak the client's
	// API (bridge.go).
	bridge *chatbridge.Bridge
	// kept is the last cascade step's answer that was escalated from, and
	// failedStep the step a failed route or attempt was for
	// (escalation.go).
	kept       *keptAnswer
	failedStep int
	// rewrites counts the attempts' bodies built from the request's
	// (body): one per attempt and prefill leg.
	rewrites int
	// hashes keeps the prompt's chunk hashes across the request's Routes
	// (router.Request.Hashes): the router's to fill, never touched here.
	hashes prefixindex.PromptHashes
	// attemptStart is when the current attempt was sent.
	attemptStart time.Time
	// tokens and noTokens are the prompt's tokens per base model, and the
	// models whose tokens could not be had (tokens.go); keys their block
	// keys, the router's to fill.
	tokens   map[string][]uint32
	noTokens map[string]bool
	partial  map[string]bool
	keys     router.TokenKeys
}

// Receive is the actor's switch; each case calls one step of the protocol.
func (a *requestActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.held = make([]string, 0, 2)
		a.dialect = dialect.Of(a.ex.Path)
		a.traceStart()
		a.watchClient(ctx)
		a.route(ctx)
	case *clientLeft:
		a.onClientLeft(ctx)
	case *router.RouteResult:
		a.routed(ctx, m)
	case *fetched:
		a.onFetched(ctx, m)
	case *streamed:
		a.onStreamed(ctx, m)
	case *tokenized:
		a.onTokenized(ctx, m)
	case *tokensFor:
		a.onTokens(ctx, m)
	case *prefilled:
		a.onPrefilled(ctx, m)
	case *legAnswered:
		a.onLegAnswered(ctx, m)
	case *actor.Stopped:
		a.cleanup(ctx)
	}
}

func (a *requestActor) route(ctx actor.Context) {
	if a.ex.Ctx.Err() != nil {
		a.log.ClientGone = true
		a.finish(ctx, Outcome{Status: 499, Code: "client_closed", Message: "client closed the request"})
		return
	}
	step := a.step
	if !a.dialect.Completions() || a.bridge != nil {
		step = lastStep
	}
	if !a.pinStored(ctx) {
		return
	}
	a.traceRoute()
	ctx.Request(a.d.Router, &router.Route{Request: router.Request{
		Model: a.ex.Req.Model, RequestID: a.ex.RequestID, PrefixKey: a.ex.Req.PrefixKey,
		Stream: a.ex.Req.Stream, Unjudged: !a.ex.Req.Judgeable(), Step: step, Exclude: a.exclude, Key: a.ex.KeyName, Prompt: a.ex.Req.Prompt,
		LeastLoaded: a.ex.Req.Endpoint.Pooling(), AnyRole: a.ex.Req.Endpoint.Tokenizer(), Pin: a.pin, CacheSalt: a.ex.Req.CacheSalt,
		Hashes: &a.hashes, Ask: a.ex.Ask, Tokens: a.tokens, NoTokens: a.noTokens, NoAsk: a.noAsk(), Partial: a.partial, Keys: &a.keys,
		KeepPrefill: a.keepPrefill(),
	}})
	a.routing = true
}

func (a *requestActor) routed(ctx actor.Context, m *router.RouteResult) {
	a.traceRouted(m)
	a.routing = false
	a.log.Priority, a.log.Objective = m.Class.Priority, m.Class.Objective
	if m.Err != nil && a.log.Route == "" {
		a.log.Route = m.Route // refused before any target: counted under the route it matched
	}
	if a.admissionAnswer(ctx, m) {
		return
	}
	var nt *router.NeedTokensError
	if m.Err != nil && errors.As(m.Err, &nt) && !a.noAsk() {
		a.needTokens(ctx, nt)
		return
	}
	if m.Err != nil {
		a.noteFailedStep(m)
		switch {
		case errors.Is(m.Err, router.ErrPinnedGone):
			a.finish(ctx, pinnedGone(a.storedID(), a.pin))
		case a.pin != "" && a.attempts == 0 && errors.Is(m.Err, router.ErrNoCapacity):
			var nc *router.NoCapacityError
			why := ""
			if errors.As(m.Err, &nc) {
				why = nc.Why
			}
			a.finish(ctx, pinnedUnavailable(a.storedID(), a.pin, why, m.RetryAfter))
		case errors.Is(m.Err, router.ErrModelNotFound):
			a.finish(ctx, Outcome{Status: http.StatusNotFound, Code: openai.CodeModelNotFound, Param: "model",
				Message: fmt.Sprintf("The model %q does not exist.", a.ex.Req.Model)})
		case a.engineAnswer != nil:
			a.relayEngineAnswer(ctx)
		case a.failures() > 0 && a.lastErr != nil:
			a.finish(ctx, exhausted(a.ex.Req.Model, a.failures(), a.lastErr))
		default:
			a.finish(ctx, a.noCapacity(m))
		}
		return
	}
	t := m.Target
	a.target = t
	a.held = append(a.held, t.Worker.ID)
	if t.Prefill != nil {
		a.held = append(a.held, t.Prefill.ID)
	}
	a.attempts++
	a.log.Attempts = a.attempts
	a.log.Route, a.log.ServedModel, a.log.Worker, a.log.Reason, a.log.CascadeStep = t.Route, t.ServedModel, t.Worker.ID, t.Reason, t.CascadeStep
	a.skipped(t.Skipped)
	a.step = t.CascadeStep // a retry on this step skips no step again
	// The log names the pair of the target that answers: a cascade step
	// served unified after a disaggregated one has none.
	a.log.Prefill, a.log.Protocol, a.log.PrefillReason, a.log.DecodeReason = "", "", "", ""
	if t.Prefill != nil {
		a.log.Prefill = t.Prefill.ID
	}
	if a.d.OnRouted != nil {
		a.d.OnRouted(a.ex, t, m.Took)
	}
	if t.Disaggregated() {
		a.disaggregate(ctx) // pd.go
		return
	}
	a.attempt(ctx, nil)
}
