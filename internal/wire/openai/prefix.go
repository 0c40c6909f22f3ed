package openai

import (
	"fmt"
	"slices"

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
	r := renderer{limit: PrefixKeyLen, buf: make([]byte, 0, PrefixKeyLen)}
	if msgs := root.Get("messages"); msgs.IsArray() {
		_ = renderMessages(&r, msgs, false)
	} else if prompt := root.Get("prompt"); prompt.Exists() {
		_ = renderPrompt(&r, prompt, false)
	}
	if len(r.buf) == 0 {
		return nil
	}
	return r.buf
}

// renderer accumulates the rendered prompt, up to limit bytes (-1: no limit).
type renderer struct {
	buf   []byte
	limit int
}

func (r *renderer) full() bool { return r.limit >= 0 && len(r.buf) >= r.limit }

func (r *renderer) write(s string) {
	if r.limit >= 0 {
		s = s[:min(len(s), r.limit-len(r.buf))]
	}
	r.buf = append(r.buf, s...)
}

// renderMessages writes chat messages as "role\ncontent\n". With strict set
// it reports the first malformed message as a *FieldError; otherwise it
// renders what it can. It stops early once the renderer is full.
func renderMessages(r *renderer, msgs gjson.Result, strict bool) *FieldError {
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
			bad = fieldErr(fmt.Sprintf("messages[%d]", i), "messages[%d] must be an object", i)
		case role.Type != gjson.String || role.Str == "":
			bad = fieldErr(fmt.Sprintf("messages[%d].role", i), "messages[%d].role must be a non-empty string", i)
		default:
			r.write(role.Str)
			r.write("\n")
			bad = renderContent(r, m.Get("content"), "messages", i, chatTextParts)
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

// Part types whose text a message's content renders.
var (
	chatTextParts      = []string{"text"}
	responsesTextParts = []string{"input_text", "output_text", "text"}
)

// renderContent writes the content of message i of the array field (chat's
// "messages", Responses' "input"): a string, an array of parts, or nothing
// for null or absent. A part must be an object with a string type; the
// parts of a type in textParts contribute their text, which must be a
// string; other parts are skipped. It reports the first malformed part as
// a *FieldError naming it (field[i].content[k], .type or .text) and
// renders the others.
func renderContent(r *renderer, c gjson.Result, field string, i int, textParts []string) *FieldError {
	switch {
	case !c.Exists() || c.Type == gjson.Null:
		return nil
	case c.Type == gjson.String:
		r.write(c.Str)
		return nil
	case !c.IsArray():
		return fieldErr(fmt.Sprintf("%s[%d].content", field, i),
			"%s[%d].content must be a string or an array of content parts", field, i)
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
			param := fmt.Sprintf("%s[%d].content[%d]%s", field, i, int(k.Num), bad)
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
func renderPrompt(r *renderer, p gjson.Result, strict bool) *FieldError {
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
