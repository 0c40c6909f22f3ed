package dialect

import (
	"strings"

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
	Body    []byte
	reads   int  // parses of Body (Reads)
	json    bool // valid JSON
	object  bool // a JSON object
	members []answerMember
}

type answerMember struct {
	key string
	v   gjson.Result
}

// Read reads body once: a JSON object's top-level members. An answer that
// is not a JSON object has none (Object reports false).
func Read(body []byte) Answer {
	a := Answer{Body: body, reads: 1}
	if !gjson.ValidBytes(body) {
		return a
	}
	a.json = true
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return a
	}
	a.object = true
	root.ForEach(func(k, v gjson.Result) bool {
		a.members = append(a.members, answerMember{key: k.Str, v: v})
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
// Body); a Result that does not exist when there is none.
func (a *Answer) Get(key string) gjson.Result {
	for _, m := range a.members {
		if m.key == key {
			return m.v
		}
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
