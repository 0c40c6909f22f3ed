package console

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestServesAssets(t *testing.T) {
	mux := http.NewServeMux()
	Register(mux)
	tests := []struct {
		path     string
		status   int
		ctype    string
		contains string
	}{
		{"/ui/", 200, "text/html", `<script src="app.js"`},
		{"/ui/app.js", 200, "javascript", "sessionStorage"},
		{"/ui/app.css", 200, "text/css", "body"},
		{"/ui", 301, "", ""},
		{"/ui/nope.js", 404, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest("GET", tc.path, nil))
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d", rec.Code, tc.status)
			}
			if tc.status == 301 {
				if loc := rec.Header().Get("Location"); loc != Prefix {
					t.Fatalf("Location %q", loc)
				}
				return
			}
			if got := rec.Header().Get("Content-Security-Policy"); !strings.Contains(got, "script-src 'self'") || !strings.Contains(got, "frame-ancestors 'none'") {
				t.Errorf("CSP %q", got)
			}
			if rec.Code != 200 {
				return
			}
			if got := rec.Header().Get("Content-Type"); !strings.Contains(got, tc.ctype) {
				t.Errorf("Content-Type %q, want %s", got, tc.ctype)
			}
			body, _ := io.ReadAll(rec.Body)
			if !strings.Contains(string(body), tc.contains) {
				t.Errorf("body lacks %q", tc.contains)
			}
		})
	}
}

// TestNoRemoteAssets: nothing is loaded from another origin, no inline
// script or handler, and no markup built from strings (the CSP would block
// the first two anyway).
func TestNoRemoteAssets(t *testing.T) {
	for _, name := range []string{"assets/index.html", "assets/app.js", "assets/app.css"} {
		b, err := assets.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(b), "http://www.w3.org/2000/svg", "")
		for _, bad := range []string{"http://", "https://", "<script>", "onclick=", "innerHTML", "eval("} {
			if strings.Contains(s, bad) {
				t.Errorf("%s contains %q", name, bad)
			}
		}
	}
}
