package openai

import (
	"slices"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
)

// ReadObject validates body as a JSON object in UTF-8 and walks its
// top-level members once: each member whose key is one of fields goes to
// field, a key of fields given twice being refused ("%s is given more
// than once": a body with two "model" keys could be read one way by the
// gateway and another by an engine); every other member goes to other,
// when set. The walk stops at the first error. It returns the object's
// members, which the attempts' rewrites splice into (Request.Object).
// Every parser of a request body walks it with ReadObject; fields holds at
// most 64 names.
func ReadObject(body []byte, fields []string, field func(key string, v gjson.Result) *FieldError, other func(key string) *FieldError) (Object, *FieldError) {
	if !gjson.ValidBytes(body) {
		return Object{}, &FieldError{Msg: "the request body is not valid JSON"}
	}
	if !utf8.Valid(body) {
		// JSON text is UTF-8 (RFC 8259): an engine's JSON reader refuses
		// other bytes, and the gateway would route on strings no engine reads.
		return Object{}, &FieldError{Msg: "the request body is not valid UTF-8"}
	}
	// A view of body, not a copy: a request's body is never modified,
	// and the Object and the Request keep it.
	root := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body)))
	if !root.IsObject() {
		return Object{}, &FieldError{Msg: "the request body must be a JSON object"}
	}
	var (
		o    = objectReader{members: make([]member, 0, 16)}
		seen uint64
		err  *FieldError
	)
	root.ForEach(func(k, v gjson.Result) bool {
		o.add(k, v)
		i := slices.Index(fields, k.Str)
		if i < 0 {
			if other != nil {
				err = other(k.Str)
			}
			return err == nil
		}
		if seen&(1<<i) != 0 {
			err = fieldErr(k.Str, "%s is given more than once", k.Str)
			return false
		}
		seen |= 1 << i
		err = field(k.Str, v)
		return err == nil
	})
	if err != nil {
		return Object{}, err
	}
	return o.object(body), nil
}
