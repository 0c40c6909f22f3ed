package openai

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/tidwall/gjson"
)

// PrefixKey returns the affinity key of a completions or chat body (design
// 2.3): the leading PrefixKeyLen bytes of the rendered prompt, that is the
// completions prompt, or the chat messages written as "role\ncontent\n" in
// order (content parts contribute their text parts, concatenated). A body
// with a "messages" array is read as chat, otherwise its "prompt" is used.
// Malformed parts are skipped; a body that is not JSON has no key (nil). It
// never returns more than PrefixKeyLen bytes and never panics. For a body
// ParseRequest accepts, it equals Request.PrefixKey.
func PrefixKey(body []byte) []byte {
	if !gjson.ValidBytes(body) {
		return nil
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return nil
	}
	r := Renderer{limit: PrefixKeyLen, buf: make([]byte, 0, PrefixKeyLen)}
	if msgs := root.Get("messages"); msgs.IsArray() {
		_ = renderMessages(&r, msgs, false, Brackets)
	} else if prompt := root.Get("prompt"); prompt.Exists() {
		_ = renderPrompt(&r, prompt, false)
	}
	if len(r.buf) == 0 {
		return nil
	}
	return r.buf
}

// Renderer accumulates a request's rendered prompt (Request.Prompt), up to
// limit bytes (-1: no limit): what the prefix index hashes and the usage
// estimate counts. Every API's parser renders its prompt with one.
type Renderer struct {
	buf   []byte
	limit int
}

// NewRenderer returns a Renderer without a limit.
func NewRenderer() *Renderer { return &Renderer{limit: -1} }

// Bytes returns what was rendered.
func (r *Renderer) Bytes() []byte { return r.buf }

func (r *Renderer) full() bool { return r.limit >= 0 && len(r.buf) >= r.limit }

// Write appends s.
func (r *Renderer) Write(s string) { r.write(s) }

func (r *Renderer) write(s string) {
	if r.limit >= 0 {
		s = s[:min(len(s), r.limit-len(r.buf))]
	}
	r.buf = append(r.buf, s...)
}

// Notation is how an API names a field inside an array in its errors'
// param: OpenAI's "messages[2].content" (Brackets) or Anthropic's
// "messages.2.content" (Dots); Parts is what it calls a content's parts.
type Notation struct {
	dots  bool
	Parts string
}

// The notations.
var (
	Brackets = Notation{Parts: "content parts"}
	Dots     = Notation{dots: true, Parts: "content blocks"}
)

// Elem names element i of the array field.
func (n Notation) Elem(field string, i int) string {
	if n.dots {
		return field + "." + strconv.Itoa(i)
	}
	return field + "[" + strconv.Itoa(i) + "]"
}

// RenderMessages writes a messages array as the prompt renders it (see
// Request.Prompt), reporting the first malformed message as a *FieldError
// whose param is in n's notation.
func RenderMessages(r *Renderer, msgs gjson.Result, n Notation) *FieldError {
	return renderMessages(r, msgs, true, n)
}

// renderMessages writes chat messages as "role\ncontent\n". With strict set
// it reports the first malformed message as a *FieldError; otherwise it
// renders what it can. It stops early once the renderer is full.
func renderMessages(r *Renderer, msgs gjson.Result, strict bool, n Notation) *FieldError {
	if !msgs.IsArray() {
		return fieldErr("messages", "messages must be an array of messages")
	}
	var err *FieldError
	count := 0
	msgs.ForEach(func(k, m gjson.Result) bool {
		count++
		if r.full() && !strict {
			return false
		}
		i := int(k.Num)
		var bad *FieldError
		role := m.Get("role")
		switch {
		case !m.IsObject():
			p := n.Elem("messages", i)
			bad = fieldErr(p, "%s must be an object", p)
		case role.Type != gjson.String || role.Str == "":
			p := n.Elem("messages", i) + ".role"
			bad = fieldErr(p, "%s must be a non-empty string", p)
		default:
			r.write(role.Str)
			r.write("\n")
			bad = renderContent(r, m.Get("content"), n.Elem("messages", i)+".content", chatTextParts, n)
			r.write("\n")
		}
		if bad != nil && err == nil {
			err = bad
		}
		return bad == nil || !strict
	})
	if strict && err == nil && count == 0 {
		err = fieldErr("messages", "messages must not be empty")
	}
	return err
}

// Part types whose text a message's content renders (TextParts: chat's
// and Anthropic's).
var (
	TextParts          = chatTextParts
	chatTextParts      = []string{"text"}
	responsesTextParts = []string{"input_text", "output_text", "text"}
)

// RenderContent writes a content (param names it, in n's notation: a
// message's, or Anthropic's system prompt) as the prompt renders it: see
// renderContent.
func RenderContent(r *Renderer, c gjson.Result, param string, textParts []string, n Notation) *FieldError {
	return renderContent(r, c, param, textParts, n)
}

// renderContent writes a content, param (chat's "messages[i].content",
// Responses' "input[i].content"): a string, an array of parts, or nothing
// for null or absent. A part must be an object with a string type; the
// parts of a type in textParts contribute their text, which must be a
// string; other parts are skipped. It reports the first malformed part as
// a *FieldError naming it (param[k], .type or .text, in n's notation) and
// renders the others.
func renderContent(r *Renderer, c gjson.Result, param string, textParts []string, n Notation) *FieldError {
	switch {
	case !c.Exists() || c.Type == gjson.Null:
		return nil
	case c.Type == gjson.String:
		r.write(c.Str)
		return nil
	case !c.IsArray():
		return fieldErr(param, "%s must be a string or an array of %s", param, n.Parts)
	}
	var err *FieldError
	c.ForEach(func(k, part gjson.Result) bool {
		var bad string
		typ := part.Get("type")
		switch {
		case !part.IsObject():
			bad = ""
		case typ.Type != gjson.String:
			bad = ".type"
		case !slices.Contains(textParts, typ.Str):
			return true
		case part.Get("text").Type != gjson.String:
			bad = ".text"
		default:
			r.write(part.Get("text").Str)
			return true
		}
		if err == nil {
			param := n.Elem(param, int(k.Num)) + bad
			if bad == "" {
				err = fieldErr(param, "%s must be an object", param)
			} else {
				err = fieldErr(param, "%s must be a string", param)
			}
		}
		return true
	})
	return err
}

// renderPrompt writes a completions prompt: a string, an array of strings
// (concatenated in order), or token ids (an array of integers, or an array of
// such arrays), which render as empty text.
func renderPrompt(r *Renderer, p gjson.Result, strict bool) *FieldError {
	const msg = "prompt must be a string, an array of strings, or an array of token ids"
	if p.Type == gjson.String {
		r.write(p.Str)
		return nil
	}
	if !p.IsArray() {
		return fieldErr("prompt", msg)
	}
	var err *FieldError
	var kind gjson.Type = -1
	count := 0
	p.ForEach(func(k, e gjson.Result) bool {
		count++
		if kind == -1 {
			kind = e.Type
		}
		ok := e.Type == kind
		switch {
		case !ok:
		case kind == gjson.String:
			r.write(e.Str)
		case kind == gjson.Number:
			ok = isTokenID(e)
		case kind == gjson.JSON:
			ok = isTokenArray(e)
		default:
			ok = false
		}
		if !ok && err == nil {
			err = fieldErr(fmt.Sprintf("prompt[%d]", int(k.Num)), msg)
		}
		if !ok && strict {
			return false
		}
		return !r.full() || strict
	})
	if err == nil && count == 0 {
		err = fieldErr("prompt", "prompt must not be empty")
	}
	return err
}

func isTokenID(v gjson.Result) bool {
	n, ok := integer(v)
	return ok && n >= 0
}

func isTokenArray(v gjson.Result) bool {
	if !v.IsArray() {
		return false
	}
	ok := true
	v.ForEach(func(_, e gjson.Result) bool {
		ok = isTokenID(e)
		return ok
	})
	return ok
}
