package openai

import (
	"errors"
	"strings"
	"testing"
)

func TestParseResponses(t *testing.T) {
	cases := []struct {
		name, body string
		prompt     string
		stream     bool
		store      bool
		prev       string
		param      string // the refusal's param
		bad        bool
	}{
		{"string input", `{"model":"m","input":"hi"}`, "user\nhi\n", false, true, "", "", false},
		{"instructions and items", `{"model":"m","instructions":"Be brief.","stream":true,"store":false,
			"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"},{"type":"input_text","text":"b"}]},
			{"type":"function_call_output","call_id":"c","output":"42"}]}`,
			"system\nBe brief.\nuser\nab\nfunction_call_output\n42\n", true, false, "", "", false},
		{"follow-up", `{"model":"m","input":"more","previous_response_id":"resp_1","store":null}`, "user\nmore\n", false, true, "resp_1", "", false},
		{"no model", `{"input":"hi"}`, "", false, false, "", "model", true},
		{"no input", `{"model":"m"}`, "", false, false, "", "input", true},
		{"null input", `{"model":"m","input":null}`, "", false, false, "", "input", true},
		{"input a number", `{"model":"m","input":3}`, "", false, false, "", "input", true},
		{"item neither role nor type", `{"model":"m","input":[{"content":"x"}]}`, "", false, false, "", "input[0]", true},
		{"part text not a string", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":1}]}]}`, "", false, false, "", "input[0].content[0].text", true},
		{"part type not a string", `{"model":"m","input":[{"role":"user","content":[{"type":7,"text":"x"}]}]}`, "", false, false, "", "input[0].content[0].type", true},
		{"empty previous id", `{"model":"m","input":"x","previous_response_id":""}`, "", false, false, "", "previous_response_id", true},
		{"5,000-byte previous id", `{"model":"m","input":"x","previous_response_id":"resp_` + strings.Repeat("a", 4995) + `"}`, "", false, false, "", "previous_response_id", true},
		{"previous id with a slash", `{"model":"m","input":"x","previous_response_id":"resp/1"}`, "", false, false, "", "previous_response_id", true},
		{"duplicate model", `{"model":"m","model":"n","input":"x"}`, "", false, false, "", "model", true},
		{"store not a bool", `{"model":"m","input":"x","store":"yes"}`, "", false, false, "", "store", true},
		{"not an object", `[1]`, "", false, false, "", "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := ParseResponses([]byte(tc.body))
			if tc.bad {
				var fe *FieldError
				if !errors.As(err, &fe) || fe.Param != tc.param {
					t.Fatalf("err %v, want a FieldError on %q", err, tc.param)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if req.Model != "m" || req.Prompt != tc.prompt || req.Stream != tc.stream || req.Store != tc.store || req.PreviousResponseID != tc.prev {
				t.Fatalf("got %+v", req)
			}
			if string(req.PrefixKey) != tc.prompt[:min(len(tc.prompt), PrefixKeyLen)] {
				t.Fatalf("prefix key %q", req.PrefixKey)
			}
		})
	}
}

// TestParseResponsesCacheSalt: a Responses body's cache_salt is read (and
// checked), so that the edge binds it to the key like any other
// endpoint's.
func TestParseResponsesCacheSalt(t *testing.T) {
	req, err := ParseResponses([]byte(`{"model":"m","input":"x","cache_salt":"tenant"}`))
	if err != nil || req.CacheSalt != "tenant" {
		t.Fatalf("got %+v, %v", req, err)
	}
	for _, body := range []string{`{"model":"m","input":"x","cache_salt":1}`, `{"model":"m","input":"x","cache_salt":""}`, `{"model":"m","input":"x","cache_salt":"a","cache_salt":"b"}`} {
		var fe *FieldError
		if _, err := ParseResponses([]byte(body)); !errors.As(err, &fe) || fe.Param != "cache_salt" {
			t.Fatalf("%s: err %v, want a FieldError on cache_salt", body, err)
		}
	}
}
