package pprofhttp_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/tlgate/tlgate/internal/edge/pprofhttp"
	"github.com/tlgate/tlgate/internal/guard/auth"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func keyring(t *testing.T) *auth.Keyring {
	t.Helper()
	kr, err := auth.New([]auth.KeySpec{
		{Name: "ops", Secret: "ops-secret", Scopes: []string{"admin"}},
		{Name: "app", Secret: "app-secret", Scopes: []string{"inference", "debug"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func serve(h http.Handler, method, path, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	if key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestPprofNeedsTheAdminScope(t *testing.T) {
	h := pprofhttp.New(keyring(t))
	cases := []struct {
		name, method, path, key string
		want                    int
		code, allow, body       string
	}{
		{name: "no key", method: "GET", path: "/debug/pprof/heap", want: 401, code: "invalid_api_key"},
		{name: "wrong key", method: "GET", path: "/debug/pprof/heap", key: "nope", want: 401, code: "invalid_api_key"},
		{name: "inference key", method: "GET", path: "/debug/pprof/heap", key: "app-secret", want: 403, code: "insufficient_scope"},
		{name: "index", method: "GET", path: "/debug/pprof/", key: "ops-secret", want: 200, body: "goroutine"},
		{name: "heap, text", method: "GET", path: "/debug/pprof/heap?debug=1", key: "ops-secret", want: 200, body: "heap profile:"},
		{name: "goroutines, text", method: "GET", path: "/debug/pprof/goroutine?debug=2", key: "ops-secret", want: 200, body: "TestPprofNeedsTheAdminScope"},
		{name: "cmdline", method: "GET", path: "/debug/pprof/cmdline", key: "ops-secret", want: 200, body: ".test"},
		{name: "unknown profile", method: "GET", path: "/debug/pprof/nope", key: "ops-secret", want: 404, body: "Unknown profile"},
		{name: "POST a profile", method: "POST", path: "/debug/pprof/profile", key: "ops-secret", want: 405, code: "method_not_allowed", allow: "GET, HEAD"},
		{name: "DELETE symbols", method: "DELETE", path: "/debug/pprof/symbol", key: "ops-secret", want: 405, code: "method_not_allowed", allow: "GET, HEAD, POST"},
		{name: "refused before the method", method: "POST", path: "/debug/pprof/profile", want: 401, code: "invalid_api_key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := serve(h, tc.method, tc.path, tc.key)
			if w.Code != tc.want {
				t.Fatalf("%s %s: status %d, want %d: %s", tc.method, tc.path, w.Code, tc.want, w.Body)
			}
			if tc.code != "" {
				var e struct {
					Error struct{ Code, Message string }
				}
				if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Code != tc.code {
					t.Fatalf("body %q: want error code %q (%v)", w.Body, tc.code, err)
				}
				if e.Error.Message == "" {
					t.Fatal("an error without a message")
				}
			}
			if got := w.Header().Get("Allow"); got != tc.allow {
				t.Fatalf("Allow %q, want %q", got, tc.allow)
			}
			if !strings.Contains(w.Body.String(), tc.body) {
				t.Fatalf("body does not hold %q:\n%.500s", tc.body, w.Body)
			}
		})
	}
}

// TestPprofCPUProfile takes a real CPU profile over a live listener, the
// way `go tool pprof` does, and parses it.
func TestPprofCPUProfile(t *testing.T) {
	srv := httptest.NewServer(pprofhttp.New(keyring(t)))
	defer srv.Close()
	req, err := http.NewRequest("GET", srv.URL+"/debug/pprof/profile?seconds=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer ops-secret")
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	p, err := profile.Parse(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("not a profile: %v", err)
	}
	if len(p.SampleType) == 0 || p.SampleType[len(p.SampleType)-1].Type != "cpu" {
		t.Fatalf("sample types %v, want cpu last", p.SampleType)
	}
}

func TestPprofNilKeyringPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	pprofhttp.New(nil)
}

func TestPprofAuthOff(t *testing.T) {
	kr, err := auth.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if w := serve(pprofhttp.New(kr), "GET", "/debug/pprof/heap?debug=1", ""); w.Code != 200 {
		t.Fatalf("auth off: status %d: %s", w.Code, w.Body)
	}
}
