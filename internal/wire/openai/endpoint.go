package openai

import (
	"fmt"
	"slices"

	"github.com/tidwall/gjson"
)

// Endpoint names a kind of inference request by what it asks of an engine;
// it labels metrics and decides how a request is routed and what its
// answer must look like.
type Endpoint string

// The endpoints the gateway relays.
const (
	EndpointChat        Endpoint = "chat"
	EndpointCompletions Endpoint = "completions"
	EndpointEmbeddings  Endpoint = "embeddings"
	EndpointRerank      Endpoint = "rerank"
	EndpointScore       Endpoint = "score"
	EndpointTokenize    Endpoint = "tokenize"
	EndpointDetokenize  Endpoint = "detokenize"
	EndpointResponses   Endpoint = "responses"
	EndpointMessages    Endpoint = "messages"
)

// Endpoints lists every Endpoint (a metric label's fixed set).
var Endpoints = []Endpoint{EndpointChat, EndpointCompletions, EndpointEmbeddings, EndpointRerank,
	EndpointScore, EndpointTokenize, EndpointDetokenize, EndpointResponses, EndpointMessages}

// Paths of the endpoints beside completions, as clients and engines (vLLM)
// name them.
const (
	PathEmbeddings = "/v1/embeddings"
	PathRerank     = "/v1/rerank"
	PathScore      = "/v1/score"
	PathTokenize   = "/tokenize"
	PathDetokenize = "/detokenize"
)

// Pooling reports whether the endpoint's requests keep no KV cache on the
// engine (embeddings, rerank, score) or run no model at all (tokenize,
// detokenize): such a request is routed to the least loaded worker, never
// by prefix, and never to a cascade step but the last.
func (e Endpoint) Pooling() bool {
	switch e {
	case EndpointEmbeddings, EndpointRerank, EndpointScore, EndpointTokenize, EndpointDetokenize:
		return true
	}
	return false
}

// Tokenizer reports whether the endpoint only runs the model's tokenizer
// (tokenize, detokenize): any worker of the model serves it, whatever its
// role, and it uses no tokens.
func (e Endpoint) Tokenizer() bool { return e == EndpointTokenize || e == EndpointDetokenize }

// AnswerOK reports whether root, an engine's 2xx JSON answer to a request
// of endpoint e, has the shape e's answers have: "choices" (completions,
// chat), "data" (embeddings, score), "results" (rerank), "tokens"
// (tokenize) or "prompt" (detokenize).
func (e Endpoint) AnswerOK(root gjson.Result) bool {
	return root.IsObject() && e.AnswerHas(root.Get)
}

// AnswerHas is AnswerOK of an object whose top-level members get returns
// (an answer read once: dialect.Answer.Get).
func (e Endpoint) AnswerHas(get func(key string) gjson.Result) bool {
	switch e {
	case EndpointEmbeddings, EndpointScore:
		return get("data").IsArray()
	case EndpointRerank:
		return get("results").IsArray()
	case EndpointTokenize:
		return get("tokens").IsArray()
	case EndpointDetokenize:
		return get("prompt").Type == gjson.String
	}
	return get("choices").IsArray()
}

// poolingParser reads the top-level fields of a body other than a
// completion: the model, the text to count (Prompt, for the usage
// estimate) and each field's type, rejecting duplicates of the fields it
// reads.
type poolingParser struct {
	req  Request
	r    Renderer
	seen []string
}

// poolingField reads one field of a pooling or tokenizer body.
type poolingField func(p *poolingParser, name string, v gjson.Result) *FieldError

// parsePooling validates body as an object, reads "model" and hands every
// other field it knows (fields) to each, in order.
func parsePooling(body []byte, ep Endpoint, fields map[string]poolingField, required ...string) (Request, error) {
	p := &poolingParser{req: Request{Endpoint: ep}, r: Renderer{limit: -1}}
	names := []string{"model", "cache_salt"}
	for name := range fields {
		names = append(names, name)
	}
	obj, err := ReadObject(body, names, func(name string, v gjson.Result) *FieldError {
		p.seen = append(p.seen, name)
		switch name {
		case "model":
			var err *FieldError
			p.req.Model, err = ReadModel(v)
			return err
		case "cache_salt":
			var err *FieldError
			p.req.CacheSalt, err = ReadCacheSalt(name, v)
			return err
		}
		return fields[name](p, name, v)
	}, nil)
	if err != nil {
		return Request{}, err
	}
	for _, name := range append([]string{"model"}, required...) {
		if !slices.Contains(p.seen, name) {
			return Request{}, fieldErr(name, "%s is required", name)
		}
	}
	p.req.Prompt = string(p.r.buf)
	p.req.Object = obj
	p.req.parses = 1
	return p.req, nil
}

// ParseEmbeddings validates a /v1/embeddings body: model, and input as a
// string, an array of strings, an array of token ids or an array of such
// arrays, none empty; encoding_format "float" or "base64"; dimensions a
// positive integer. Other fields go to the engine as sent.
func ParseEmbeddings(body []byte) (Request, error) {
	return parsePooling(body, EndpointEmbeddings, map[string]poolingField{
		"input": func(p *poolingParser, name string, v gjson.Result) *FieldError {
			return renderInput(&p.r, name, v)
		},
		"encoding_format": func(_ *poolingParser, name string, v gjson.Result) *FieldError {
			if v.Type == gjson.Null || v.Type == gjson.String && (v.Str == "float" || v.Str == "base64") {
				return nil
			}
			return fieldErr(name, `%s must be "float" or "base64"`, name)
		},
		"dimensions": positiveInt,
	}, "input")
}

// ParseRerank validates a /v1/rerank body (vLLM's, Jina's and Cohere's
// shape): model, query a string, documents a non-empty array of strings or
// of objects with a "text" string, top_n a non-negative integer.
func ParseRerank(body []byte) (Request, error) {
	return parsePooling(body, EndpointRerank, map[string]poolingField{
		"query": func(p *poolingParser, name string, v gjson.Result) *FieldError {
			if v.Type != gjson.String {
				return fieldErr(name, "%s must be a string", name)
			}
			p.r.write(v.Str)
			return nil
		},
		"documents": func(p *poolingParser, name string, v gjson.Result) *FieldError {
			return renderDocuments(&p.r, name, v, true)
		},
		"top_n": func(_ *poolingParser, name string, v gjson.Result) *FieldError {
			_, err := nonNegInt(name, v)
			return err
		},
	}, "query", "documents")
}

// ParseScore validates a /v1/score body (vLLM's shape): model, text_1 and
// text_2 each a string or a non-empty array of strings.
func ParseScore(body []byte) (Request, error) {
	text := func(p *poolingParser, name string, v gjson.Result) *FieldError {
		if v.Type == gjson.String {
			p.r.write(v.Str)
			return nil
		}
		return renderDocuments(&p.r, name, v, false)
	}
	return parsePooling(body, EndpointScore, map[string]poolingField{
		"text_1": text, "text_2": text,
	}, "text_1", "text_2")
}

// ParseTokenize validates a /tokenize body (vLLM's shape): model, and
// exactly one of prompt (a string) and messages (chat messages).
func ParseTokenize(body []byte) (Request, error) {
	req, err := parsePooling(body, EndpointTokenize, map[string]poolingField{
		"prompt": func(p *poolingParser, name string, v gjson.Result) *FieldError {
			if v.Type != gjson.String {
				return fieldErr(name, "%s must be a string", name)
			}
			p.r.write(v.Str)
			return nil
		},
		"messages": func(p *poolingParser, _ string, v gjson.Result) *FieldError {
			return renderMessages(&p.r, v, true, Brackets)
		},
	})
	if err != nil {
		return Request{}, err
	}
	if has := req.Object.has("prompt"); has == req.Object.has("messages") {
		return Request{}, fieldErr("prompt", "exactly one of prompt and messages is required")
	}
	return req, nil
}

// ParseDetokenize validates a /detokenize body (vLLM's shape): model, and
// tokens an array of token ids.
func ParseDetokenize(body []byte) (Request, error) {
	return parsePooling(body, EndpointDetokenize, map[string]poolingField{
		"tokens": func(_ *poolingParser, name string, v gjson.Result) *FieldError {
			if !v.IsArray() || !isTokenArray(v) {
				return fieldErr(name, "%s must be an array of token ids", name)
			}
			return nil
		},
	}, "tokens")
}

// renderInput writes an embeddings input: a string, an array of strings
// (concatenated), token ids (rendered as nothing), or arrays of token ids.
func renderInput(r *Renderer, name string, v gjson.Result) *FieldError {
	const msg = "%s must be a string, an array of strings, an array of token ids or an array of arrays of token ids"
	switch {
	case v.Type == gjson.String:
		if v.Str == "" {
			return fieldErr(name, "%s must not be an empty string", name)
		}
		r.write(v.Str)
		return nil
	case !v.IsArray():
		return fieldErr(name, msg, name)
	}
	var err *FieldError
	var kind gjson.Type = -1
	n := 0
	v.ForEach(func(k, e gjson.Result) bool {
		n++
		param := fmt.Sprintf("%s[%d]", name, int(k.Num))
		if kind == -1 {
			kind = e.Type
		}
		switch {
		case e.Type != kind:
			err = fieldErr(param, msg, name)
		case kind == gjson.String:
			if e.Str == "" {
				err = fieldErr(param, "%s must not be an empty string", param)
			}
			r.write(e.Str)
		case kind == gjson.Number:
			if !isTokenID(e) {
				err = fieldErr(param, "%s must be a token id (an integer >= 0)", param)
			}
		case kind == gjson.JSON:
			if !isTokenArray(e) || len(e.Array()) == 0 {
				err = fieldErr(param, "%s must be a non-empty array of token ids", param)
			}
		default:
			err = fieldErr(param, msg, name)
		}
		return err == nil
	})
	if err == nil && n == 0 {
		err = fieldErr(name, "%s must not be empty", name)
	}
	return err
}

// renderDocuments writes a non-empty array of strings, or (objects set)
// of strings and objects with a "text" string.
func renderDocuments(r *Renderer, name string, v gjson.Result, objects bool) *FieldError {
	want := "a non-empty array of strings"
	if objects {
		want = `a non-empty array of strings or of objects with a "text" string`
	}
	if !v.IsArray() {
		return fieldErr(name, "%s must be %s", name, want)
	}
	var err *FieldError
	n := 0
	v.ForEach(func(k, d gjson.Result) bool {
		n++
		switch {
		case d.Type == gjson.String:
			r.write(d.Str)
		case objects && d.IsObject() && d.Get("text").Type == gjson.String:
			r.write(d.Get("text").Str)
		default:
			err = fieldErr(fmt.Sprintf("%s[%d]", name, int(k.Num)), "%s must be %s", name, want)
		}
		return err == nil
	})
	if err == nil && n == 0 {
		err = fieldErr(name, "%s must be %s", name, want)
	}
	return err
}

func positiveInt(_ *poolingParser, name string, v gjson.Result) *FieldError {
	n, err := nonNegInt(name, v)
	if err == nil && n != nil && *n == 0 {
		err = fieldErr(name, "%s must be a positive integer", name)
	}
	if err != nil {
		return fieldErr(name, "%s must be a positive integer", name)
	}
	return nil
}

// MaxCacheSaltBytes bounds a request's cache_salt.
const MaxCacheSaltBytes = 256

// ReadCacheSalt reads vLLM's cache_salt (field name): null, or a
// non-empty string of at most MaxCacheSaltBytes bytes.
func ReadCacheSalt(name string, v gjson.Result) (string, *FieldError) {
	switch {
	case v.Type == gjson.Null:
		return "", nil
	case v.Type != gjson.String:
		return "", fieldErr(name, "%s must be a string", name)
	case v.Str == "":
		return "", fieldErr(name, "%s must not be empty", name)
	case len(v.Str) > MaxCacheSaltBytes:
		return "", fieldErr(name, "%s must be at most %d bytes", name, MaxCacheSaltBytes)
	}
	return v.Str, nil
}
