package openai

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

var (
	// ErrNotObject is returned when a body to rewrite is not a JSON object.
	ErrNotObject = errors.New("openai: body is not a JSON object")
	// ErrInvalidJSON is returned when a response to rewrite is not valid JSON.
	ErrInvalidJSON = errors.New("openai: body is not valid JSON")
)

// The rewrites below splice one value into the client's bytes: every other
// byte stays as sent, and the input slice is never modified (each returns a
// new slice), so one body can be rewritten per attempt. They expect a body
// ParseRequest accepted (a JSON object without duplicate known keys) and only
// check that it opens as an object, to keep a full JSON pass off every attempt.

// WithModel returns body with "model" set to model.
func WithModel(body []byte, model string) ([]byte, error) {
	return set(body, "model", gjson.AppendJSONString(nil, model))
}

// WithCacheSalt returns body with "cache_salt" set to salt.
func WithCacheSalt(body []byte, salt string) ([]byte, error) {
	return set(body, "cache_salt", gjson.AppendJSONString(nil, salt))
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
	return set(body, "seed", strconv.AppendUint(nil, seed, 10))
}

// ForceLogprobs returns body asking for token logprobs, as a cascade step
// needs: chat gets "logprobs": true; completions keep a number >= least
// already there and otherwise get "logprobs": least, the fewest
// alternatives per token with which the engine still reports the sampled
// token's logprob: 0 for OpenAI and vLLM, 1 for llama.cpp's server, which
// reads 0 as no logprobs at all (LeastLogprobs).
func ForceLogprobs(body []byte, chat bool, least int) ([]byte, error) {
	if chat {
		return set(body, "logprobs", []byte("true"))
	}
	if err := checkObject(body); err != nil {
		return nil, err
	}
	if n, ok := integer(gjson.GetBytes(body, "logprobs")); ok && n >= int64(least) {
		return append([]byte(nil), body...), nil
	}
	return set(body, "logprobs", []byte(strconv.Itoa(least)))
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
	if n, ok := integer(gjson.GetBytes(body, "logprobs")); ok && n >= 0 && n <= 1<<20 {
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
	out := append([]byte(nil), resp...)
	var err error
	gjson.GetBytes(resp, "choices").ForEach(func(k, c gjson.Result) bool {
		c.Get("logprobs.content").ForEach(func(j, tok gjson.Result) bool {
			top := tok.Get("top_logprobs")
			if !top.IsArray() || len(top.Array()) <= n {
				return true
			}
			keep := make([]string, 0, n)
			for _, alt := range top.Array()[:n] {
				keep = append(keep, alt.Raw)
			}
			path := "choices." + strconv.Itoa(int(k.Num)) + ".logprobs.content." + strconv.Itoa(int(j.Num)) + ".top_logprobs"
			out, err = sjson.SetRawBytes(out, path, []byte("["+strings.Join(keep, ",")+"]"))
			return err == nil
		})
		return err == nil
	})
	if err != nil {
		return nil, fmt.Errorf("openai: trim top logprobs: %w", err)
	}
	return out, nil
}

// StripLogprobs returns a non-streamed completions or chat response with
// every choices[i].logprobs set to null, as OpenAI answers when logprobs were
// not requested: a cascade forces them on, and the client did not ask.
// Choices without a logprobs field are left as they are.
func StripLogprobs(resp []byte) ([]byte, error) {
	if !gjson.ValidBytes(resp) {
		return nil, ErrInvalidJSON
	}
	out := append([]byte(nil), resp...)
	choices := gjson.GetBytes(resp, "choices")
	if !choices.IsArray() {
		return out, nil
	}
	var err error
	choices.ForEach(func(k, c gjson.Result) bool {
		lp := c.Get("logprobs")
		if !lp.Exists() || lp.Type == gjson.Null {
			return true
		}
		out, err = sjson.SetRawBytes(out, "choices."+strconv.Itoa(int(k.Num))+".logprobs", []byte("null"))
		return err == nil
	})
	if err != nil {
		return nil, fmt.Errorf("openai: strip logprobs: %w", err)
	}
	return out, nil
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

func set(body []byte, key string, raw []byte) ([]byte, error) {
	if err := checkObject(body); err != nil {
		return nil, err
	}
	out, err := sjson.SetRawBytes(body, key, raw)
	if err != nil {
		return nil, fmt.Errorf("openai: set %s: %w", key, err)
	}
	return out, nil
}

// WithMaxTokens returns body with its completion budget set to n: every
// one of "max_tokens" and "max_completion_tokens" it holds (not null), or
// "max_tokens" when it holds neither.
func WithMaxTokens(body []byte, n int) ([]byte, error) {
	if err := checkObject(body); err != nil {
		return nil, err
	}
	v := strconv.AppendInt(nil, int64(n), 10)
	out, set1 := body, false
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		if f := gjson.GetBytes(out, k); f.Exists() && f.Type != gjson.Null {
			var err error
			if out, err = set(out, k, v); err != nil {
				return nil, err
			}
			set1 = true
		}
	}
	if !set1 {
		return set(body, "max_tokens", v)
	}
	return out, nil
}
