// Package httpedge is the OpenAI-compatible HTTP edge: POST
// /v1/chat/completions and /v1/completions, the pooling endpoints
// (/v1/embeddings, /v1/rerank, /v1/score) and the tokenizer's (/tokenize,
// /detokenize), GET /v1/models and /v1/models/{id}, plus the ops endpoints
// /healthz and /readyz, and an OpenAI-shaped 404 on every path nothing else
// serves (Anthropic-shaped below /v1/messages/). It authenticates, bounds
// and parses what routing needs (model, stream, request id, prefix key)
// without re-encoding the body, spawns a request actor and waits for its
// outcome, then encodes it. It decides nothing else: every routing and
// retry decision is the actors'.
package httpedge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgate/tlgate/actors/request"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/guard/ratelimit"
	"github.com/tlgate/tlgate/internal/routing/echo"
	"github.com/tlgate/tlgate/internal/wire/openai"
	"github.com/tlgate/tlgate/internal/wire/tracectx"
	"github.com/tlgate/tlgate/internal/wire/usage"
)

// Deps are the edge's collaborators.
type Deps struct {
	Root         *actor.RootContext
	Router       *actor.PID
	Request      *request.Deps
	Keyring      *auth.Keyring
	MaxBodyBytes int64
	// Timeout bounds queries to the router (models, readiness).
	Timeout time.Duration
	// OnDone, if set, is called once per finished inference request with
	// its outcome (access log, metrics).
	OnDone func(ex *request.Exchange, o request.Outcome)
	// OnReject, if set, is called for requests refused by the edge itself
	// (status and error code).
	OnReject func(r *http.Request, status int, code string)
	// Limits, if set, holds the per-key limits: a request over one is
	// answered 429 rate_limit_exceeded, and every answer of a limited key
	// carries the x-ratelimit-* headers.
	Limits *ratelimit.Limiter
	// OnLimited, if set, is called for each request refused by Limits with
	// the key's name and the limit (a ratelimit.Limit constant).
	OnLimited func(key, limit string)
	// Tokens is how a request of a key with tokens_per_minute reserves its
	// tokens at admission.
	Tokens TokenPolicy
	// Stopping, if set and true, makes /readyz answer 503: the gateway is
	// shutting down and load balancers should move away, while requests
	// are still served.
	Stopping *atomic.Bool
	// ClientWriteTimeout bounds each write of a whole answer to its client
	// (writeWhole): a client that reads nothing for that long is gone. 0:
	// no bound.
	ClientWriteTimeout time.Duration
}

// DefaultMaxTokens is TokenPolicy.DefaultMaxTokens when none is set.
const DefaultMaxTokens = 4096

// TokenPolicy is how a request of a key with a tokens limit is admitted:
// the prompt's estimate plus its completion budget (max_tokens; Responses:
// max_output_tokens; DefaultMaxTokens when it sets none) are reserved; a
// reservation the key's bucket cannot hold is refused, or with Clamp
// admitted with its budget cut to what it holds. The engine is sent the
// budget reserved, in the request's own field (budget), whenever the
// client's was absent or cut.
type TokenPolicy struct {
	Clamp            bool
	DefaultMaxTokens int
}

// Register mounts the OpenAI API and the ops endpoints on mux.
func Register(mux *http.ServeMux, d *Deps) {
	if d.Timeout <= 0 {
		d.Timeout = 2 * time.Second
	}
	if d.Tokens.DefaultMaxTokens <= 0 {
		d.Tokens.DefaultMaxTokens = DefaultMaxTokens
	}
	inf := func(h http.HandlerFunc) http.Handler { return d.Keyring.Require(auth.ScopeInference, h) }
	mux.Handle("POST /v1/chat/completions", inf(d.inferWith(func(b []byte) (openai.Request, error) { return openai.ParseRequest(b, true) })))
	mux.Handle("POST /v1/completions", inf(d.inferWith(func(b []byte) (openai.Request, error) { return openai.ParseRequest(b, false) })))
	mux.Handle("GET /v1/models", inf(d.models))
	mux.Handle("GET /v1/models/{id...}", inf(d.model))
	d.registerResponses(mux)
	d.registerMessages(mux)
	// Any other method on these paths: an OpenAI-shaped 405, not
	// ServeMux's plain-text one.
	for path, allow := range map[string]string{
		"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/models": "GET, HEAD", "/v1/models/{id...}": "GET, HEAD",
	} {
		mux.Handle(path, d.Keyring.Require(auth.ScopeInference, openai.MethodNotAllowed(allow)))
	}
	d.registerPooling(mux)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", d.ready)
	// Every path no other pattern matches: an OpenAI-shaped 404, not
	// ServeMux's plain-text one.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		d.reject(w, r, http.StatusNotFound, openai.CodeNotFound, fmt.Sprintf("No endpoint %s %s.", echo.Clip(r.Method), echo.Clip(r.URL.Path)), nil)
	})
}

func (d *Deps) reject(w http.ResponseWriter, r *http.Request, status int, code, msg string, param *string) {
	d.rejectAs(openai.WriteError, w, r, status, code, msg, param)
}

// errorWriter writes the gateway's own error answer in an API's shape.
type errorWriter func(w http.ResponseWriter, status int, code, msg string, param *string)

func (d *Deps) rejectAs(ew errorWriter, w http.ResponseWriter, r *http.Request, status int, code, msg string, param *string) {
	if d.OnReject != nil {
		d.OnReject(r, status, code)
	}
	ew(w, status, code, msg, param)
}

// ReadBody reads a request body of at most max bytes. The deadline on
// reading it is the server's (internal/bodyguard wraps every path with
// read_body_timeout), not set again here. When the read fails over
// HTTP/1, the answer closes the connection.
func ReadBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	if err != nil && r.ProtoMajor == 1 {
		// The rest of the body will not be read: close the connection after
		// the answer rather than let the server wait for it. Not over
		// HTTP/2: its server takes Connection: close for a GOAWAY of the
		// whole connection, every other stream on it included, where the
		// unread body costs only its own stream (reset).
		w.Header().Set("Connection", "close")
	}
	return body, err
}

// MaxClientRequestIDLen is the longest client request id kept.
const MaxClientRequestIDLen = 128

// NewRequestID returns a fresh gateway request id: "req-" and 32 random
// hex digits. Every request gets one, whatever the client sent: it names
// the request in logs, traces and the engines' X-Request-Id, and draws a
// route's canary split, so no client can choose it.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "req-" + hex.EncodeToString(b[:])
}

// ClientRequestID returns the client's own request id, X-Client-Request-Id
// (OpenAI's header) or else X-Request-Id, when it is 1 to
// MaxClientRequestIDLen characters of A-Z a-z 0-9 and "-_.:"; else "". It
// is logged beside the gateway's id and echoed as X-Client-Request-Id,
// never used to route.
func ClientRequestID(r *http.Request) string {
	id := r.Header.Get("X-Client-Request-Id")
	if id == "" {
		id = r.Header.Get("X-Request-Id")
	}
	if id == "" || len(id) > MaxClientRequestIDLen {
		return ""
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.', c == ':':
		default:
			return ""
		}
	}
	return id
}

// requestIDKey is the context key of the gateway's request id.
type requestIDKey struct{}

// RequestIDOf returns the gateway's id of r, once the edge gave it one
// (an inference request past its authentication), else "".
func RequestIDOf(r *http.Request) string {
	id, _ := r.Context().Value(requestIDKey{}).(string)
	return id
}

// parseFunc validates a request body of one endpoint (openai.ParseRequest,
// openai.ParseEmbeddings...).
type parseFunc func(body []byte) (openai.Request, error)

// inferWith is the handler of an inference path whose bodies parse, with
// OpenAI-shaped errors.
func (d *Deps) inferWith(parse parseFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { d.serve(w, r, openai.WriteError, parse) }
}

// serve reads and parses a POST body with parse, admits the request and
// runs it; the gateway's own errors are written by ew.
func (d *Deps) serve(w http.ResponseWriter, r *http.Request, ew errorWriter, parse parseFunc) {
	r, rid, cid := identify(w, r)
	body, err := ReadBody(w, r, d.MaxBodyBytes)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			d.rejectAs(ew, w, r, http.StatusRequestEntityTooLarge, openai.CodeRequestTooLarge,
				fmt.Sprintf("The request body is larger than %d bytes.", d.MaxBodyBytes), nil)
			return
		}
		d.rejectAs(ew, w, r, http.StatusBadRequest, openai.CodeInvalidRequest, "The request body could not be read.", nil)
		return
	}
	req, err := parse(body)
	if err != nil {
		var fe *openai.FieldError
		if errors.As(err, &fe) {
			d.rejectAs(ew, w, r, http.StatusBadRequest, openai.CodeInvalidRequest, fe.Msg, fe.ParamOrNil())
			return
		}
		d.rejectAs(ew, w, r, http.StatusBadRequest, openai.CodeInvalidRequest, err.Error(), nil)
		return
	}
	d.run(w, r, ew, rid, cid, req)
}

// identify gives r the gateway's request id (in its context, RequestIDOf)
// and reads the client's own; both go in the answer's headers.
func identify(w http.ResponseWriter, r *http.Request) (*http.Request, string, string) {
	rid, cid := NewRequestID(), ClientRequestID(r)
	r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, rid))
	w.Header().Set("X-Request-Id", rid)
	if cid != "" {
		w.Header().Set("X-Client-Request-Id", cid)
	}
	return r, rid, cid
}

// run admits a parsed request (its body is req.Object; none for a GET or
// DELETE), hands it to a request actor, waits for its outcome and writes
// it (errors by ew).
func (d *Deps) run(w http.ResponseWriter, r *http.Request, ew errorWriter, rid, cid string, req openai.Request) {
	key, _ := auth.FromContext(r.Context())
	ask, bad := askOf(r, key)
	if bad != "" {
		d.rejectAs(ew, w, r, http.StatusBadRequest, openai.CodeInvalidRequest, bad, nil)
		return
	}
	adm, ok := d.admit(w, r, ew, key.Name, req)
	if !ok {
		return
	}
	req = d.budget(req, adm)
	rctx := r.Context()
	if d.Request.Tracer != nil { // continue the client's W3C trace context
		rctx = tracectx.Extract(rctx, r.Header, key.Has(auth.ScopeTrace))
	}
	salt := bindSalt(key, &req)
	ex := request.NewExchange(rctx, w, req, r.URL.Path, rid)
	ex.Method = r.Method
	if r.Method == http.MethodGet || r.Method == http.MethodDelete {
		ex.Query = r.URL.RawQuery
	}
	ex.KeyName = key.Name
	ex.Ask = ask
	ex.Salt = salt
	ex.ClientRequestID = cid
	if adm.Reservation != nil {
		ex.Tokens = adm.Reservation
	}
	ex.Debug = key.Has(auth.ScopeDebug)
	o := request.Run(d.Root, d.Request, ex) // no attempt touches w after this
	// The key's slot is free once the engines are done: a client slow to
	// read its answer holds none.
	adm.Reservation.Settle(o.Log.Usage.Total())
	if !o.Streamed && !ex.Committed() && o.Status != 499 {
		for k, v := range o.Header {
			w.Header()[k] = v
		}
		if o.Code != "" {
			var param *string
			if o.Param != "" {
				param = &o.Param
			}
			ew(w, o.Status, o.Code, o.Message, param)
		} else {
			w.WriteHeader(o.Status)
			writeWhole(w, o.Body, d.ClientWriteTimeout)
			o.Log.Committed = true // the first byte went out just now
		}
	}
	if d.OnDone != nil {
		d.OnDone(ex, o)
	}
}

// wholeChunk is how much of a whole answer writeWhole writes at a time;
// an answer no longer than wholeSmall is written at once, unbounded: the
// connection's buffers take it whole, whether its client reads or not.
const (
	wholeChunk = 64 << 10
	wholeSmall = 16 << 10
)

// writeWhole writes a whole answer's body to its client, each wholeChunk
// within timeout (0: no bound), as a stream's events are: a client that
// stops reading is gone, and the answer, up to the proxy's
// MaxResponseBytes, is not held for as long as its connection lives.
func writeWhole(w http.ResponseWriter, body []byte, timeout time.Duration) {
	if timeout <= 0 || len(body) <= wholeSmall {
		_, _ = w.Write(body)
		return
	}
	rc := http.NewResponseController(w)
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }() // the connection may serve another request
	for len(body) > 0 {
		n := min(len(body), wholeChunk)
		if rc.SetWriteDeadline(time.Now().Add(timeout)) != nil {
			_, _ = w.Write(body) // no deadline to be had
			return
		}
		if _, err := w.Write(body[:n]); err != nil {
			return
		}
		body = body[n:]
	}
	_ = rc.Flush() // within the last deadline, not after it is lifted
}

// bindSalt puts key's cache_salt (auth.Key.CacheSalt) in place of the
// client's in req, for the prefix index and the engines, and says how the
// attempts' bodies carry it: a client's own salt never reaches an engine
// when keys are configured.
func bindSalt(key auth.Key, req *openai.Request) request.Salt {
	bound := key.CacheSalt(req.CacheSalt)
	mode := request.SaltAsSent
	switch {
	case bound == req.CacheSalt:
	case req.CacheSalt != "":
		mode = request.SaltReplace
	default:
		mode = request.SaltAdd
	}
	req.CacheSalt = bound
	return mode
}

// admit asks Limits about a request of key, reserving its prompt's
// estimate and its completion budget, and sets the x-ratelimit-* headers;
// over a limit it answers 429 and reports false.
func (d *Deps) admit(w http.ResponseWriter, r *http.Request, ew errorWriter, key string, req openai.Request) (ratelimit.Decision, bool) {
	want := ratelimit.Want{Prompt: usage.EstimatePrompt(req.Prompt), MaxTokens: d.Tokens.DefaultMaxTokens, Clamp: d.Tokens.Clamp}
	switch {
	case req.Endpoint.Pooling(): // no completion
		want.MaxTokens = 0
	case req.MaxTokens != nil:
		want.MaxTokens = *req.MaxTokens
	}
	adm := d.Limits.Admit(key, want)
	adm.SetHeaders(w.Header())
	if adm.OK {
		return adm, true
	}
	if d.OnLimited != nil {
		d.OnLimited(key, adm.Limited)
	}
	d.rejectAs(ew, w, r, http.StatusTooManyRequests, openai.CodeRateLimitExceeded, adm.Message(key), nil)
	return adm, false
}

// budget returns a generating request (chat, completions, Messages:
// max_tokens; Responses: max_output_tokens) with the completion budget an
// admission with a tokens limit reserved, when the client's was absent or
// more than it: the engine then generates no more than was reserved. The
// body is rewritten from its one parse (Object.Apply). Other endpoints'
// bodies go as sent.
func (d *Deps) budget(req openai.Request, adm ratelimit.Decision) openai.Request {
	if req.Object.Bytes() == nil || adm.Tokens.Limit == 0 || (req.MaxTokens != nil && *req.MaxTokens <= adm.MaxTokens) {
		return req
	}
	var edits []openai.Edit
	switch req.Endpoint {
	case openai.EndpointChat, openai.EndpointCompletions, openai.EndpointMessages: // Anthropic's field is max_tokens too
		edits = req.Object.MaxTokens(adm.MaxTokens)
	case openai.EndpointResponses:
		edits = []openai.Edit{openai.SetInt("max_output_tokens", adm.MaxTokens)}
	default:
		return req
	}
	req.Object = req.Object.Apply(edits...)
	n := adm.MaxTokens
	req.MaxTokens = &n
	return req
}

func (d *Deps) ask(ctx context.Context, msg any) (any, error) {
	f := d.Root.RequestFuture(d.Router, msg, d.Timeout)
	return f.Result()
}

func (d *Deps) models(w http.ResponseWriter, r *http.Request) {
	res, err := d.ask(r.Context(), &router.ListModels{})
	if err != nil {
		openai.WriteError(w, http.StatusServiceUnavailable, openai.CodeNoCapacity, "The router did not answer.", nil)
		return
	}
	ids := res.([]string)
	parents := d.adapters(r.Context())
	list := make([]openai.Model, 0, len(ids))
	for _, id := range ids {
		m := openai.NewModel(id, 0, "tlgate")
		m.Parent = parents[id]
		list = append(list, m)
	}
	writeJSON(w, http.StatusOK, openai.NewModelList(list))
}

func (d *Deps) model(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	res, err := d.ask(r.Context(), &router.Known{Model: id})
	if err != nil {
		openai.WriteError(w, http.StatusServiceUnavailable, openai.CodeNoCapacity, "The router did not answer.", nil)
		return
	}
	if !res.(bool) {
		param := "model"
		d.reject(w, r, http.StatusNotFound, openai.CodeModelNotFound, fmt.Sprintf("The model %s does not exist.", echo.Quote(id)), &param)
		return
	}
	m := openai.NewModel(id, 0, "tlgate")
	m.Parent = d.adapters(r.Context())[id]
	writeJSON(w, http.StatusOK, m)
}

// adapters maps the LoRA adapters known workers serve to their base
// models (empty when the router does not answer).
func (d *Deps) adapters(ctx context.Context) map[string]string {
	res, err := d.ask(ctx, &router.ListAdapters{})
	if err != nil {
		return nil
	}
	return res.(map[string]string)
}

func (d *Deps) ready(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if d.Stopping != nil && d.Stopping.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "not ready: shutting down\n")
		return
	}
	res, err := d.ask(r.Context(), &router.Ready{})
	if err != nil || !res.(bool) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "not ready: no routable worker\n")
		return
	}
	_, _ = io.WriteString(w, "ready\n")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
