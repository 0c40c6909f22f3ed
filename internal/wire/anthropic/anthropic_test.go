package anthropic

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestParseRequest(t *testing.T) {
	cases := []struct {
		name, body, prompt, param string
		stream, bad               bool
	}{
		{"string system and content", `{"model":"m","max_tokens":5,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}`,
			"system\nBe brief.\nuser\nhi\n", "", false, false},
		{"blocks", `{"model":"m","stream":true,"system":[{"type":"text","text":"S"}],"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{}},{"type":"text","text":"b"}]},{"role":"assistant","content":"c"}]}`,
			"system\nS\nuser\nab\nassistant\nc\n", "", true, false},
		{"no model", `{"messages":[{"role":"user","content":"x"}]}`, "", "model", false, true},
		{"no messages", `{"model":"m"}`, "", "messages", false, true},
		{"empty messages", `{"model":"m","messages":[]}`, "", "messages", false, true},
		{"role missing", `{"model":"m","messages":[{"content":"x"}]}`, "", "messages.0.role", false, true},
		{"block text not a string", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":2}]}]}`, "", "messages.0.content.0.text", false, true},
		{"system a number", `{"model":"m","system":1,"messages":[{"role":"user","content":"x"}]}`, "", "system", false, true},
		{"stream not a bool", `{"model":"m","stream":1,"messages":[{"role":"user","content":"x"}]}`, "", "stream", false, true},
		{"not JSON", `{`, "", "", false, true},
		{"cache_salt not a string", `{"model":"m","cache_salt":5,"messages":[{"role":"user","content":"x"}]}`, "", "cache_salt", false, true},
		{"cache_salt twice", `{"model":"m","cache_salt":"a","cache_salt":"b","messages":[{"role":"user","content":"x"}]}`, "", "cache_salt", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := ParseRequest([]byte(tc.body))
			if tc.bad {
				var fe *openai.FieldError
				if !errors.As(err, &fe) || fe.Param != tc.param {
					t.Fatalf("err %v, want a FieldError on %q", err, tc.param)
				}
				return
			}
			if err != nil || req.Model != "m" || req.Prompt != tc.prompt || req.Stream != tc.stream {
				t.Fatalf("got %+v, %v", req, err)
			}
		})
	}
}

// TestParseRequestCacheSalt: a Messages body's cache_salt is read, so that
// the edge binds it to the key like any other endpoint's.
func TestParseRequestCacheSalt(t *testing.T) {
	req, err := ParseRequest([]byte(`{"model":"m","cache_salt":"tenant","messages":[{"role":"user","content":"x"}]}`))
	if err != nil || req.CacheSalt != "tenant" {
		t.Fatalf("got %+v, %v", req, err)
	}
}

func TestErrors(t *testing.T) {
	for status, typ := range map[int]string{400: TypeInvalidRequest, 401: TypeAuthentication, 403: TypePermission, 404: TypeNotFound,
		413: TypeRequestTooBig, 429: TypeRateLimit, 500: TypeAPI, 502: TypeAPI, 503: TypeOverloaded, 529: TypeOverloaded, 405: TypeInvalidRequest} {
		if got := ErrorType(status); got != typ {
			t.Errorf("ErrorType(%d) = %s, want %s", status, got, typ)
		}
	}
	rec := httptest.NewRecorder()
	WriteError(rec, http.StatusNotFound, `model "x" <none>`)
	if want := `{"type":"error","error":{"type":"not_found_error","message":"model \"x\" <none>"}}`; rec.Body.String() != want || rec.Code != 404 {
		t.Fatalf("%d %s, want %s", rec.Code, rec.Body, want)
	}
	if got, want := string(SSEError("cut")), "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"cut\"}}\n\n"; got != want {
		t.Fatalf("SSEError = %q, want %q", got, want)
	}
}
