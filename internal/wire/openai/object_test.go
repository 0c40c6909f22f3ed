package openai

import (
	"errors"
	"reflect"
	"testing"
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
