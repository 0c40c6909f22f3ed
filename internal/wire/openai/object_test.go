package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"
	"unicode/utf8"
)

// TestObjectWith: edits set, add and delete top-level members in one copy,
// every other byte as sent; nested members of the same name are left
// alone, and the last edit of a key counts.
func TestObjectWith(t *testing.T) {
	tests := []struct {
		name, body string
		edits      []Edit
		want       string
	}{
		{"set and add", `{"model":"a", "prompt":"p"}`, []Edit{SetString("model", "b"), SetUint("seed", 7), Set("logprobs", []byte("0"))},
			`{"model":"b", "prompt":"p","seed":7,"logprobs":0}`},
		{"add to an empty object", `{ }`, []Edit{SetInt("n", 1), SetInt("m", 2)}, `{ "n":1,"m":2}`},
		{"nested left alone", `{"meta":{"model":"x"},"model":"a"}`, []Edit{SetString("model", "b")}, `{"meta":{"model":"x"},"model":"b"}`},
		{"delete the first", `{"a":1, "b":2, "c":3}`, []Edit{Delete("a")}, `{"b":2, "c":3}`},
		{"delete the middle", `{"a":1, "b":2, "c":3}`, []Edit{Delete("b")}, `{"a":1, "c":3}`},
		{"delete the last", `{"a":1, "b":2, "c":3}`, []Edit{Delete("c")}, `{"a":1, "b":2}`},
		{"delete the first two", `{"a":1,"b":2,"c":3}`, []Edit{Delete("a"), Delete("b")}, `{"c":3}`},
		{"delete two in the middle", `{"a":1, "b":2, "c":3, "d":4}`, []Edit{Delete("b"), Delete("c")}, `{"a":1, "d":4}`},
		{"delete the last two", `{"a":1, "b":2, "c":3}`, []Edit{Delete("b"), Delete("c"), SetInt("z", 0)}, `{"a":1,"z":0}`},
		{"delete all", `{"a":1,"b":2}`, []Edit{Delete("a"), Delete("b")}, `{}`},
		{"delete all, add one", `{"a":1}`, []Edit{Delete("a"), SetInt("z", 9)}, `{"z":9}`},
		{"delete and add after", `{"a":1,"b":2}`, []Edit{Delete("b"), SetInt("c", 3)}, `{"a":1,"c":3}`},
		{"delete an absent key", `{"a":1}`, []Edit{Delete("x")}, `{"a":1}`},
		{"if present: absent", `{"a":1}`, []Edit{{Key: "b", Value: []byte("2"), IfPresent: true}}, `{"a":1}`},
		{"if present: present", `{"b":1}`, []Edit{{Key: "b", Value: []byte("2"), IfPresent: true}}, `{"b":2}`},
		{"the last edit counts", `{"a":1}`, []Edit{SetInt("a", 2), SetInt("a", 3), SetInt("n", 1), SetInt("n", 2)}, `{"a":3,"n":2}`},
		{"a duplicate key: both set", `{"a":1,"a":2}`, []Edit{SetInt("a", 5)}, `{"a":5,"a":5}`},
		{"escaped key added", `{}`, []Edit{SetInt("q\"", 1)}, `{"q\"":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(tt.body)
			o, err := ObjectOf(in)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(o.With(tt.edits...)); got != tt.want {
				t.Fatalf("With = %s, want %s", got, tt.want)
			}
			// Apply's layout is the one ObjectOf reads of the new bytes.
			applied := o.Apply(tt.edits...)
			reread, _ := ObjectOf(applied.Bytes())
			if !reflect.DeepEqual(applied, reread) {
				t.Fatalf("Apply = %+v, want the layout of its bytes %+v", applied, reread)
			}
			if string(in) != tt.body {
				t.Fatalf("input modified: %s", in)
			}
		})
	}
	if _, err := ObjectOf([]byte(`[1]`)); !errors.Is(err, ErrNotObject) {
		t.Fatalf("an array: %v", err)
	}
}

// TestRequestObject: ParseRequest reads the body's members as it
// validates them, so that an attempt's edits need no second parse.
func TestRequestObject(t *testing.T) {
	body := `{"model":"smol", "stream":true, "prompt":"hi", "logprobs":2}`
	req, err := ParseRequest([]byte(body), false)
	if err != nil {
		t.Fatal(err)
	}
	o := req.Object
	if string(o.Raw("logprobs")) != "2" || o.AsksUsage() {
		t.Fatalf("raw logprobs %q, asks usage %v", o.Raw("logprobs"), o.AsksUsage())
	}
	e, _ := o.AskUsage()
	got := string(o.With(SetString("model", "smol-v3"), e))
	if want := `{"model":"smol-v3", "stream":true, "prompt":"hi", "logprobs":2,"stream_options":{"include_usage":true}}`; got != want {
		t.Fatalf("With = %s, want %s", got, want)
	}
}

func TestAskInStream(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"model":"m","stream":true}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream_options":null,"stream":true}`, `{"stream_options":{"include_usage":true},"stream":true}`},
		{`{"stream_options":{"continuous_usage_stats":false}}`, `{"stream_options":{"continuous_usage_stats":false,"include_usage":true}}`},
		{`{"stream_options":{"include_usage":false}}`, `{"stream_options":{"include_usage":true}}`},
		{`{"stream_options":{"include_usage":true}}`, `{"stream_options":{"include_usage":true}}`},
	}
	for _, tc := range cases {
		in := []byte(tc.in)
		o, err := ObjectOf(in)
		got := in
		if e, ok := o.AskUsage(); ok {
			got = o.With(e)
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("AskInStream(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
		if string(in) != tc.in {
			t.Errorf("AskInStream modified its input: %s", in)
		}
		if g, _ := ObjectOf(got); !g.AsksUsage() {
			t.Errorf("Asked(%s) = false", got)
		}
	}
	if o, _ := ObjectOf([]byte(`{"stream_options":{"include_usage":"yes"}}`)); o.AsksUsage() {
		t.Error("a non-boolean include_usage counts as asked")
	}
}

// FuzzObjectWith checks Object's rewrites against encoding/json: for any
// valid JSON object in UTF-8 and any edits, ObjectOf reads the members a JSON
// decoder reads (duplicates included, in order), With's bytes are valid
// JSON holding exactly the members the edits leave (the last edit of a
// key counts; a kept member keeps its place, an added one goes last), and
// Apply's layout is the one ObjectOf reads of its bytes.
func FuzzObjectWith(f *testing.F) {
	f.Add([]byte(`{"model":"a", "prompt":"p"}`), []byte{0, 1, 0, 7, 2, 0})
	f.Add([]byte(`{"a":1,"a":2,"b":{"a":3}}`), []byte{0, 0, 0, 1, 1, 1, 8, 3, 0})
	f.Add([]byte(` { } `), []byte{9, 4, 0, 10, 0, 1})
	f.Add([]byte(`{"\u0061":[1,{"x":"}"}],"b":"\"}"}`), []byte{0, 0, 0, 1, 2, 0})
	f.Fuzz(func(t *testing.T, body, spec []byte) {
		if !json.Valid(body) || !utf8.Valid(body) || checkObject(body) != nil {
			return
		}
		in := slices.Clone(body)
		o, err := ObjectOf(body)
		if err != nil {
			t.Fatalf("ObjectOf(%q): %v", body, err)
		}
		want := decodeMembers(t, body)
		got := make([]decodedMember, len(o.members))
		for i, m := range o.members {
			got[i] = decodedMember{m.key, compactJSON(t, body[m.valStart:m.valEnd])}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("ObjectOf(%q) members %q, a JSON decoder reads %q", body, got, want)
		}

		edits := fuzzEdits(want, spec)
		out := o.With(edits...)
		if !json.Valid(out) {
			t.Fatalf("With(%q, %+v) = %q: not valid JSON", body, edits, out)
		}
		if g, w := decodeMembers(t, out), editedMembers(want, edits); !slices.Equal(g, w) {
			t.Fatalf("With(%q, %+v) = %q: members %q, want %q", body, edits, out, g, w)
		}
		applied := o.Apply(edits...)
		if !bytes.Equal(applied.Bytes(), out) {
			t.Fatalf("Apply(%q) = %q, With = %q", body, applied.Bytes(), out)
		}
		if reread, _ := ObjectOf(out); !reflect.DeepEqual(applied, reread) {
			t.Fatalf("Apply(%q, %+v) layout %+v, ObjectOf of its bytes %+v", body, edits, applied, reread)
		}
		if !bytes.Equal(body, in) {
			t.Fatalf("input modified: %q, was %q", body, in)
		}
	})
}

// decodedMember is a top-level member as encoding/json reads it: its key
// unescaped, its value compacted.
type decodedMember struct{ key, value string }

// decodeMembers returns the top-level members of the JSON object body, in
// order, duplicates included.
func decodeMembers(t *testing.T, body []byte) []decodedMember {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(body))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%q: not an object: %v %v", body, tok, err)
	}
	var ms []decodedMember
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		ms = append(ms, decodedMember{tok.(string), compactJSON(t, v)})
	}
	return ms
}

func compactJSON(t *testing.T, raw []byte) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatalf("compact %q: %v", raw, err)
	}
	return b.String()
}

// fuzzEdits reads up to 8 edits from spec, three bytes each: the key (one
// of ms's or of a fixed few), the value (a deletion or one of a few JSON
// values) and whether the edit applies only to a key present.
func fuzzEdits(ms []decodedMember, spec []byte) []Edit {
	keys := []string{"model", "stream", "seed", "x", "é", `q"`, ""}
	for _, m := range ms {
		keys = append(keys, m.key)
	}
	values := []string{"", "1", `"s"`, "null", `{"a":[1,2]}`, "[]", "true", `"}"`}
	var edits []Edit
	for i := 0; i+2 < len(spec) && len(edits) < 8; i += 3 {
		e := Edit{Key: keys[int(spec[i])%len(keys)], IfPresent: spec[i+2]&1 == 1}
		if v := values[int(spec[i+1])%len(values)]; v != "" {
			e.Value = []byte(v)
		}
		edits = append(edits, e)
	}
	return edits
}

// editedMembers is what Edit promises of ms with edits applied.
func editedMembers(ms []decodedMember, edits []Edit) []decodedMember {
	last := make(map[string]int) // each key's last edit
	for i, e := range edits {
		last[e.Key] = i
	}
	var out []decodedMember
	has := make(map[string]bool)
	for _, m := range ms {
		has[m.key] = true
		i, ok := last[m.key]
		switch {
		case !ok:
			out = append(out, m)
		case edits[i].Value != nil:
			out = append(out, decodedMember{m.key, string(edits[i].Value)})
		}
	}
	for i, e := range edits {
		if last[e.Key] == i && e.Value != nil && !e.IfPresent && !has[e.Key] {
			out = append(out, decodedMember{e.Key, string(e.Value)})
		}
	}
	return out
}
