package openai

import (
	"errors"
	"strings"

	"github.com/tidwall/gjson"
)

var (
	// ErrNotObject is returned when a body to rewrite is not a JSON object.
	ErrNotObject = errors.New("openai: body is not a JSON object")
	// ErrInvalidJSON is returned when a response to rewrite is not valid JSON.
	ErrInvalidJSON = errors.New("openai: body is not valid JSON")
)

// The rewrites below splice values into the client's bytes (Object.With):
// every other byte stays as sent, and the input slice is never modified
// (each returns a new slice). An attempt builds its body from the
// request's Object with all its edits at once (Request.Object); these
// functions read the object first, for a body given as bytes.

// WithModel returns body with "model" set to model.
func WithModel(body []byte, model string) ([]byte, error) {
	return with(body, SetString("model", model))
}

// WithCacheSalt returns body with "cache_salt" set to salt.
func WithCacheSalt(body []byte, salt string) ([]byte, error) {
	return with(body, SetString("cache_salt", salt))
}

// with reads body as an object and returns it with edits applied.
func with(body []byte, edits ...Edit) ([]byte, error) {
	o, err := ObjectOf(body)
	if err != nil {
		return nil, err
	}
	return o.With(edits...), nil
}

// TakesCacheSalt reports whether an engine of kind (a probe kind; "" for a
// heartbeat worker) may be sent a cache_salt the client did not send:
// every kind but openai, whose servers (OpenAI's own among them) may
// refuse a field they do not know. vLLM and SGLang key their prefix
// caches with it; others ignore it.
func TakesCacheSalt(kind string) bool {
	return kind != "openai"
}

// WithSeed returns body with "seed" set to seed.
func WithSeed(body []byte, seed uint64) ([]byte, error) {
	return with(body, SetUint("seed", seed))
}

// ForceLogprobs returns body asking for token logprobs, as a cascade step
// needs: chat gets "logprobs": true; completions keep a number >= least
// already there and otherwise get "logprobs": least, the fewest
// alternatives per token with which the engine still reports the sampled
// token's logprob: 0 for OpenAI and vLLM, 1 for llama.cpp's server, which
// reads 0 as no logprobs at all (LeastLogprobs).
func ForceLogprobs(body []byte, chat bool, least int) ([]byte, error) {
	o, err := ObjectOf(body)
	if err != nil {
		return nil, err
	}
	e, ok := o.ForceLogprobs(chat, least)
	if !ok {
		return append([]byte(nil), body...), nil
	}
	return o.With(e), nil
}

// ForceLogprobs returns the edit that asks for token logprobs as the
// function ForceLogprobs does, or false when the object asks for them
// already.
func (o Object) ForceLogprobs(chat bool, least int) (Edit, bool) {
	if chat {
		return Set("logprobs", []byte("true")), true
	}
	if n, ok := integer(gjson.ParseBytes(o.Raw("logprobs"))); ok && n >= int64(least) {
		return Edit{}, false
	}
	return SetInt("logprobs", least), true
}

// LeastLogprobs is the completions "logprobs" value ForceLogprobs asks an
// engine of kind (a probe kind; "" for a heartbeat worker) for.
func LeastLogprobs(kind string) int {
	if kind == "llamacpp" {
		return 1
	}
	return 0
}

// AskedLogprobs returns a completions request body's "logprobs" number,
// or -1 when it has none.
func AskedLogprobs(body []byte) int {
	return askedLogprobs(gjson.GetBytes(body, "logprobs"))
}

// askedLogprobs is AskedLogprobs of the value of "logprobs".
func askedLogprobs(v gjson.Result) int {
	if n, ok := integer(v); ok && n >= 0 && n <= 1<<20 {
		return int(n)
	}
	return -1
}

// TrimTopLogprobs returns a non-streamed completions response whose
// choices[i].logprobs.content[j].top_logprobs lists (llama.cpp's shape)
// hold at most n alternatives: the client asked for n, the engine was
// asked for more (ForceLogprobs).
func TrimTopLogprobs(resp []byte, n int) ([]byte, error) {
	if !gjson.ValidBytes(resp) {
		return nil, ErrInvalidJSON
	}
	return TrimChoicesTopLogprobs(resp, gjson.GetBytes(resp, "choices"), n), nil
}

// TrimChoicesTopLogprobs is TrimTopLogprobs of a response already read:
// choices is its "choices" member, whose offsets (Index) are into resp.
// It returns new bytes; resp is not modified.
func TrimChoicesTopLogprobs(resp []byte, choices gjson.Result, n int) []byte {
	var s splicer
	if !choices.IsArray() {
		return s.apply(resp)
	}
	choices.ForEach(func(_, c gjson.Result) bool {
		content := c.Get("logprobs.content")
		if !c.IsObject() || !content.IsArray() {
			return true
		}
		content.ForEach(func(_, tok gjson.Result) bool {
			top := tok.Get("top_logprobs")
			if !top.IsArray() {
				return true
			}
			alts := top.Array()
			if len(alts) <= n {
				return true
			}
			keep := make([]string, 0, n)
			for _, alt := range alts[:n] {
				keep = append(keep, alt.Raw)
			}
			s.add(top, []byte("["+strings.Join(keep, ",")+"]"))
			return true
		})
		return true
	})
	return s.apply(resp)
}

// StripLogprobs returns a non-streamed completions or chat response with
// every choices[i].logprobs set to null, as OpenAI answers when logprobs were
// not requested: a cascade forces them on, and the client did not ask.
// Choices without a logprobs field are left as they are.
func StripLogprobs(resp []byte) ([]byte, error) {
	if !gjson.ValidBytes(resp) {
		return nil, ErrInvalidJSON
	}
	return StripChoicesLogprobs(resp, gjson.GetBytes(resp, "choices")), nil
}

// StripChoicesLogprobs is StripLogprobs of a response already read:
// choices is its "choices" member, whose offsets (Index) are into resp.
// It returns new bytes; resp is not modified.
func StripChoicesLogprobs(resp []byte, choices gjson.Result) []byte {
	var s splicer
	if choices.IsArray() {
		choices.ForEach(func(_, c gjson.Result) bool {
			if lp := c.Get("logprobs"); lp.Exists() && lp.Type != gjson.Null {
				s.add(lp, null)
			}
			return true
		})
	}
	return s.apply(resp)
}

// splicer replaces values of a JSON document, found by a walk over it, in
// one copy.
type splicer struct {
	spans []splice
}

type splice struct {
	start, end int
	with       []byte
}

// add replaces v (its Index is its offset in the document) with raw.
func (s *splicer) add(v gjson.Result, raw []byte) {
	s.spans = append(s.spans, splice{start: v.Index, end: v.Index + len(v.Raw), with: raw})
}

// apply returns a copy of doc with the replacements, which the walk
// found in order.
func (s *splicer) apply(doc []byte) []byte {
	out := make([]byte, 0, len(doc))
	at := 0
	for _, sp := range s.spans {
		out = append(append(out, doc[at:sp.start]...), sp.with...)
		at = sp.end
	}
	return append(out, doc[at:]...)
}

func checkObject(body []byte) error {
	for _, c := range body {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '{':
			return nil
		}
		break
	}
	return ErrNotObject
}

// WithMaxTokens returns body with its completion budget set to n: every
// one of "max_tokens" and "max_completion_tokens" it holds (not null), or
// "max_tokens" when it holds neither.
func WithMaxTokens(body []byte, n int) ([]byte, error) {
	o, err := ObjectOf(body)
	if err != nil {
		return nil, err
	}
	return o.With(o.MaxTokens(n)...), nil
}

// MaxTokens returns the edits that set the object's completion budget to
// n as WithMaxTokens does.
func (o Object) MaxTokens(n int) []Edit {
	var edits []Edit
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		if o.Has(k) {
			edits = append(edits, SetInt(k, n))
		}
	}
	if len(edits) == 0 {
		edits = append(edits, SetInt("max_tokens", n))
	}
	return edits
}

// AsksUsage reports whether the object asks a stream for its usage chunk
// ("stream_options": {"include_usage": true}).
func (o Object) AsksUsage() bool {
	return gjson.GetBytes(o.Raw("stream_options"), "include_usage").Type == gjson.True
}

// AskUsage returns the edit that asks a stream for its usage chunk:
// "stream_options.include_usage" set to true, any other stream_options
// member kept; false when the object asks for it already.
func (o Object) AskUsage() (Edit, bool) {
	raw := o.Raw("stream_options")
	if gjson.GetBytes(raw, "include_usage").Type == gjson.True {
		return Edit{}, false
	}
	if so, err := ObjectOf(raw); err == nil {
		return Set("stream_options", so.With(Set("include_usage", []byte("true")))), true
	}
	return Set("stream_options", []byte(`{"include_usage":true}`)), true
}
