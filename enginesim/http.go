package enginesim

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// errDie is returned by an emit callback when the Die fault strikes.
var errDie = errors.New("enginesim: die fault")

func (e *Engine) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", e.traced("enginesim.completions", e.handleInference(false)))
	mux.HandleFunc("POST /v1/chat/completions", e.traced("enginesim.chat", e.handleInference(true)))
	for _, prefix := range []string{"", "/v1"} { // vLLM serves /tokenize; the gateway has used /v1/tokenize
		mux.HandleFunc("POST "+prefix+"/tokenize", e.traced("enginesim.tokenize", e.handleTokenize))
		mux.HandleFunc("POST "+prefix+"/detokenize", e.handleDetokenize)
	}
	mux.HandleFunc("POST /reset_prefix_cache", e.handleResetPrefixCache)
	e.responsesRoutes(mux)
	e.messagesRoutes(mux)
	mux.HandleFunc("GET /v1/models", e.handleModels)
	mux.HandleFunc("GET /v1/models/{id}", e.handleModel)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.metricsRegistry(), promhttp.HandlerOpts{}))
	e.poolingRoutes(mux)
	e.loraRoutes(mux)
	e.simRoutes(mux)
	if len(e.cfg.Unserved) == 0 {
		return e.faultGate(mux)
	}
	all := http.NewServeMux()
	all.Handle("/", mux)
	for _, p := range e.cfg.Unserved {
		all.HandleFunc(p, func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		})
	}
	return e.faultGate(all)
}

func (e *Engine) controlHandler() http.Handler {
	mux := http.NewServeMux()
	e.simRoutes(mux)
	return e.track(mux)
}

func (e *Engine) simRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /sim/faults", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, e.Faults())
	})
	mux.HandleFunc("POST /sim/faults", e.handleSetFaults)
}

// track counts handlers so stopping can wait for them.
func (e *Engine) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !e.handlers.enter() {
			panic(http.ErrAbortHandler)
		}
		defer e.handlers.exit()
		next.ServeHTTP(w, r)
	})
}

func isInference(r *http.Request) bool {
	switch r.URL.Path {
	case "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages":
		return r.Method == http.MethodPost
	}
	return false
}

// faultGate applies the Refuse and Unavailable faults; /sim/ is exempt.
func (e *Engine) faultGate(mux *http.ServeMux) http.Handler {
	return e.track(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/sim/") {
			mux.ServeHTTP(w, r)
			return
		}
		f := e.Faults()
		if f.Refuse {
			// A request on a connection opened before refusing: reset it.
			panic(http.ErrAbortHandler)
		}
		if isInference(r) {
			e.core.count(func(c *counters) { c.requests++ })
		}
		if f.Unavailable && r.URL.Path != "/metrics" {
			writeError(w, http.StatusServiceUnavailable, "server_error", "unavailable", "engine unavailable (injected fault)")
			return
		}
		mux.ServeHTTP(w, r)
	}))
}

// handleInference serves /v1/completions (chat false) and
// /v1/chat/completions.
func (e *Engine) handleInference(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("X-Request-Id"); id != "" {
			w.Header().Set("X-Request-Id", id)
		}
		// Read the body first: only then does net/http notice a client that
		// goes away (and cancel the request's context) during a stall.
		body, ok := e.readBody(w, r)
		if !ok {
			return
		}
		f := e.Faults()
		if f.StallMS > 0 {
			e.hook(func(h *hooks) chan struct{} { return h.stalled })
			if err := sleepCtx(r.Context(), time.Duration(f.StallMS)*time.Millisecond); err != nil {
				e.core.count(func(c *counters) { c.aborted++ })
				return
			}
		}
		if f.Die && f.DieAfterTokens == 0 {
			e.core.count(func(c *counters) { c.aborted++ })
			panic(http.ErrAbortHandler)
		}
		if e.Draining() {
			writeError(w, http.StatusServiceUnavailable, "server_error", "draining", "engine is draining")
			return
		}
		req, g, err := parseRequest(e.tok, body, chat)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
			return
		}
		if !e.serves(req.Model) {
			writeModelNotFound(w, req.Model)
			return
		}
		if req.Model != e.cfg.Model {
			g.lora = req.Model
		}
		if err := e.checkDisagg(g); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
			return
		}
		var h *handle
		if id := r.Header.Get(HeaderKVHandle); id != "" {
			if h = e.core.take(id); h == nil {
				writeError(w, http.StatusServiceUnavailable, "server_error", "kv_handle_not_found",
					fmt.Sprintf("KV handle %q is not held here (unknown, used, released or expired)", id))
				return
			}
			err := resumable(h, g)
			e.core.count(func(c *counters) {
				switch {
				case errors.Is(err, errUnseeded):
					c.resumesUnseeded++
				case err == nil:
					c.resumes++
					c.lastResumeSeed = g.seed
				}
			})
			if err != nil {
				e.core.drop(h)
				writeError(w, http.StatusBadRequest, "invalid_request_error", "kv_handle_mismatch", err.Error())
				return
			}
		}
		if h == nil {
			var err error
			switch {
			case g.kvParams != nil && g.kvParams.DoRemotePrefill:
				e.core.awaitKV(1)
				h, err = e.pullKV(r.Context(), g)
				e.core.awaitKV(-1)
			case g.room != nil && e.cfg.Role == RoleDecode:
				e.core.awaitKV(1)
				h, err = e.sglangJoin(r.Context(), g)
				e.core.awaitKV(-1)
			}
			if err != nil {
				e.core.count(func(c *counters) { c.aborted++ })
				e.writeGenerateError(w, err)
				return
			}
		}
		out := &output{e: e, w: w, req: g, chat: chat, model: req.Model, die: f.Die, dieAfter: f.DieAfterTokens}
		out.id, out.created = newID(chat), time.Now().Unix()
		var res result
		switch {
		case g.room != nil && e.cfg.Role == RolePrefill:
			res, err = e.sglangPrefill(r.Context(), g, out)
		case g.kvParams != nil && g.kvParams.DoRemoteDecode && f.PrefillStops:
			// The one token ended the request: nothing is held.
			if res, err = e.generate(r.Context(), g, h, out.emit); err == nil {
				res.finish = finishStop
			}
		case g.kvParams != nil && g.kvParams.DoRemoteDecode:
			g.keepPrompt = true
			if res, err = e.generate(r.Context(), g, h, out.emit); err == nil {
				out.kvParams, err = e.holdForRemoteDecode(g, res)
			}
		default:
			res, err = e.generate(r.Context(), g, h, out.emit)
		}
		switch {
		case errors.Is(err, errDie):
			e.core.count(func(c *counters) { c.aborted++ })
			panic(http.ErrAbortHandler)
		case err != nil:
			e.core.count(func(c *counters) { c.aborted++ })
			if out.started {
				// Never end a broken stream cleanly: no terminating chunk.
				panic(http.ErrAbortHandler)
			}
			e.writeGenerateError(w, err)
			return
		}
		if err := out.finish(res); err != nil {
			e.core.count(func(c *counters) { c.aborted++ })
			panic(http.ErrAbortHandler)
		}
		e.core.count(func(c *counters) { c.completed++ })
	}
}

// errUnseeded is wrapped by resumable's error for a body without a seed.
var errUnseeded = errors.New("a resumed request must carry its seed")

// resumable checks that the request continues the pushed prompt: same
// prompt tokens and seed. A body without a seed is refused, not given the
// pushed one: a real engine would draw its own seed and sample a stream
// other than the one prefilled, so a gateway that forgets the seed must
// hear about it here.
func resumable(h *handle, g *genRequest) error {
	if !slices.Equal(h.header.PromptIds, g.prompt) {
		return fmt.Errorf("the request's prompt (%d tokens) is not the prompt pushed under KV handle %q (%d tokens)",
			len(g.prompt), h.id, len(h.header.PromptIds))
	}
	if !g.seeded {
		return fmt.Errorf("%w: KV handle %q was prefilled with seed %d and the body has none", errUnseeded, h.id, h.header.Seed)
	}
	if g.seed != h.header.Seed {
		return fmt.Errorf("the request's seed %d is not the seed %d of KV handle %q", g.seed, h.header.Seed, h.id)
	}
	return nil
}

func (e *Engine) writeGenerateError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, errTooLarge):
		writeError(w, http.StatusBadRequest, "invalid_request_error", "context_length_exceeded", err.Error())
	case errors.Is(err, errCoreClosed):
		writeError(w, http.StatusServiceUnavailable, "server_error", "unavailable", "engine is stopping")
	case errors.Is(err, errBadRequest):
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
	case errors.Is(err, errRoomTimeout):
		writeError(w, http.StatusServiceUnavailable, "server_error", "bootstrap_timeout", err.Error())
	case errors.Is(err, errKVTransfer):
		writeError(w, http.StatusServiceUnavailable, "server_error", "kv_transfer_failed", err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The client is gone; nobody reads an answer.
	default:
		writeError(w, http.StatusInternalServerError, "server_error", "internal_error", err.Error())
	}
}

// readBody reads a request body within MaxBodyBytes, answering 413 or 400
// itself when it cannot.
func (e *Engine) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, e.cfg.MaxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
				fmt.Sprintf("request body exceeds %d bytes", e.cfg.MaxBodyBytes))
		} else {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", "reading body: "+err.Error())
		}
		return nil, false
	}
	return body, true
}

// readJSON reads the request's body (readBody) and decodes it into v,
// answering 400 invalid_request itself when it is not JSON of v's shape;
// it reports whether v holds the request.
func (e *Engine) readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	body, ok := e.readBody(w, r)
	if !ok {
		return false
	}
	if err := decodeJSON(body, v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
		return false
	}
	return true
}

// output writes a generation to the client, streamed or whole.
type output struct {
	e        *Engine
	w        http.ResponseWriter
	rc       *http.ResponseController
	req      *genRequest
	chat     bool
	model    string // the model id asked for: the base model or an adapter
	id       string
	created  int64
	started  bool // a streamed response has begun
	tokens   int
	die      bool
	dieAfter int

	kvParams *kvTransferParams // kv_transfer_params of a prefill for a remote decode

	// whole-response accumulation
	text   strings.Builder
	compLP *completionLogprobsJSON
	chatLP *chatLogprobsJSON
	buf    []byte
}

func (o *output) emit(s *step) error {
	o.tokens++
	var err error
	if o.req.stream {
		err = o.emitChunk(s)
	} else {
		o.text.WriteString(s.delta)
		o.appendLogprobs(s)
	}
	if err != nil {
		return err
	}
	if o.die && o.tokens >= o.dieAfter {
		return errDie
	}
	return nil
}

func (o *output) appendLogprobs(s *step) {
	if !o.req.logprobs {
		return
	}
	if o.chat {
		if o.chatLP == nil {
			o.chatLP = &chatLogprobsJSON{Content: make([]chatTokenLogprobJSON, 0, o.req.maxTokens)}
		}
		o.chatLP.Content = append(o.chatLP.Content, o.chatLogprob(s))
		return
	}
	if o.compLP == nil {
		o.compLP = &completionLogprobsJSON{}
	}
	lp := o.compLP
	lp.Tokens = append(lp.Tokens, s.piece)
	lp.TokenLogprobs = append(lp.TokenLogprobs, s.logprob)
	lp.TopLogprobs = append(lp.TopLogprobs, o.completionTop(s))
	lp.TextOffset = append(lp.TextOffset, s.offset)
}

// completionTop returns the legacy top_logprobs entry: the top n tokens
// and always the sampled one.
func (o *output) completionTop(s *step) map[string]float64 {
	m := make(map[string]float64, len(s.top)+1)
	for _, c := range s.top {
		m[o.e.tok.Piece(c.Token)] = c.Logprob
	}
	m[s.piece] = s.logprob
	return m
}

func (o *output) chatLogprob(s *step) chatTokenLogprobJSON {
	top := make([]chatTopLogprobJSON, len(s.top))
	for i, c := range s.top {
		p := o.e.tok.Piece(c.Token)
		top[i] = chatTopLogprobJSON{Token: p, Logprob: c.Logprob, Bytes: byteInts(p)}
	}
	return chatTokenLogprobJSON{Token: s.piece, Logprob: s.logprob, Bytes: byteInts(s.piece), TopLogprobs: top}
}

// startSSE answers 200 with the headers of an SSE stream and returns the
// controller that flushes its events.
func startSSE(w http.ResponseWriter) *http.ResponseController {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return http.NewResponseController(w)
}

func (o *output) emitChunk(s *step) error {
	if !o.started {
		o.started = true
		o.rc = startSSE(o.w)
		if o.chat {
			empty := ""
			if err := o.writeEvent(o.chatChunk(&chatChoiceJSON{
				Delta: &chatMessageJSON{Role: "assistant", Content: &empty},
			})); err != nil {
				return err
			}
		}
	}
	var finish *string
	if s.finish != "" {
		finish = &s.finish
	}
	var v any
	if o.chat {
		c := &chatChoiceJSON{Delta: &chatMessageJSON{Content: &s.delta}, FinishReason: finish}
		if o.req.logprobs {
			c.Logprobs = &chatLogprobsJSON{Content: []chatTokenLogprobJSON{o.chatLogprob(s)}}
		}
		v = o.chatChunk(c)
	} else {
		c := completionChoiceJSON{Text: s.delta, FinishReason: finish}
		if o.req.logprobs {
			c.Logprobs = &completionLogprobsJSON{
				Tokens:        []string{s.piece},
				TokenLogprobs: []float64{s.logprob},
				TopLogprobs:   []map[string]float64{o.completionTop(s)},
				TextOffset:    []int{s.offset},
			}
		}
		v = &completionJSON{ID: o.id, Object: "text_completion", Created: o.created, Model: o.model,
			Choices: []completionChoiceJSON{c}}
	}
	return o.writeEvent(v)
}

func (o *output) chatChunk(c *chatChoiceJSON) *chatJSON {
	return &chatJSON{ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.model,
		Choices: []chatChoiceJSON{*c}}
}

// writeEvent writes one SSE data line and flushes it.
func (o *output) writeEvent(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("enginesim: encode chunk: %w", err)
	}
	o.buf = append(append(append(o.buf[:0], "data: "...), b...), "\n\n"...)
	if _, err := o.w.Write(o.buf); err != nil {
		return err
	}
	return o.rc.Flush()
}

// finish ends the response: the usage chunk and [DONE] of a stream, or the
// whole JSON body.
func (o *output) finish(res result) error {
	usage := &usageJSON{PromptTokens: res.promptTokens, CompletionTokens: res.completionTokens,
		TotalTokens: res.promptTokens + res.completionTokens}
	if o.req.stream {
		if o.req.usageChunk {
			var v any
			if o.chat {
				v = &chatJSON{ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.model,
					Choices: []chatChoiceJSON{}, Usage: usage}
			} else {
				v = &completionJSON{ID: o.id, Object: "text_completion", Created: o.created, Model: o.model,
					Choices: []completionChoiceJSON{}, Usage: usage}
			}
			if err := o.writeEvent(v); err != nil {
				return err
			}
		}
		if _, err := io.WriteString(o.w, "data: [DONE]\n\n"); err != nil {
			return err
		}
		return o.rc.Flush()
	}
	finish := res.finish
	text := o.text.String()
	if o.chat {
		c := chatChoiceJSON{Message: &chatMessageJSON{Role: "assistant", Content: &text}, FinishReason: &finish}
		if o.req.logprobs {
			c.Logprobs = o.chatLP
		}
		return writeJSON(o.w, http.StatusOK, &chatJSON{ID: o.id, Object: "chat.completion", Created: o.created,
			Model: o.model, Choices: []chatChoiceJSON{c}, Usage: usage, KVTransferParams: o.kvParams})
	}
	c := completionChoiceJSON{Text: text, FinishReason: &finish, Logprobs: o.compLP}
	return writeJSON(o.w, http.StatusOK, &completionJSON{ID: o.id, Object: "text_completion", Created: o.created,
		Model: o.model, Choices: []completionChoiceJSON{c}, Usage: usage, KVTransferParams: o.kvParams})
}

func newID(chat bool) string {
	var b [12]byte
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	if chat {
		return "chatcmpl-" + hex.EncodeToString(b[:])
	}
	return "cmpl-" + hex.EncodeToString(b[:])
}

func (e *Engine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if !e.readJSON(w, r, &req) {
		return
	}
	if req.Model != "" && !e.serves(req.Model) {
		writeModelNotFound(w, req.Model)
		return
	}
	var text string
	switch {
	case req.Prompt != nil && req.Messages == nil:
		text = *req.Prompt
	case req.Prompt == nil && req.Messages != nil:
		opts, err := chatOptions(req.AddGenerationPrompt, req.ContinueFinalMessage)
		if err == nil {
			text, err = renderMessages(req.Messages, opts)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
			return
		}
	default:
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request",
			"exactly one of prompt and messages is required")
		return
	}
	ids := e.tok.Encode(text)
	var strs []string
	if req.ReturnTokenStrs {
		strs = make([]string, len(ids))
		for i, id := range ids {
			strs[i] = e.tok.Piece(id)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": ids, "count": len(ids), "max_model_len": e.maxModelLen(), "token_strs": strs})
}

func (e *Engine) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string   `json:"model"`
		Tokens []uint32 `json:"tokens"`
	}
	if !e.readJSON(w, r, &req) {
		return
	}
	if req.Model != "" && !e.serves(req.Model) {
		writeModelNotFound(w, req.Model)
		return
	}
	text, err := e.tok.Decode(req.Tokens)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": text})
}

// handleResetPrefixCache serves vLLM's POST /reset_prefix_cache: every
// cached block is dropped (AllBlocksCleared), unless some are in use
// (409 blocks_in_use, nothing dropped), where vLLM logs that it failed.
func (e *Engine) handleResetPrefixCache(w http.ResponseWriter, _ *http.Request) {
	if !e.core.resetPrefixCache() {
		writeError(w, http.StatusConflict, "invalid_request_error", "blocks_in_use",
			"the prefix cache cannot be reset while requests hold KV blocks")
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (e *Engine) maxModelLen() int { return e.cfg.KVBlocks * BlockTokens }

func (e *Engine) modelJSON() map[string]any {
	return map[string]any{"id": e.cfg.Model, "object": "model", "created": e.started.Unix(),
		"owned_by": "enginesim", "root": e.cfg.Model, "max_model_len": e.maxModelLen()}
}

func (e *Engine) handleModels(w http.ResponseWriter, _ *http.Request) {
	data := []any{e.modelJSON()}
	for _, a := range e.Adapters() {
		data = append(data, e.adapterJSON(a))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (e *Engine) handleModel(w http.ResponseWriter, r *http.Request) {
	switch id := r.PathValue("id"); {
	case id == e.cfg.Model:
		writeJSON(w, http.StatusOK, e.modelJSON())
	case e.serves(id):
		writeJSON(w, http.StatusOK, e.adapterJSON(id))
	default:
		writeModelNotFound(w, id)
	}
}

func (e *Engine) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	body, ok := e.readBody(w, r)
	if !ok {
		return
	}
	var f Faults
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", "faults: "+err.Error())
		return
	}
	if err := f.validate(); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
		return
	}
	if err := e.SetFaults(f); err != nil {
		writeError(w, http.StatusInternalServerError, "server_error", "internal_error", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, e.Faults())
}

func writeModelNotFound(w http.ResponseWriter, model string) {
	writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found",
		fmt.Sprintf("The model `%s` does not exist.", model))
}

// writeError writes OpenAI's error shape.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	writeJSON(w, status, errorJSON{Error: errorBody{Message: msg, Type: typ, Code: code}})
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return fmt.Errorf("enginesim: encode response: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, err = w.Write(append(b, '\n'))
	return err
}

// hook sends a test notification, if a test asked for it.
func (e *Engine) hook(ch func(*hooks) chan struct{}) {
	if e.cfg.hooks == nil {
		return
	}
	if c := ch(e.cfg.hooks); c != nil {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}
