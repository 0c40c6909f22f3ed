package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

const (
	opsSecret   = "sk-ops-0123456789"
	userSecret  = "sk-user-abcdef"
	hashSecret  = "sk-hashed-key-42"
	debugSecret = "sk-debug-zzz"
)

func sha(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:])
}

func testRing(t *testing.T) *Keyring {
	t.Helper()
	kr, err := New([]KeySpec{
		{Name: "ops", Secret: opsSecret, Scopes: []string{"inference", "debug", "admin"}},
		{Name: "user", Secret: userSecret, Scopes: []string{"inference"}},
		{Name: "hashed", SHA256: sha(hashSecret), Scopes: []string{"inference", "inference"}},
		{Name: "debugger", SHA256: strings.ToUpper(sha(debugSecret)), Scopes: []string{"debug"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func TestAuthScopes(t *testing.T) {
	kr := testRing(t)
	none, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		ring     *Keyring
		header   string // "" means no Authorization header
		scope    Scope
		wantErr  error
		wantName string
		wantCode int
	}{
		{"missing", kr, "", ScopeInference, ErrMissingKey, "", 401},
		{"malformed: no scheme", kr, userSecret, ScopeInference, ErrNotBearer, "", 401},
		{"malformed: basic", kr, "Basic " + userSecret, ScopeInference, ErrNotBearer, "", 401},
		{"malformed: empty bearer", kr, "Bearer ", ScopeInference, ErrNotBearer, "", 401},
		{"malformed: two tokens", kr, "Bearer " + userSecret + " x", ScopeInference, ErrNotBearer, "", 401},
		{"wrong key", kr, "Bearer sk-nope", ScopeInference, ErrInvalidKey, "", 401},
		{"key prefix is not the key", kr, "Bearer " + userSecret[:len(userSecret)-1], ScopeInference, ErrInvalidKey, "", 401},
		{"sha256 given as the key is not the key", kr, "Bearer " + sha(hashSecret), ScopeInference, ErrInvalidKey, "", 401},
		{"plain key, right scope", kr, "Bearer " + userSecret, ScopeInference, nil, "user", 200},
		{"scheme case-insensitive", kr, "bearer " + userSecret, ScopeInference, nil, "user", 200},
		{"plain key, wrong scope", kr, "Bearer " + userSecret, ScopeAdmin, nil, "user", 403},
		{"plain key, no debug", kr, "Bearer " + userSecret, ScopeDebug, nil, "user", 403},
		{"sha256 key, right scope", kr, "Bearer " + hashSecret, ScopeInference, nil, "hashed", 200},
		{"sha256 key, wrong scope", kr, "Bearer " + hashSecret, ScopeDebug, nil, "hashed", 403},
		{"upper-case sha256 key", kr, "Bearer " + debugSecret, ScopeDebug, nil, "debugger", 200},
		{"debug only is not inference", kr, "Bearer " + debugSecret, ScopeInference, nil, "debugger", 403},
		{"all scopes: admin", kr, "Bearer " + opsSecret, ScopeAdmin, nil, "ops", 200},
		{"no keys: anonymous inference", none, "", ScopeInference, nil, "anonymous", 200},
		{"no keys: anonymous admin", none, "Bearer whatever", ScopeAdmin, nil, "anonymous", 200},
		{"no keys: anonymous debug", none, "", ScopeDebug, nil, "anonymous", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
			if tt.header != "" {
				r.Header.Set("Authorization", tt.header)
			}
			key, err := tt.ring.Authenticate(r)
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("Authenticate error = %v, want %v", err, tt.wantErr)
			}
			if key.Name != tt.wantName {
				t.Fatalf("key = %q, want %q", key.Name, tt.wantName)
			}
			if f := strings.Fields(tt.header); err != nil && len(f) > 0 && f[len(f)-1] != "Bearer" && strings.Contains(err.Error(), f[len(f)-1]) {
				t.Fatalf("error %q shows the presented key", err)
			}

			var inner Key
			var called bool
			h := tt.ring.Require(tt.scope, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				called = true
				inner, _ = FromContext(r.Context())
			}))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			if rec.Code != tt.wantCode {
				t.Fatalf("Require status = %d, want %d (%s)", rec.Code, tt.wantCode, rec.Body)
			}
			if called != (tt.wantCode == 200) {
				t.Fatalf("next called = %v with status %d", called, rec.Code)
			}
			if called {
				if inner.Name != tt.wantName || !inner.Has(tt.scope) {
					t.Fatalf("context key = %+v", inner)
				}
				return
			}
			wantCode := map[int]string{401: "invalid_api_key", 403: "insufficient_scope"}[tt.wantCode]
			var body struct {
				Error struct {
					Code, Type, Message string
					Param               *string
				}
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %s: %v", rec.Body, err)
			}
			if body.Error.Code != wantCode || body.Error.Param != nil || body.Error.Message == "" {
				t.Fatalf("error body %s, want code %s", rec.Body, wantCode)
			}
			// A malformed header is told apart from a wrong key: the
			// message says what the header must be.
			if errors.Is(tt.wantErr, ErrNotBearer) != strings.Contains(body.Error.Message, `not "Bearer <key>"`) {
				t.Fatalf("message %q for header %q", body.Error.Message, tt.header)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type = %q", ct)
			}
			for _, s := range []string{opsSecret, userSecret, hashSecret, debugSecret, "sk-nope", sha(hashSecret)} {
				if strings.Contains(rec.Body.String(), s) || strings.Contains(rec.Header().Get("WWW-Authenticate"), s) {
					t.Fatalf("response shows a key: %s", rec.Body)
				}
			}
		})
	}
	if !kr.Enabled() || none.Enabled() {
		t.Fatalf("Enabled: with keys %v, without %v", kr.Enabled(), none.Enabled())
	}
	if a := AnonymousKey(); !a.Anonymous || !slices.Equal(a.Scopes, AllScopes()) {
		t.Fatalf("AnonymousKey = %+v", a)
	}
}

func TestNewRejectsBadSpecs(t *testing.T) {
	const secret = "sk-very-secret-value"
	tests := []struct {
		name  string
		specs []KeySpec
	}{
		{"no name", []KeySpec{{Secret: secret, Scopes: []string{"inference"}}}},
		{"no secret", []KeySpec{{Name: "a", Scopes: []string{"inference"}}}},
		{"secret and sha256", []KeySpec{{Name: "a", Secret: secret, SHA256: sha(secret), Scopes: []string{"inference"}}}},
		{"sha256 not hex", []KeySpec{{Name: "a", SHA256: strings.Repeat("z", 64), Scopes: []string{"inference"}}}},
		{"sha256 too short", []KeySpec{{Name: "a", SHA256: sha(secret)[:62], Scopes: []string{"inference"}}}},
		{"no scopes", []KeySpec{{Name: "a", Secret: secret}}},
		{"unknown scope", []KeySpec{{Name: "a", Secret: secret, Scopes: []string{"root"}}}},
		{"duplicate name", []KeySpec{
			{Name: "a", Secret: secret, Scopes: []string{"inference"}},
			{Name: "a", Secret: secret + "2", Scopes: []string{"inference"}}}},
		{"same secret twice", []KeySpec{
			{Name: "a", Secret: secret, Scopes: []string{"inference"}},
			{Name: "b", SHA256: sha(secret), Scopes: []string{"admin"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.specs)
			if !errors.Is(err, ErrBadSpec) {
				t.Fatalf("New error = %v, want ErrBadSpec", err)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), sha(secret)) {
				t.Fatalf("error %q shows the secret", err)
			}
		})
	}
}

func TestContext(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if _, ok := FromContext(r.Context()); ok {
		t.Fatal("key in a bare context")
	}
	k := Key{Name: "x", Scopes: []Scope{ScopeDebug}}
	got, ok := FromContext(NewContext(r.Context(), k))
	if !ok || got.Name != "x" || !got.Has(ScopeDebug) || got.Has(ScopeAdmin) {
		t.Fatalf("FromContext = %+v, %v", got, ok)
	}
}

func BenchmarkAuthenticate(b *testing.B) {
	specs := make([]KeySpec, 16)
	for i := range specs {
		specs[i] = KeySpec{Name: "k" + string(rune('a'+i)), Secret: "sk-" + string(rune('a'+i)) + "-secret", Scopes: []string{"inference"}}
	}
	kr, err := New(specs)
	if err != nil {
		b.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer sk-p-secret")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := kr.Authenticate(r); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRequireRefusalsAreReported: every refusal (400 for two Authorization
// headers, which would otherwise let the first one win, 401, 403) reaches
// the OnReject observer with its status and code, and next never runs.
func TestRequireRefusalsAreReported(t *testing.T) {
	type seen struct {
		status int
		code   string
	}
	tests := []struct {
		name    string
		headers []string
		scope   Scope
		want    seen
	}{
		{"two headers, both valid", []string{"Bearer " + userSecret, "Bearer " + opsSecret}, ScopeInference, seen{400, "invalid_request"}},
		{"two headers, first valid", []string{"Bearer " + opsSecret, "Bearer sk-nope"}, ScopeAdmin, seen{400, "invalid_request"}},
		{"missing", nil, ScopeInference, seen{401, "invalid_api_key"}},
		{"wrong key", []string{"Bearer sk-nope"}, ScopeInference, seen{401, "invalid_api_key"}},
		{"wrong scope", []string{"Bearer " + userSecret}, ScopeAdmin, seen{403, "insufficient_scope"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []seen
			kr := testRing(t).WithOnReject(func(_ *http.Request, status int, code string) { got = append(got, seen{status, code}) })
			r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
			for _, h := range tt.headers {
				r.Header.Add("Authorization", h)
			}
			called := false
			rec := httptest.NewRecorder()
			kr.Require(tt.scope, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true })).ServeHTTP(rec, r)
			if called || rec.Code != tt.want.status {
				t.Fatalf("status %d (next called %v), want %d: %s", rec.Code, called, tt.want.status, rec.Body)
			}
			if len(got) != 1 || got[0] != tt.want {
				t.Fatalf("OnReject saw %v, want [%v]", got, tt.want)
			}
			var body struct{ Error struct{ Code string } }
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Code != tt.want.code {
				t.Fatalf("body %s (%v), want code %s", rec.Body, err, tt.want.code)
			}
		})
	}
}

// TestReplace: replacing the keys takes effect for every copy of the
// keyring (WithOnReject's included) at the next request; a bad set of
// specs, or none while keys are configured, changes nothing.
func TestReplace(t *testing.T) {
	kr := testRing(t)
	withHook := kr.WithOnReject(func(*http.Request, int, string) {})
	req := func(secret string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
		r.Header.Set("Authorization", "Bearer "+secret)
		return r
	}
	const rotated = "sk-rotated-user-secret"
	if err := kr.Replace([]KeySpec{{Name: "user", Secret: rotated, Scopes: []string{"inference"}}}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []*Keyring{kr, withHook} {
		if _, err := k.Authenticate(req(userSecret)); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("the old secret after the rotation: %v, want ErrInvalidKey", err)
		}
		if key, err := k.Authenticate(req(rotated)); err != nil || key.Name != "user" {
			t.Errorf("the new secret: %+v %v", key, err)
		}
		if _, err := k.Authenticate(req(opsSecret)); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("a removed key: %v, want ErrInvalidKey", err)
		}
	}
	// Refused: a bad spec, and no keys at all; Check says so first.
	if err := kr.Check([]KeySpec{{Name: "x", Secret: "s"}}); !errors.Is(err, ErrBadSpec) {
		t.Errorf("Check of a key without scopes: %v, want ErrBadSpec", err)
	}
	if err := kr.Check(nil); !errors.Is(err, ErrAuthOff) {
		t.Errorf("Check of no keys: %v, want ErrAuthOff", err)
	}
	if err := kr.Check([]KeySpec{{Name: "other", Secret: "sk-other", Scopes: []string{"inference"}}}); err != nil {
		t.Errorf("Check of a good key: %v", err)
	}
	if key, err := kr.Authenticate(req(rotated)); err != nil || key.Name != "user" {
		t.Errorf("Check changed the keys: %+v %v", key, err)
	}
	if err := kr.Replace([]KeySpec{{Name: "x", Secret: "s"}}); !errors.Is(err, ErrBadSpec) {
		t.Errorf("a key without scopes: %v, want ErrBadSpec", err)
	}
	if err := kr.Replace(nil); !errors.Is(err, ErrAuthOff) {
		t.Errorf("no keys: %v, want ErrAuthOff", err)
	}
	if key, err := withHook.Authenticate(req(rotated)); err != nil || key.Name != "user" || !kr.Enabled() {
		t.Errorf("after the refused replacements: %+v %v (enabled %v)", key, err, kr.Enabled())
	}
	// A keyring without keys may get some (authentication turned on).
	open, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := open.Replace([]KeySpec{{Name: "user", Secret: rotated, Scopes: []string{"inference"}}}); err != nil || !open.Enabled() {
		t.Fatalf("turning authentication on: %v", err)
	}
}

// TestReplaceWhileAuthenticating: Replace and Authenticate may run at once
// (under -race); every answer is one of the two sets of keys.
func TestReplaceWhileAuthenticating(t *testing.T) {
	kr := testRing(t)
	a := []KeySpec{{Name: "user", Secret: userSecret, Scopes: []string{"inference"}}}
	b := []KeySpec{{Name: "user2", Secret: userSecret, Scopes: []string{"inference"}}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			specs := a
			if i%2 == 1 {
				specs = b
			}
			if err := kr.Replace(specs); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
	r.Header.Set("Authorization", "Bearer "+userSecret)
	for range 200 {
		key, err := kr.Authenticate(r)
		if err != nil || key.Name != "user" && key.Name != "user2" {
			t.Fatalf("during replacements: %+v %v", key, err)
		}
	}
	<-done
}
