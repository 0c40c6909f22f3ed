package jsontest

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestPlain(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want bool
	}{
		{`{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}`, true},
		{`[1,"x",null]`, true},
		{`{"a":1,"a":2}`, false},
		{`{"a":{"b":1,"b":2}}`, false},
		{`[{"x":1},{"y":1,"y":2}]`, false},
		{`{"\u0061":1,"a":2}`, false},
		{`{"a":1`, false},
		{"{\"a\":\"\xff\"}", false},
	} {
		if got := Plain([]byte(tc.doc)); got != tc.want {
			t.Errorf("Plain(%q) = %v, want %v", tc.doc, got, tc.want)
		}
	}
}

func TestDecode(t *testing.T) {
	got := Decode([]byte(`{"n":18446744073709551615,"l":[1.50]}`))
	want := map[string]any{"n": json.Number("18446744073709551615"), "l": []any{json.Number("1.50")}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Decode = %#v, want %#v", got, want)
	}
	if Decode([]byte(`{`)) != nil {
		t.Fatal("Decode of a broken document is not nil")
	}
}
