package dialect

import (
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/tlgate/tlgate/internal/routing/cascade"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// Answer is a whole answer of an engine, read once: Read validates it and
// walks its top-level members in one pass, and everything later (the
// proxy's judgement, a cascade's logprobs, the usage, a stored response's
// id, the logprobs a client did not ask for) takes them from here.
type Answer struct {
	// Body is the answer's bytes, as the engine sent them.
	Body   []byte
	reads  int  // parses of Body (Reads)
	json   bool // valid JSON
	object bool // a JSON object
	// The top-level members the dialects and the stages read: the first
	// of each key.
	choices, usage, id, objectMember, typ, data, results, tokens, prompt, output, content gjson.Result
}

// member returns where the member key is kept, or nil for a key no stage
// reads.
func (a *Answer) member(key string) *gjson.Result {
	switch key {
	case "choices":
		return &a.choices
	case "usage":
		return &a.usage
	case "id":
		return &a.id
	case "object":
		return &a.objectMember
	case "type":
		return &a.typ
	case "data":
		return &a.data
	case "results":
		return &a.results
	case "tokens":
		return &a.tokens
	case "prompt":
		return &a.prompt
	case "output":
		return &a.output
	case "content":
		return &a.content
	}
	return nil
}

// Read reads body once: a JSON object's top-level members. An answer that
// is not a JSON object has none (Object reports false).
func Read(body []byte) Answer {
	a := Answer{Body: body, reads: 1}
	if !gjson.ValidBytes(body) {
		return a
	}
	a.json = true
	// A view of body, not a copy: the answer's bytes are never modified,
	// and what is kept of them (Get) lives no longer than they do.
	root := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body)))
	if !root.IsObject() {
		return a
	}
	a.object = true
	root.ForEach(func(k, v gjson.Result) bool {
		if m := a.member(k.Str); m != nil && !m.Exists() {
			*m = v
		}
		return true
	})
	return a
}

// Reads returns how many times the answer's body was parsed: one, by Read,
// whatever is taken from it later.
func (a *Answer) Reads() int { return a.reads }

// JSON reports whether the answer is valid JSON (an object or not).
func (a *Answer) JSON() bool { return a.json }

// Object reports whether the answer is a JSON object.
func (a *Answer) Object() bool { return a.object }

// Get returns the first top-level member key (its Index is its offset in
// Body), of the members the stages read (choices, usage, id, object, type,
// data, results, tokens, prompt, output, content); a Result that does not
// exist for any other key or when there is none.
func (a *Answer) Get(key string) gjson.Result {
	if m := a.member(key); m != nil {
		return *m
	}
	return gjson.Result{}
}

// ID returns the answer's "id" when it is a non-empty string (a stored
// response's), else "".
func (a *Answer) ID() string {
	if id := a.Get("id"); id.Type == gjson.String {
		return strings.Clone(id.Str)
	}
	return ""
}

// Logprobs returns the logprobs of the answer's first choice, in either
// shape (cascade.ChoiceLogprobs): what a cascade step's accept_if judges.
func (a *Answer) Logprobs() ([]float64, error) {
	if !a.object {
		a.reads++
		return cascade.LogprobsOf(a.Body) // the error it names
	}
	return cascade.ChoiceLogprobs(a.Get("choices"))
}

// StripLogprobs returns the answer's bytes with every choice's logprobs
// set to null (openai.StripChoicesLogprobs).
func (a *Answer) StripLogprobs() []byte {
	return openai.StripChoicesLogprobs(a.Body, a.Get("choices"))
}

// TrimTopLogprobs returns the answer's bytes with at most n alternatives
// per token (openai.TrimChoicesTopLogprobs).
func (a *Answer) TrimTopLogprobs(n int) []byte {
	return openai.TrimChoicesTopLogprobs(a.Body, a.Get("choices"), n)
}
