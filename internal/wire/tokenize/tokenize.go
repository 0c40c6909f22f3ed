// Package tokenize gets a request's prompt tokens exactly as the engine
// will see them, for routing on the engines' KV cache events: it asks
// vLLM's POST /tokenize (of the engine, or of a tokenizer configured for
// the model) with the request's chat messages and what else shapes its
// chat template's rendering (tools, the template and its arguments,
// add_generation_prompt), or its completions prompt, and keeps what it
// learnt.
//
// Two things are reused, both exactly:
//
//   - a request seen before (the same model, messages, tools, template
//     fields, byte for byte) takes its tokens from the cache (a retry, a
//     cascade step, the same question asked again);
//   - a conversation's next turn (its messages extend those of a request
//     tokenized before) is routed on that earlier request's tokens at once,
//     a prefix of its own, once the model's chat template has shown that it
//     keeps a conversation's earlier turns as a prefix: the first
//     VerifyRuns such turns of a model are tokenized whole and compared
//     (one that differs stops the reuse for the model for good). A turn
//     that reuses is tokenized whole off the request's path afterwards
//     (Refresh), which keeps it for the turn after and checks the reuse
//     again, only when its messages after the earlier turn are more than
//     RefreshShare of its messages' bytes and fewer than MaxRefresh such
//     tokenizations run; the others are not tokenized, and the turn after
//     reuses the same earlier turn's tokens.
//
// An endpoint that fails (it cannot be reached, answers 5xx or 429, or
// serves no /tokenize: endpointFailing) is not asked again for Backoff, so
// a model whose engines serve no /tokenize costs one failed call per
// Backoff, not one per request; a request refused for its own content or
// model (400, or vLLM's 404 for a model it does not serve) fails alone. A
// Client is safe for concurrent use.
package tokenize

import (
	"bytes"
	"container/list"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/tidwall/gjson"
	"github.com/tlgate/tlgate/internal/wire/tracectx"
)

// Defaults of Options.
const (
	// DefaultBackoff is how long an endpoint that failed (endpointFailing)
	// is not asked.
	DefaultBackoff = 30 * time.Second
	// VerifyRuns is how many conversation turns of a model are tokenized
	// whole and compared before its earlier turns' tokens are reused.
	VerifyRuns = 3
	// DefaultMaxConcurrent is Options.MaxConcurrent's default.
	DefaultMaxConcurrent = 8
	// MaxResponse bounds a tokenizer's answer.
	MaxResponse = 64 << 20
	// MaxRefresh bounds the tokenizations run off requests' paths at once.
	MaxRefresh = 2
	// RefreshShare: a turn that reuses an earlier turn's tokens is
	// tokenized whole off its path when its messages after that turn are
	// more than this share of its messages' bytes; the others are not
	// tokenized at all.
	RefreshShare = 0.25
	// EntryOverhead is what keeping a prompt's tokens costs beyond its
	// token ids, in tokens (4 bytes each): its entry, list element and map
	// slot. Measured with Go 1.26 on amd64 as the heap (runtime.MemStats
	// HeapAlloc after runtime.GC) that 1<<20 prompts of two tokens, read
	// by tokenIDs and put, held: 140 bytes a prompt, 8 of them token ids,
	// so 132 bytes, 33 tokens. Without it a bound of cache_tokens held
	// about 35 times its bytes of short prompts.
	EntryOverhead = 33
	// ReuseMargin is how many of an earlier turn's last tokens a reuse
	// leaves out: a tokenizer may merge the end of a turn with what follows
	// it (a line break and the answer's first one), so only what comes
	// before is certain.
	ReuseMargin = 8
)

// Errors of Tokenize.
var (
	// ErrUnsupported: the request cannot be tokenized for routing (a batch
	// of prompts, a body that is not an OpenAI request).
	ErrUnsupported = errors.New("tokenize: the request cannot be tokenized for routing")
	// ErrUnavailable: the endpoint failed lately and is not asked.
	ErrUnavailable = errors.New("tokenize: the tokenizer failed lately")
	// ErrBusy: the endpoint has MaxConcurrent calls in flight; the
	// request is not tokenized, and the endpoint is not backed off.
	ErrBusy = errors.New("tokenize: the tokenizer has as many calls in flight as it may")
	// ErrTokenizer: the tokenizer's answer was not tokens.
	ErrTokenizer = errors.New("tokenize: tokenizer failed")
)

// Options configure a Client.
type Options struct {
	// HTTP makes the requests (nil: http.DefaultClient).
	HTTP *http.Client
	// CacheTokens bounds the tokens kept (0 keeps none), each prompt
	// counted as its token ids (their slice's capacity) and EntryOverhead
	// more, so that the bound is on memory, at about 4 bytes a token,
	// whatever the prompts' lengths.
	CacheTokens int
	// Backoff is how long an endpoint that failed is not asked (zero:
	// DefaultBackoff).
	Backoff time.Duration
	// Now is the clock of the backoff (nil: time.Now).
	Now func() time.Time
	// MaxConcurrent bounds the calls in flight to one endpoint URL (zero:
	// DefaultMaxConcurrent): the router asks the least loaded worker of
	// a model for a request's tokens, and asking adds no load, so a burst
	// of requests asks one engine. A request past the bound is not
	// tokenized (ErrBusy) and routes on the prefix index, as one whose
	// tokenization timed out; identical requests in flight make one call
	// (Tokenize).
	MaxConcurrent int
	// Bases maps the URL of a tokenizer configured for a base model
	// ([[gateway.tokenizer.endpoints]]) to that model: a request to it is
	// tokenized as the base model whatever model it names (an adapter of
	// it), since such a tokenizer serves the base model alone and would
	// refuse an adapter's id (a LoRA adapter shares its base's tokenizer
	// and chat template).
	Bases map[string]string
}

// Request is one prompt to tokenize.
type Request struct {
	// URL is the tokenizer's base URL (scheme://host:port): the gateway
	// posts to URL/tokenize.
	URL string
	// Model is the model id to tokenize as (but at a URL of
	// Options.Bases, which names its own), and whose template's verdict
	// and cached tokens these are.
	Model string
	// Chat: Body is a chat completions request (else completions).
	Chat bool
	// Body is the client's request body.
	Body []byte
	// Valid: Body was validated as JSON already (the edge's parser,
	// openai.ReadObject), so it is not validated again. A body that is
	// not JSON must not be marked Valid.
	Valid bool

	read *read // Body's shape, when Read read it
}

// read is a request body's shape, read once.
type read struct {
	s   shape
	err error
}

// Read returns req with its body read, so that Lookup, Tokenize and
// Refresh given it do not read the body again: a request that misses the
// cache is looked up and then tokenized, and each would read a long body
// whole. The body must not change afterwards. A request not given to Read
// is read by each of them.
func Read(req Request) Request {
	s, err := shapeOf(req)
	req.read = &read{s: s, err: err}
	return req
}

// shape returns req's body's shape, read now unless Read read it.
func (req Request) shape() (shape, error) {
	if req.read != nil {
		return req.read.s, req.read.err
	}
	return shapeOf(req)
}

// Lookup results, as the tokenize_cache metric names them.
const (
	Hit    = "hit"
	Prefix = "prefix"
	Miss   = "miss"
)

// Client tokenizes prompts and keeps their tokens.
type Client struct {
	o       Options
	mu      sync.Mutex
	lru     *list.List // of *entry, most recent first
	byKey   map[uint64]*list.Element
	held    int                  // tokens held, by cost
	down    map[string]time.Time // endpoint -> not asked until
	busy    map[string]int       // endpoint -> calls in flight
	flights map[string]*flight   // by URL and /tokenize body
	models  map[string]*verdict  // by model: whether its template keeps a prefix
	refresh chan struct{}        // slots of MaxRefresh
	wg      sync.WaitGroup
}

type entry struct {
	key    uint64
	model  string
	tokens []uint32
}

// verdict is what a model's turns showed of its chat template.
type verdict struct {
	agreed int  // turns whose earlier turn's tokens were a prefix of theirs
	broke  bool // one was not
}

// New returns a client.
func New(o Options) *Client {
	if o.HTTP == nil {
		o.HTTP = http.DefaultClient
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultBackoff
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = DefaultMaxConcurrent
	}
	return &Client{o: o, lru: list.New(), byKey: map[uint64]*list.Element{}, down: map[string]time.Time{},
		busy: map[string]int{}, flights: map[string]*flight{},
		models: map[string]*verdict{}, refresh: make(chan struct{}, MaxRefresh)}
}

// Close waits for the tokenizations run off requests' paths.
func (c *Client) Close() { c.wg.Wait() }

// shape is what of a request its tokens depend on, hashed: the whole
// request's key, and for a chat the keys of its message prefixes.
type shape struct {
	key      uint64   // the whole request
	prefixes []uint64 // chat: prefixes[j] names messages[0..j] with the same other fields
	ends     []int    // chat: the bytes of messages[0..j]
	tokens   []uint32 // a completions prompt given as token ids
	whole    bool     // tokens is the prompt itself
	fields   fields   // the body's, read once
}

// The request body's fields that shape its tokens, as indexes in
// bodyFields: the prompt (messages, or a completions prompt), then the
// chat fields that shape the template's rendering (add_special_tokens
// shapes a completions prompt's too).
const (
	fieldMessages = iota
	fieldPrompt
	fieldTools
	fieldChatTemplate
	fieldChatTemplateKwargs
	fieldAddGenerationPrompt
	fieldContinueFinalMessage
	fieldAddSpecialTokens
	fieldDocuments
	fieldMMProcessorKwargs
	fieldMediaIOKwargs
	numFields

	firstChatField = fieldTools
)

// bodyFields are the fields' names.
var bodyFields = [numFields]string{
	fieldMessages: "messages", fieldPrompt: "prompt",
	fieldTools: "tools", fieldChatTemplate: "chat_template", fieldChatTemplateKwargs: "chat_template_kwargs",
	fieldAddGenerationPrompt: "add_generation_prompt", fieldContinueFinalMessage: "continue_final_message",
	fieldAddSpecialTokens: "add_special_tokens", fieldDocuments: "documents", fieldMMProcessorKwargs: "mm_processor_kwargs",
	fieldMediaIOKwargs: "media_io_kwargs",
}

// chatFields are the chat fields of bodyFields.
var chatFields = bodyFields[firstChatField:]

// fields are a body's values of bodyFields (one that is absent does not
// Exist).
type fields [numFields]gjson.Result

// readFields reads body's top-level bodyFields in one pass, the last of a
// key written twice, as the engines' JSON readers (Python's json, Go's
// encoding/json) read it: the edge refuses a body that gives messages or
// prompt twice, but not one that gives a chat template field twice. A
// body not known to be valid JSON is validated first.
func readFields(body []byte, valid bool) (fields, error) {
	var f fields
	if !valid && !gjson.ValidBytes(body) {
		return f, fmt.Errorf("%w: the body is not JSON", ErrUnsupported)
	}
	gjson.ParseBytes(body).ForEach(func(k, v gjson.Result) bool {
		for i, name := range bodyFields {
			if k.Str == name {
				f[i] = v
				break
			}
		}
		return true
	})
	return f, nil
}

// shapeOf reads req's body.
func shapeOf(req Request) (shape, error) {
	f, err := readFields(req.Body, req.Valid)
	if err != nil {
		return shape{}, err
	}
	s, err := shapeOfFields(req, &f)
	s.fields = f
	return s, err
}

// shapeOfFields is shapeOf of req's fields f.
func shapeOfFields(req Request, f *fields) (shape, error) {
	d := xxhash.New()
	write := func(tag, s string) {
		var l [8]byte
		binary.LittleEndian.PutUint64(l[:], uint64(len(s)))
		_, _ = d.WriteString(tag)
		_, _ = d.Write(l[:])
		_, _ = d.WriteString(s)
	}
	write("model", req.Model)
	if !req.Chat {
		p := f[fieldPrompt]
		switch {
		case p.Type == gjson.String:
			write("prompt", p.Str)
		case p.IsArray():
			items := p.Array()
			if len(items) == 1 && items[0].Type == gjson.String {
				write("prompt", items[0].Str)
				break
			}
			toks, ok := tokenArray(items)
			if !ok {
				return shape{}, fmt.Errorf("%w: a prompt of %d parts", ErrUnsupported, len(items))
			}
			return shape{tokens: toks, whole: true}, nil
		default:
			return shape{}, fmt.Errorf("%w: no prompt", ErrUnsupported)
		}
		write("add_special_tokens", f[fieldAddSpecialTokens].Raw)
		return shape{key: d.Sum64()}, nil
	}
	for i, name := range chatFields {
		write(name, f[firstChatField+i].Raw)
	}
	msgs := f[fieldMessages]
	if !msgs.IsArray() {
		return shape{}, fmt.Errorf("%w: no messages", ErrUnsupported)
	}
	base := d.Sum64()
	s := shape{}
	h, n := base, 0
	for _, m := range msgs.Array() {
		h = chainHash(h, m.Raw)
		n += len(m.Raw)
		s.prefixes = append(s.prefixes, h)
		s.ends = append(s.ends, n)
	}
	if len(s.prefixes) == 0 {
		return shape{}, fmt.Errorf("%w: no messages", ErrUnsupported)
	}
	s.key = s.prefixes[len(s.prefixes)-1]
	return s, nil
}

// chainHash mixes one message's raw JSON into its prefix's hash.
func chainHash(prev uint64, raw string) uint64 {
	d := xxhash.New()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], prev)
	_, _ = d.Write(b[:])
	_, _ = d.WriteString(raw)
	return d.Sum64()
}

// tokenArray reads a prompt given as token ids.
func tokenArray(items []gjson.Result) ([]uint32, bool) {
	out := make([]uint32, 0, len(items))
	for _, it := range items {
		if it.Type != gjson.Number || it.Num < 0 || it.Num > 1<<32-1 || it.Num != float64(uint32(it.Num)) {
			return nil, false
		}
		out = append(out, uint32(it.Num))
	}
	return out, len(out) > 0
}

// Lookup returns what the client knows of req's tokens without asking
// anyone: the whole prompt's (Hit), or a verified prefix of them, a
// conversation's earlier turn's (Prefix); else Miss. Tokens are shared:
// the caller does not change them. With a prefix, refresh says the turn
// should be tokenized whole off the request's path (Refresh), so that
// the turns after it reuse a longer prefix: when the messages after the
// earlier turn are more than RefreshShare of the request's.
func (c *Client) Lookup(req Request) (tokens []uint32, kind string, refresh bool) {
	s, err := req.shape()
	if err != nil {
		return nil, Miss, false
	}
	if s.whole {
		return s.tokens, Hit, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.get(s.key); e != nil {
		return e.tokens, Hit, false
	}
	if v := c.models[req.Model]; v == nil || v.broke || v.agreed < VerifyRuns {
		return nil, Miss, false
	}
	for j := len(s.prefixes) - 2; j >= 0; j-- {
		if e := c.get(s.prefixes[j]); e != nil && len(e.tokens) > ReuseMargin {
			total := s.ends[len(s.ends)-1]
			return e.tokens[:len(e.tokens)-ReuseMargin], Prefix, float64(total-s.ends[j]) > RefreshShare*float64(total)
		}
	}
	return nil, Miss, false
}

// get returns the entry of key, made the most recent; c.mu is held.
func (c *Client) get(key uint64) *entry {
	el := c.byKey[key]
	if el == nil {
		return nil
	}
	c.lru.MoveToFront(el)
	return el.Value.(*entry)
}

// Tokenize asks the tokenizer for req's tokens (ctx bounds the call),
// keeps them, and judges the model's template against an earlier turn's
// tokens.
//
// A request whose call to the same endpoint (the same URL and /tokenize
// body) is in flight waits for that call instead of making its own (a
// burst of one prompt makes one call), within its own ctx and that call's.
// An endpoint with MaxConcurrent calls of its own in flight is not asked:
// the request is answered ErrBusy at once, and the endpoint is not backed
// off.
func (c *Client) Tokenize(ctx context.Context, req Request) ([]uint32, error) {
	s, err := req.shape()
	if err != nil {
		return nil, err
	}
	if s.whole {
		return s.tokens, nil
	}
	as := req // the model asked: a configured tokenizer's base
	if base, ok := c.o.Bases[req.URL]; ok {
		as.Model = base
	}
	body, err := tokenizeBody(as, &s.fields)
	if err != nil {
		return nil, err
	}
	key := req.URL + "\x00" + string(body)
	now := c.o.Now()
	c.mu.Lock()
	if until, ok := c.down[req.URL]; ok && now.Before(until) {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: %s, until %s", ErrUnavailable, req.URL, until.Format(time.RFC3339))
	}
	if f := c.flights[key]; f != nil {
		f.joined++
		c.mu.Unlock()
		select {
		case <-f.done:
			return f.toks, f.err
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", ErrTokenizer, ctx.Err())
		}
	}
	if n := c.busy[req.URL]; n >= c.o.MaxConcurrent {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: %s has %d calls in flight", ErrBusy, req.URL, n)
	}
	c.busy[req.URL]++
	f := &flight{done: make(chan struct{})}
	c.flights[key] = f
	c.mu.Unlock()

	f.toks, f.err = c.fetch(ctx, req, s, body)
	c.mu.Lock()
	delete(c.flights, key)
	if c.busy[req.URL]--; c.busy[req.URL] == 0 {
		delete(c.busy, req.URL)
	}
	c.mu.Unlock()
	close(f.done)
	return f.toks, f.err
}

// flight is a call to a tokenizer in flight, which the requests of the
// same body wait for.
type flight struct {
	done   chan struct{} // closed once toks and err are set
	toks   []uint32
	err    error
	joined int // requests waiting for it besides its own; c.mu
}

// fetch makes req's call (its /tokenize body), backs its endpoint off
// when the endpoint failed, and learns its tokens.
func (c *Client) fetch(ctx context.Context, req Request, s shape, body []byte) ([]uint32, error) {
	toks, failing, err := c.call(ctx, req.URL, body)
	if err != nil {
		if failing && ctx.Err() == nil { // the endpoint's failure, not the deadline's nor the request's
			c.mu.Lock()
			c.down[req.URL] = c.o.Now().Add(c.o.Backoff)
			c.mu.Unlock()
		}
		return nil, err
	}
	c.learn(req.Model, s, toks)
	return toks, nil
}

// learn keeps toks as s's, and judges the model's template against the
// longest earlier turn kept.
func (c *Client) learn(model string, s shape, toks []uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for j := len(s.prefixes) - 2; j >= 0; j-- {
		if e := c.get(s.prefixes[j]); e != nil {
			v := c.models[model]
			if v == nil {
				v = &verdict{}
				c.models[model] = v
			}
			if len(e.tokens) <= len(toks) && slices.Equal(e.tokens, toks[:len(e.tokens)]) {
				v.agreed++
			} else {
				v.broke = true
			}
			break
		}
	}
	c.put(model, s.key, toks)
}

// put keeps toks under key, dropping the least recent entries past the
// bound; c.mu is held.
func (c *Client) put(model string, key uint64, toks []uint32) {
	if c.o.CacheTokens <= 0 || cost(toks) > c.o.CacheTokens {
		return
	}
	if el := c.byKey[key]; el != nil {
		c.held -= cost(el.Value.(*entry).tokens)
		c.lru.Remove(el)
	}
	c.byKey[key] = c.lru.PushFront(&entry{key: key, model: model, tokens: toks})
	c.held += cost(toks)
	for c.held > c.o.CacheTokens {
		el := c.lru.Back()
		e := el.Value.(*entry)
		c.lru.Remove(el)
		delete(c.byKey, e.key)
		c.held -= cost(e.tokens)
	}
}

// cost is what keeping toks counts against Options.CacheTokens.
func cost(toks []uint32) int { return cap(toks) + EntryOverhead }

// Refresh tokenizes req whole off the caller's path (a turn routed on
// its earlier turn's tokens), within timeout, when fewer than MaxRefresh
// such tokenizations run; it reports whether it started one.
func (c *Client) Refresh(req Request, timeout time.Duration) bool {
	select {
	case c.refresh <- struct{}{}:
	default:
		return false
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer func() { <-c.refresh }()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, _ = c.Tokenize(ctx, req)
	}()
	return true
}

// Reusable reports whether the model's turns reuse their earlier turns'
// tokens.
func (c *Client) Reusable(model string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.models[model]
	return v != nil && !v.broke && v.agreed >= VerifyRuns
}

// call posts body to the tokenizer at base URL u. failing says that the
// error is the endpoint's (endpointFailing), not this request's.
func (c *Client) call(ctx context.Context, u string, body []byte) (toks []uint32, failing bool, err error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(u, "/")+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, true, fmt.Errorf("%w: %v", ErrTokenizer, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	tracectx.Inject(ctx, hr.Header)
	resp, err := c.o.HTTP.Do(hr)
	if err != nil {
		return nil, true, fmt.Errorf("%w: %v", ErrTokenizer, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponse+1))
	if err != nil {
		return nil, true, fmt.Errorf("%w: %v", ErrTokenizer, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, endpointFailing(resp.StatusCode, data), fmt.Errorf("%w: %s/tokenize answered %d", ErrTokenizer, u, resp.StatusCode)
	}
	if len(data) > MaxResponse { // this prompt's answer: the next one's may fit
		return nil, false, fmt.Errorf("%w: %s/tokenize: the answer is over the %d-byte limit", ErrTokenizer, u, MaxResponse)
	}
	toks, err = parseTokens(data)
	if err != nil { // not vLLM's /tokenize
		return nil, true, fmt.Errorf("%w: %s/tokenize: %w", ErrTokenizer, u, err)
	}
	return toks, false, nil
}

// endpointFailing reports whether a /tokenize answer of status code (not
// 200) and body data says that the endpoint itself fails or is missing,
// so that every request would fail alike, rather than that this request
// cannot be tokenized there:
//
//   - a 5xx (vLLM answers a tokenization that raised an unexpected
//     exception 500 too, which such a request then costs every other for
//     the backoff), 429, and 401 or 403 (the gateway is not let in);
//   - a 405, and a 404 whose body is not an OpenAI-shaped error: the path
//     or the server is not there (FastAPI's {"detail":"Not Found"},
//     another server's page).
//
// vLLM answers a request its chat template or its media cannot render,
// or that it refuses, 400 (422 from some servers), and a model id it does
// not serve (an adapter a tokenizer without it is asked for) 404 with an
// OpenAI-shaped error ({"error":{"message":...}}, or the older
// {"object":"error","message":...}): those are the request's.
func endpointFailing(code int, data []byte) bool {
	switch {
	case code >= 500, code == http.StatusTooManyRequests, code == http.StatusUnauthorized, code == http.StatusForbidden, code == http.StatusMethodNotAllowed:
		return true
	case code == http.StatusNotFound:
		return !openAIError(data)
	}
	return false
}

// openAIError reports whether data is an OpenAI-shaped error, as vLLM's
// ErrorResponse is written: {"error":{"message":...}}, or, in older
// vLLM, {"object":"error","message":...}.
func openAIError(data []byte) bool {
	if !gjson.ValidBytes(data) {
		return false
	}
	root := gjson.ParseBytes(data)
	if e := root.Get("error"); e.IsObject() && e.Get("message").Type == gjson.String {
		return true
	}
	return root.Get("object").Str == "error" && root.Get("message").Type == gjson.String
}

// parseTokens reads the "tokens" of a /tokenize answer: a JSON object
// whose "tokens" is an array of token ids (unsigned 32-bit integers). A
// long prompt's answer holds thousands of them, read on the request's
// path, so the array is read by a loop over its digits rather than by
// reflection (encoding/json), about five times faster, and that loop is
// also its validation: the rest of the answer is validated without it
// (validating thousands of numbers twice would cost twice the reading).
func parseTokens(data []byte) ([]uint32, error) {
	if toks, ok := tokensOfValid(data); ok {
		return toks, nil
	}
	return nil, answerError(data)
}

// answerError says what is wrong with an answer tokensOfValid refused.
func answerError(data []byte) error {
	if !gjson.ValidBytes(data) {
		return errors.New("the answer is not valid JSON")
	}
	root := gjson.ParseBytes(data)
	switch {
	case !root.IsObject():
		return errors.New("the answer is not a JSON object")
	case !root.Get("tokens").IsArray():
		return errors.New("the answer has no tokens array")
	default:
		return errors.New("the answer's tokens are not all token ids (integers from 0 to 4294967295)")
	}
}

// tokensOfValid reads data's tokens when data is a valid JSON object whose
// "tokens" is an array of token ids. The array is checked by tokenIDs's
// strict reading; the answer around it is checked with an empty array in
// its place, which must be where that answer's own "tokens" is: a value
// swapped for another valid one keeps a valid document valid.
func tokensOfValid(data []byte) ([]uint32, bool) {
	r := gjson.GetBytes(data, "tokens")
	end := r.Index + len(r.Raw)
	if !r.IsArray() || r.Index <= 0 || end > len(data) || string(data[r.Index:end]) != r.Raw {
		return nil, false
	}
	toks, ok := tokenIDs(r.Raw)
	if !ok {
		return nil, false
	}
	rest := make([]byte, 0, len(data)-len(r.Raw)+2)
	rest = append(append(append(rest, data[:r.Index]...), "[]"...), data[end:]...)
	if !gjson.ValidBytes(rest) || !gjson.ParseBytes(rest).IsObject() || gjson.GetBytes(rest, "tokens").Index != r.Index {
		return nil, false
	}
	return toks, true
}

// tokenIDs reads raw, a JSON array, when it is one (raw is checked) and
// every element is an integer from 0 to 1<<32-1 written in digits alone.
func tokenIDs(raw string) ([]uint32, bool) {
	i := 0
	space := func() {
		for i < len(raw) && (raw[i] == ' ' || raw[i] == '\n' || raw[i] == '\t' || raw[i] == '\r') {
			i++
		}
	}
	i++ // '['
	space()
	out := make([]uint32, 0, 1+len(raw)/6)
	if i < len(raw) && raw[i] == ']' {
		return out, i == len(raw)-1
	}
	for {
		space()
		start := i
		var v uint64
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' && i-start < 11 {
			v = v*10 + uint64(raw[i]-'0')
			i++
		}
		if i == start || v > 1<<32-1 || raw[start] == '0' && i-start > 1 { // JSON has no leading zeros
			return nil, false
		}
		out = append(out, uint32(v))
		space()
		if i >= len(raw) {
			return nil, false
		}
		switch raw[i] {
		case ']':
			return out, i == len(raw)-1
		case ',':
			i++
		default:
			return nil, false
		}
	}
}

// tokenizeBody is vLLM's TokenizeChatRequest (or TokenizeCompletionRequest)
// of req, whose body's fields are f: the model, and the client's fields
// that shape its prompt, as the client wrote them (the body is valid JSON:
// readFields).
func tokenizeBody(req Request, f *fields) ([]byte, error) {
	model, err := json.Marshal(req.Model)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	size := len(model) + 64
	for _, v := range f {
		size += len(v.Raw) + 32
	}
	out := make([]byte, 0, size)
	out = append(out, `{"model":`...)
	out = append(out, model...)
	field := func(name, raw string) {
		out = append(out, `,"`...)
		out = append(out, name...)
		out = append(out, `":`...)
		out = append(out, raw...)
	}
	if !req.Chat {
		p := f[fieldPrompt]
		raw := p.Raw
		if p.IsArray() {
			raw = p.Get("0").Raw // one string, checked by shapeOf
		}
		if raw != "" {
			field("prompt", raw)
		}
		if v := f[fieldAddSpecialTokens]; v.Exists() {
			field("add_special_tokens", v.Raw)
		}
		return append(out, '}'), nil
	}
	field("messages", f[fieldMessages].Raw)
	for i, name := range chatFields {
		if v := f[firstChatField+i]; v.Exists() {
			field(name, v.Raw)
		}
	}
	if !f[fieldAddGenerationPrompt].Exists() {
		field("add_generation_prompt", "true")
	}
	return append(out, '}'), nil
}
