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
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/trace"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/prefixindex"
	"github.com/tlgate/tlgate/internal/wire/dialect"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/proxy"
	"github.com/tlgate/tlgate/internal/wire/usage"
)

// Exchange is one client request as the edge hands it over, and the channel
// on which the actor hands back its outcome. The edge waits on Done, then on
// Wait (no attempt goroutine may still touch the response writer), then
// writes Outcome unless the response was already committed by a stream.
type Exchange struct {
	Ctx context.Context // the client's request context
	W   http.ResponseWriter
	// Req is the request as the edge parsed it, once: its body's bytes
	// and layout are Req.Object, which attempts rewrite without parsing.
	Req  openai.Request
	Path string // the path asked of the engine: "/v1/chat/completions", "/v1/embeddings", "/v1/responses[/{id}]"...
	// Method is the client's method: POST (or empty), or GET and DELETE
	// of /v1/responses/{id}, which carry no body.
	Method    string
	RequestID string // the gateway's own id (routing, logs, the engine's X-Request-Id)
	// ClientRequestID is the client's own id, checked (httpedge), or "":
	// logged and passed on, never routed on.
	ClientRequestID string
	KeyName         string
	// Ask is what the request's headers and its key say of its priority,
	// TTFT objective and fairness id; the router resolves it.
	Ask      router.Ask
	Debug    bool // the key has the debug scope: X-TL-Route and X-TL-Cascade-Step
	Received time.Time
	// Tokens, if set, is the key's tokens budget: a stream reports its
	// usage to it as it goes and is ended with a rate_limit_exceeded event
	// once it refuses more.
	Tokens Budget
	// Salt says how attempts' bodies carry Req.CacheSalt, which the edge
	// set to the key's salt (auth.Key.CacheSalt).
	Salt Salt

	Done      chan Outcome // buffered (1); receives exactly one Outcome
	wg        sync.WaitGroup
	committed atomic.Bool
	trace     *trace.SpanContext // the request span's, set by the actor (nil: tracing off)
}

// Salt is how an attempt's body carries the request's cache_salt.
type Salt uint8

// The ways a body carries Exchange.Req.CacheSalt.
const (
	// SaltAsSent: the body holds it already (or none), as the client sent it.
	SaltAsSent Salt = iota
	// SaltReplace: it replaces the client's own cache_salt.
	SaltReplace
	// SaltAdd: the client sent none; it is added for engines that take
	// one (openai.TakesCacheSalt) on endpoints that compute a prompt.
	SaltAdd
)

// Budget is a key's hold on its tokens (a ratelimit.Reservation). Use gets
// the request's running total (prompt + completion) and reports whether it
// may go on.
type Budget interface {
	Use(tokens int) bool
}

// NewExchange returns an exchange ready to hand to the actor.
func NewExchange(ctx context.Context, w http.ResponseWriter, req openai.Request, path, requestID string) *Exchange {
	return &Exchange{Ctx: ctx, W: w, Req: req, Path: path, RequestID: requestID, Received: time.Now(), Done: make(chan Outcome, 1)}
}

// Wait blocks until no attempt goroutine of the exchange is running.
func (ex *Exchange) Wait() { ex.wg.Wait() }

// Committed reports whether bytes of a streamed answer reached the client.
func (ex *Exchange) Committed() bool { return ex.committed.Load() }

// Outcome is the actor's verdict, for the edge to write and log.
type Outcome struct {
	Status int
	Header http.Header
	Body   []byte // the whole response, when not streamed
	// Code and Message describe an error answer (Body empty); Param, when
	// set, names the request field the error is about.
	Code, Message, Param string
	// Streamed: the response was written by a stream attempt.
	Streamed bool
	Log      Log
}

// Log is what the access log and metrics need of a finished request.
type Log struct {
	Route, ServedModel, Worker, Prefill, Reason string
	Attempts, CascadeStep                       int
	Committed, ClientGone                       bool
	Done                                        bool // a stream ended cleanly
	FirstByte                                   time.Duration
	Failures                                    []string // reason of each failed attempt
	Escalations                                 int
	Phase                                       string // disaggregated: the phase that failed
	LastError                                   string // the last failed attempt's error
	// Usage is the tokens the answers used (every answered cascade step),
	// estimated when an engine reported none (internal/wire/usage).
	Usage usage.Usage
	// EscalationFailed says which later cascade step could not run and
	// why ("step 1 (big): no_capacity"), when the cascade escalated from
	// an answer (escalation.go).
	EscalationFailed string
	// StreamFailure is why a committed stream failed (a proxy.Failure:
	// timeout, eof, bad_answer...; or rate_limit_exceeded, cut at its key's
	// tokens budget); the client got the error event.
	StreamFailure string
	// Skipped lists the cascade steps passed over for want of a routable
	// worker ("step 0 (small): route small needs ..."), in order.
	Skipped []string
	// NoCapacity is what was missing when the request was answered
	// no_capacity without an attempt (router.NoCapacityError.Why).
	NoCapacity string
	// AbandonedAttempts counts the non-streamed attempts that ended with
	// no answer (a generation timeout, the client gone) whose estimated
	// engine work is in Usage (chargeAbandoned).
	AbandonedAttempts int
	// Disaggregated requests (pd.go): the pair's protocol, why each of its
	// workers was picked, the pairs tried, the last pair's legs and the
	// legs that failed ("prefill p1: timeout").
	Protocol, PrefillReason, DecodeReason string
	Pairs                                 int
	PrefillLeg, DecodeLeg, TransferWait   time.Duration
	LegFailures                           []string
	// Priority and Objective are the request's class as the router
	// resolved it (Objective 0: none); TTFT is the time from its arrival
	// to the first byte of its answer (a whole answer, not streamed; 0
	// when none was answered).
	Priority  int
	Objective time.Duration
	TTFT      time.Duration
}

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
		ids []uint32
		err error
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

	attempts int
	step     int
	exclude  map[string]bool
	target   router.Target
	held     []string // worker ids whose in-flight slot is held
	handle   string   // KV handle held on target's decode worker
	cancel   context.CancelFunc
	log      Log
	seed     uint64
	ids      []uint32
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
		a.exclude = map[string]bool{}
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
	if !a.dialect.Completions() {
		step = lastStep
	}
	if !a.pinStored(ctx) {
		return
	}
	a.traceRoute()
	ctx.Request(a.d.Router, &router.Route{Request: router.Request{
		Model: a.ex.Req.Model, RequestID: a.ex.RequestID, PrefixKey: a.ex.Req.PrefixKey,
		Stream: a.ex.Req.Stream, Step: step, Exclude: a.exclude, Key: a.ex.KeyName, Prompt: a.ex.Req.Prompt,
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
	if a.admissionAnswer(ctx, m) {
		return
	}
	var nt *router.NeedTokensError
	if errors.As(m.Err, &nt) && !a.noAsk() {
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
		case a.attempts > 0 && a.lastErr != nil:
			a.finish(ctx, exhausted(a.ex.Req.Model, a.attempts, a.lastErr))
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

// body is an attempt's body: the client's, as the edge read it once
// (Request.Object), with the attempt's edits and extra spliced in, in one
// copy; none for a GET or DELETE.
func (a *requestActor) body(seed *uint64, extra ...openai.Edit) []byte {
	if a.ex.Method == http.MethodGet || a.ex.Method == http.MethodDelete {
		return nil
	}
	a.rewrites++
	return a.ex.Req.Object.With(append(a.edits(seed), extra...)...)
}

// edits are what an attempt changes in the client's body: the model (the
// served id) and the key's cache_salt (as ex.Salt says); on completions
// and chat also, for a cascade step that is not the last, logprobs forced
// on, the seed a prefill leg was sent (seed not nil), and for a stream the
// ask for its usage chunk.
func (a *requestActor) edits(seed *uint64) []openai.Edit {
	req := &a.ex.Req
	edits := make([]openai.Edit, 0, 6)
	edits = append(edits, openai.SetString("model", a.target.ServedModel))
	if a.saltAdded() {
		edits = append(edits, openai.SetString("cache_salt", req.CacheSalt))
	}
	if !a.dialect.Completions() {
		return edits
	}
	if a.target.CascadeStep < a.target.CascadeSteps-1 && !req.Stream {
		if e, ok := req.Object.ForceLogprobs(req.Chat, openai.LeastLogprobs(a.target.Worker.Kind)); ok {
			edits = append(edits, e)
		}
	}
	if seed != nil {
		edits = append(edits, openai.SetUint("seed", *seed))
	}
	if req.Stream {
		if e, ok := req.Object.AskUsage(); ok {
			edits = append(edits, e)
		}
	}
	return edits
}

// saltAdded reports whether the body carries the request's cache_salt in
// place of what the client sent, as ex.Salt says.
func (a *requestActor) saltAdded() bool {
	switch a.ex.Salt {
	case SaltReplace:
		return true
	case SaltAdd:
		return !a.ex.Req.Endpoint.Tokenizer() && openai.TakesCacheSalt(a.target.Worker.Kind)
	}
	return false
}

// attempt sends the request to the target's worker from a goroutine.
func (a *requestActor) attempt(ctx actor.Context, extra http.Header) {
	var seed *uint64
	if a.target.Protocol() == fleet.ProtocolTLGate {
		seed = &a.seed // tlgate's contract: the seed P prefilled with
	}
	body := a.body(seed, a.pdEdits()...)
	h := http.Header{"X-Request-Id": {a.ex.RequestID}, "Content-Type": {"application/json"}}
	if a.ex.ClientRequestID != "" {
		h.Set("X-Client-Request-Id", a.ex.ClientRequestID)
	}
	for k, v := range extra {
		h[k] = v
	}
	a.traceInject(h)
	a.traceDecodeLeg()
	scheme := a.d.Scheme
	if scheme == "" {
		scheme = "http"
	}
	att := proxy.Attempt{URL: scheme + "://" + a.target.Worker.HTTPAddress + a.ex.Path, Body: body, Header: h,
		Expect: a.ex.Req.Endpoint, Method: a.ex.Method, Dialect: a.dialect}
	actx, cancel := context.WithCancel(a.ex.Ctx)
	a.cancel = cancel
	started := time.Now()
	a.attemptStart = started
	self, root, ex, p := ctx.Self(), ctx.ActorSystem().Root, a.ex, a.d.Proxy
	ex.wg.Add(1)
	if !ex.Req.Stream {
		go func() {
			defer ex.wg.Done()
			resp, err := p.Fetch(actx, att)
			root.Send(self, &fetched{resp: resp, err: err})
		}()
		return
	}
	debug, target, step, rt := ex.Debug, a.target, a.target.CascadeStep, a.d.Router
	worker := target.Worker.ID
	sw := a.streamWriter()
	go func() {
		defer ex.wg.Done()
		res := p.Stream(actx, att, sw, func(status int, uh http.Header) {
			ex.committed.Store(true)
			reportAnswer(root.Send, rt, target, status, time.Since(started))
			responseHeaders(ex.W.Header(), ex.RequestID, debug, worker, cascadeStep(target, step))
		})
		root.Send(self, &streamed{res: res})
	}()
}

func (a *requestActor) onFetched(ctx actor.Context, m *fetched) {
	a.endAttempt(ctx)
	a.traceAnswered(statusOf(m.resp), 0, m.err)
	a.pdDecodeEnded(0)
	if m.err != nil {
		phase := "attempt"
		if a.target.Disaggregated() {
			phase = PhaseDecode
		}
		a.failed(ctx, m.err, phase)
		return
	}
	if a.pdHold(m.resp) { // pd_sglang.go: the prefill's prompt logprobs are to come
		return
	}
	a.answered(ctx, a.withPromptLogprobs(m.resp))
}

// answered handles an engine's whole answer: judged by a cascade step, or
// relayed.
func (a *requestActor) answered(ctx actor.Context, resp *proxy.Response) {
	if a.d.OnAnswered != nil {
		a.d.OnAnswered(a.ex, resp)
	}
	a.reportFetched(ctx, resp.Status)
	a.blameDoubted(ctx, resp.Status)
	a.countFetched(resp)
	if a.target.CascadeStep < a.target.CascadeSteps-1 && resp.Status == http.StatusOK {
		accepted := a.judge(&resp.Answer)
		if a.d.OnCascade != nil {
			a.d.OnCascade(a.ex, a.target.Route, a.target.CascadeStep, accepted)
		}
		if !accepted {
			a.keep(resp)
			a.releaseHeld(ctx)
			a.log.Escalations++
			a.traceAttemptEnd(OutcomeEscalated, "", nil)
			a.step = a.target.CascadeStep + 1
			a.route(ctx)
			return
		}
	}
	a.remember(resp)
	body := resp.Body
	if a.target.CascadeStep < a.target.CascadeSteps-1 {
		body = a.unforced(&resp.Answer)
	}
	h := http.Header{}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		h.Set("Content-Type", ct)
	}
	a.log.TTFT = time.Since(a.ex.Received)
	a.finish(ctx, Outcome{Status: resp.Status, Header: h, Body: body})
}

// unforced strips from a cascade step's answer the logprobs the client
// did not ask for: all of them, or the alternatives per token beyond the
// number it asked for when the engine was asked for more (LeastLogprobs).
// The answer is the one the proxy read (proxy.Response.Answer): nothing
// parses it again.
func (a *requestActor) unforced(ans *dialect.Answer) []byte {
	if !a.ex.Req.Logprobs {
		return ans.StripLogprobs()
	}
	if asked := a.ex.Req.LogprobsTop; !a.ex.Req.Chat && asked != nil && *asked < openai.LeastLogprobs(a.target.Worker.Kind) {
		return ans.TrimTopLogprobs(*asked)
	}
	return ans.Body
}

// judge applies the step's accept_if to the answer's logprobs; an answer
// without readable logprobs or tokens is never accepted.
func (a *requestActor) judge(ans *dialect.Answer) bool {
	lps, err := ans.Logprobs()
	ok := err == nil && a.target.Rule.Holds(lps)
	a.traceJudged(lps, ok)
	return ok
}

func (a *requestActor) onStreamed(ctx actor.Context, m *streamed) {
	a.endAttempt(ctx)
	r := m.res
	if a.overBudget() {
		// The Writer ended the stream with rate_limit_exceeded; the client
		// did not go away.
		r.ClientGone = false
		a.log.StreamFailure = openai.CodeRateLimitExceeded
	}
	if !r.Committed && r.ClientGone && a.ex.Ctx.Err() == nil && a.pd != nil && a.pd.prefillErr != nil {
		// Canceled here when its pair's prefill leg failed (pd_sglang.go).
		r.ClientGone = false
	}
	a.rememberStreamed(r)
	a.countStreamed(r)
	a.traceAnswered(r.Status, r.FirstByte, r.Err)
	a.pdDecodeEnded(r.FirstByte)
	a.log.FirstByte = r.FirstByte
	if r.Committed {
		a.log.TTFT = a.attemptStart.Sub(a.ex.Received) + r.FirstByte
	}
	a.log.Committed = r.Committed
	a.log.ClientGone = r.ClientGone
	a.log.Done = r.Done
	if r.Committed && r.Err != nil {
		// The engine cut the stream, or the client stopped reading it or
		// went away: either way it was answered 200; the log says which.
		a.log.LastError = r.Err.Error()
		if !r.ClientGone && a.log.StreamFailure == "" {
			a.log.StreamFailure = string(proxy.ReasonOf(r.Err))
		}
	}
	if !r.Committed && !r.ClientGone && r.Err != nil {
		a.failed(ctx, r.Err, "decode")
		return
	}
	if r.Answer != nil { // an engine's error answer, relayed as a whole
		a.answered(ctx, r.Answer)
		return
	}
	if r.Committed {
		a.blameDoubted(ctx, r.Status)
	}
	if r.Done && a.target.Disaggregated() {
		a.handle = "" // the decode worker freed the blocks when the stream ended
	}
	a.finish(ctx, Outcome{Status: r.Status, Streamed: true})
}

// failed handles an attempt that failed before the first byte: exclude the
// worker(s) and route again, within MaxAttempts.
func (a *requestActor) failed(ctx actor.Context, err error, phase string) {
	phase, err = a.pdFailure(phase, err)
	reason := "error"
	var ae *proxy.AttemptError
	if errors.As(err, &ae) {
		reason = string(ae.Reason)
	}
	a.traceAttemptEnd(OutcomeFailed, reason, err)
	generating := proxy.IsGenerating(err)
	if generating || proxy.ReasonOf(err) == proxy.FailCanceled {
		a.chargeAbandoned()
	}
	if a.ex.Ctx.Err() != nil {
		a.log.ClientGone = true
		a.finish(ctx, Outcome{Status: 499, Code: "client_closed", Message: "client closed the request"})
		return
	}
	if a.pin != "" {
		a.log.Failures = append(a.log.Failures, reason)
		a.log.LastError, a.lastErr = err.Error(), err
		a.reportFailure(ctx, a.pin, reason, generating)
		if ans := proxy.EngineAnswer(err); ans != nil {
			// The engine's own error is the client's answer: no other
			// worker could be asked, and its words say what went wrong.
			a.engineAnswer = ans
			a.relayEngineAnswer(ctx)
			return
		}
		a.finish(ctx, pinnedFailed(a.storedID(), a.pin, err))
		return
	}
	if a.target.Disaggregated() {
		a.log.Phase = phase
		if a.d.OnKV != nil {
			a.d.OnKV("failure:"+phase, 0)
		}
	}
	a.log.Failures = append(a.log.Failures, reason)
	a.log.LastError = err.Error()
	a.lastErr = err
	a.failedStep = a.target.CascadeStep
	if a.d.OnFailover != nil {
		a.d.OnFailover(a.ex, a.target, reason)
	}
	blamed := ExcludeAfter(a.target, phase, a.prefillFailed)
	a.exclude[blamed] = true
	if also := a.pdFailed(phase, reason, blamed); also != "" {
		a.exclude[also] = true
	}
	a.reportFailure(ctx, blamed, reason, generating)
	if a.engineAnswered(ctx, err, blamed) {
		return
	}
	if generating {
		if a.generations++; a.generations >= MaxGenerationTimeouts {
			a.releaseHeld(ctx)
			a.finish(ctx, generationTimedOut(a.ex.Req.Model, a.generations))
			return
		}
	}
	if phase == PhasePrefill {
		a.prefillFailed = append(a.prefillFailed, a.target.Prefill.ID)
	}
	a.releaseHeld(ctx)
	if escalatesOnFailure(a.target, err) {
		if a.d.OnCascade != nil {
			a.d.OnCascade(a.ex, a.target.Route, a.target.CascadeStep, false)
		}
		a.log.Escalations++
		a.step = a.target.CascadeStep + 1
	}
	if a.attempts >= a.d.MaxAttempts {
		a.finish(ctx, exhausted(a.ex.Req.Model, a.attempts, err))
		return
	}
	a.route(ctx)
}

// ExcludeAfter returns the worker to exclude after an attempt failed in
// phase. Under the engines' protocols each leg is one engine's request: a
// failed prefill leg blames the prefill worker, any other the decode
// worker. Under tlgate's contract, tokenize runs on the prefill worker
// alone, so it is the one to blame; a failed Prefill may be the prefill
// worker's fault or the decode worker's (P pushes the KV to D), so D is
// excluded first and P only when it fails a second time, with another D.
func ExcludeAfter(t router.Target, phase string, prefillFailed []string) string {
	switch {
	case t.Prefill == nil:
		return t.Worker.ID
	case t.Protocol() != fleet.ProtocolTLGate:
		// The engines' protocols: each leg is one engine's request.
		if phase == PhasePrefill {
			return t.Prefill.ID
		}
		return t.Worker.ID
	case phase == PhaseTokenize:
		return t.Prefill.ID
	case phase == PhasePrefill && slices.Contains(prefillFailed, t.Prefill.ID):
		return t.Prefill.ID
	}
	return t.Worker.ID
}

func (a *requestActor) endAttempt(_ actor.Context) {
	if a.cancel != nil {
		a.cancel()
		a.cancel = nil
	}
}

// releaseHeld returns the in-flight slots and the KV handle.
func (a *requestActor) releaseHeld(ctx actor.Context) {
	for _, id := range a.held {
		ctx.Send(a.d.Router, &router.Release{WorkerID: id})
	}
	a.held = a.held[:0]
	a.releaseHandle()
}

func (a *requestActor) finish(ctx actor.Context, o Outcome) {
	if a.finished {
		return
	}
	a.finished = true
	a.stopWatching()
	a.releaseHeld(ctx)
	a.endAttempt(ctx)
	a.pdEnd()
	o = a.escalationFailed(o)
	if o.Header == nil {
		o.Header = http.Header{}
	}
	if o.Code == openai.CodeNoCapacity && o.Header.Get("Retry-After") == "" {
		// Every no_capacity answer says when to come back: the clients
		// that read it retry then, not at once nor never.
		o.Header.Set("Retry-After", retryAfter(a.d.NoCapacityRetryAfter).Get("Retry-After"))
	}
	responseHeaders(o.Header, a.ex.RequestID, a.ex.Debug, a.log.Worker, cascadeStep(a.target, a.log.CascadeStep))
	o.Log = a.log
	a.traceEnd(o)
	a.ex.Done <- o
	ctx.Stop(ctx.Self())
}

// responseHeaders sets the headers every answer carries: the request id,
// and for keys with the debug scope the worker and, on a cascade route,
// the cascade step (step < 0: not a cascade).
func responseHeaders(h http.Header, requestID string, debug bool, worker string, step int) {
	h.Set("X-Request-Id", requestID)
	if debug && worker != "" {
		h.Set("X-TL-Route", worker)
		if step >= 0 {
			h.Set("X-TL-Cascade-Step", strconv.Itoa(step))
		}
	}
}

// cascadeStep is step when t is a target of a cascade route, else -1.
func cascadeStep(t router.Target, step int) int {
	if t.CascadeSteps > 1 {
		return step
	}
	return -1
}

// cleanup runs when the actor stops, normally or after a panic: whatever
// is still held is released and the edge is told, so nothing leaks and no
// client waits forever.
func (a *requestActor) cleanup(ctx actor.Context) {
	if a.finished {
		return
	}
	a.finished = true
	a.stopWatching()
	if a.routing {
		ctx.Send(a.d.Router, &router.Leave{PID: ctx.Self()})
	}
	a.releaseHeld(ctx)
	a.endAttempt(ctx)
	a.pdEnd()
	a.log.Committed = a.ex.Committed()
	o := Outcome{Status: http.StatusInternalServerError, Code: "internal_error",
		Message: "The gateway failed while handling the request.", Header: http.Header{"X-Request-Id": {a.ex.RequestID}}, Log: a.log}
	a.traceEnd(o)
	a.ex.Done <- o
}
