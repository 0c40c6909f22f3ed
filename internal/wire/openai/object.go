package openai

import (
	"bytes"
	"strconv"

	"github.com/tidwall/gjson"
)

// Object is a JSON object's bytes and where each of its top-level members
// lies in them, read in the one pass that parsed the object: what the
// rewrites splice values into, so that an attempt's body is built with one
// copy of the client's bytes and no second parse. Every other byte stays as
// the client sent it. An Object is never modified once read: With returns
// new bytes.
type Object struct {
	body    []byte
	members []member
	end     int // the index of the closing brace
}

// member is one top-level member: its key, and where its value lies.
type member struct {
	key              string
	valStart, valEnd int
	keyStart         int // the key's opening quote
}

// Edit sets (Value: raw JSON) or deletes (Value nil) the top-level member
// Key: every member of that key is replaced, or removed; a key the object
// lacks is added at its end (a deletion of one does nothing).
type Edit struct {
	Key   string
	Value []byte
	// IfPresent: a key the object lacks is not added.
	IfPresent bool
}

// Set is the Edit that sets key to the raw JSON value.
func Set(key string, value []byte) Edit { return Edit{Key: key, Value: value} }

// SetString is the Edit that sets key to the JSON string s.
func SetString(key, s string) Edit { return Edit{Key: key, Value: gjson.AppendJSONString(nil, s)} }

// SetUint is the Edit that sets key to n.
func SetUint(key string, n uint64) Edit { return Edit{Key: key, Value: strconv.AppendUint(nil, n, 10)} }

// SetInt is the Edit that sets key to n.
func SetInt(key string, n int) Edit {
	return Edit{Key: key, Value: strconv.AppendInt(nil, int64(n), 10)}
}

// Delete is the Edit that removes key.
func Delete(key string) Edit { return Edit{Key: key} }

// ObjectOf reads body as a JSON object (its first non-space byte must be
// '{', else ErrNotObject), for rewriting. It does not validate the whole
// body: the parsers do that (ParseRequest reads the same members as it
// validates them, Request.Object).
func ObjectOf(body []byte) (Object, error) {
	if err := checkObject(body); err != nil {
		return Object{}, err
	}
	var o objectReader
	gjson.ParseBytes(body).ForEach(func(k, v gjson.Result) bool {
		o.add(k, v)
		return true
	})
	return o.object(body), nil
}

// objectReader collects an object's members while a parser walks them.
type objectReader struct {
	members []member
}

// add records the member k: v of a walk over an object's top level.
func (o *objectReader) add(k, v gjson.Result) {
	o.members = append(o.members, member{key: k.Str, keyStart: k.Index, valStart: v.Index, valEnd: v.Index + len(v.Raw)})
}

// object is the Object of body whose members o collected.
func (o *objectReader) object(body []byte) Object {
	end := bytes.LastIndexByte(body, '}')
	if end < 0 {
		end = len(body)
	}
	return Object{body: body, members: o.members, end: end}
}

// Bytes returns the object's bytes, as read: the caller must not modify
// them.
func (o Object) Bytes() []byte { return o.body }

// Raw returns the raw value of the first member key, or nil.
func (o Object) Raw(key string) []byte {
	for _, m := range o.members {
		if m.key == key {
			return o.body[m.valStart:m.valEnd]
		}
	}
	return nil
}

// Has reports whether the object has a member key whose value is not null.
func (o Object) Has(key string) bool {
	v := o.Raw(key)
	return v != nil && !bytes.Equal(v, null)
}

var null = []byte("null")

// With returns new bytes: the object's with edits applied, in one copy.
// When several edits name one key, the last counts. The object itself is
// not modified.
func (o Object) With(edits ...Edit) []byte { return o.apply(edits, false).body }

// Apply returns the object with edits applied, as With, and where each
// member lies in the new bytes: an object to rewrite again without
// parsing it.
func (o Object) Apply(edits ...Edit) Object { return o.apply(edits, true) }

// apply builds the edited bytes and, with layout set, their members.
func (o Object) apply(edits []Edit, layout bool) Object {
	n := len(o.body)
	for _, e := range edits {
		n += len(e.Key) + len(e.Value) + 4
	}
	out := make([]byte, 0, n)
	var members []member
	if layout {
		members = make([]member, 0, len(o.members)+len(edits))
	}
	at := 0         // the next byte of o.body to copy
	kept := -1      // the last member kept (as it was, or with a new value)
	leading := true // no member kept yet: a deleted one takes the comma after it
	for i, m := range o.members {
		e, ok := lastEdit(edits, m.key)
		switch {
		case ok && e.Value == nil: // deleted, with the comma that joins it to a neighbour
			if kept >= 0 && at < o.members[kept].valEnd {
				out = append(out, o.body[at:o.members[kept].valEnd]...)
			} else if kept < 0 && leading {
				out = append(out, o.body[at:m.keyStart]...)
				leading = false
			}
			at = m.valEnd
			continue
		case kept < 0 && !leading: // the first member kept after deleted ones
			at = m.keyStart
		}
		shift := len(out) - at // where o.body[at:] lands in out
		nm := member{key: m.key, keyStart: m.keyStart + shift, valStart: m.valStart + shift, valEnd: m.valEnd + shift}
		if ok {
			out = append(append(out, o.body[at:m.valStart]...), e.Value...)
			at = m.valEnd
			nm.valEnd = len(out)
		}
		if layout {
			members = append(members, nm)
		}
		kept, leading = i, false
	}
	insert := max(at, o.end)
	if kept >= 0 {
		insert = max(at, o.members[kept].valEnd)
	}
	out = append(out, o.body[at:insert]...)
	added := false
	for i, e := range edits {
		if e.Value == nil || e.IfPresent || o.has(e.Key) || overridden(edits, i) {
			continue
		}
		if kept >= 0 || added {
			out = append(out, ',')
		}
		added = true
		start := len(out)
		out = gjson.AppendJSONString(out, e.Key)
		out = append(out, ':')
		vs := len(out)
		out = append(out, e.Value...)
		if layout {
			members = append(members, member{key: e.Key, keyStart: start, valStart: vs, valEnd: len(out)})
		}
	}
	end := len(out) + (o.end - insert)
	out = append(out, o.body[insert:]...)
	if len(members) == 0 {
		members = nil
	}
	return Object{body: out, members: members, end: end}
}

// has reports whether the object has a member key.
func (o Object) has(key string) bool {
	for _, m := range o.members {
		if m.key == key {
			return true
		}
	}
	return false
}

// lastEdit returns the last of edits for key.
func lastEdit(edits []Edit, key string) (Edit, bool) {
	for i := len(edits) - 1; i >= 0; i-- {
		if edits[i].Key == key {
			return edits[i], true
		}
	}
	return Edit{}, false
}

// overridden reports whether a later edit names the key of edits[i].
func overridden(edits []Edit, i int) bool {
	for _, e := range edits[i+1:] {
		if e.Key == edits[i].Key {
			return true
		}
	}
	return false
}
