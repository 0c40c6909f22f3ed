package request

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/usage"
)

// Exchange is one client request as the edge hands it over, and the channel
// on which the actor hands back its outcome. The edge runs it with Run (or
// spawns Props and waits on Done, then on Wait: no attempt may still touch
// the response writer), then writes Outcome unless the response was already
// committed by a stream.
type Exchange struct {
	Ctx context.Context // the client's request context
	W   http.ResponseWriter
	// Req is the request as the edge parsed it, once: its body's bytes
	// and layout are Req.Object, which attempts rewrite without parsing.
	Req  openai.Request
	Path string // the path asked of the engine: "/v1/chat/completions", "/v1/embeddings", "/v1/responses[/{id}]"...
	// Method is the client's method: POST (or empty), or GET and DELETE
	// of /v1/responses/{id}, which carry no body.
	Method string
	// Query is the query string of a GET or DELETE, passed to the engine
	// as it came (a retrieval's stream, starting_after and include).
	Query     string
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
	loop      *edgeLoop          // the edge's goroutine running the actor (Run); nil: spawned by Props
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

// spawn runs an attempt's I/O (run) and then its report to the actor
// (then) away from the actor: on the edge's goroutine when Run runs the
// actor and that goroutine is free, else on a new goroutine.
func (ex *Exchange) spawn(run, then func()) {
	if ex.loop != nil {
		ex.loop.goWork(run, then)
		return
	}
	spawnAway(run, then)
}

// spawnAway runs run, then then, on a new goroutine.
func spawnAway(run, then func()) { go func() { run(); then() }() }

// Wait blocks until no attempt of the exchange is running.
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
