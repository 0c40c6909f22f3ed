package adminhttp_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tlgate/tlgate/internal/adapter/traffic"
	"github.com/tlgate/tlgate/internal/edge/adminhttp"
	"github.com/tlgate/tlgate/internal/guard/auth"
)

// TestAdminTraffic: GET /admin/v1/traffic answers the recorder's snapshot
// to the admin scope only; other methods are 405; without a recorder the
// path is unknown.
func TestAdminTraffic(t *testing.T) {
	kr, err := auth.New([]auth.KeySpec{
		{Name: "ops", Secret: opsKey, Scopes: []string{"admin"}},
		{Name: "app", Secret: "app-secret", Scopes: []string{"inference"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	tr := traffic.New(traffic.Config{})
	tr.Request("smol", "", 3*time.Millisecond, time.Millisecond)
	tr.Request("smol", "no_capacity", time.Millisecond, 0)
	h := adminhttp.New(adminhttp.Deps{Keyring: kr, Traffic: tr})
	do := func(h http.Handler, method, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, "/admin/v1/traffic", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, c := range []struct {
		method, key string
		status      int
	}{
		{"GET", "", 401}, {"GET", "app-secret", 403}, {"POST", opsKey, 405}, {"GET", opsKey, 200},
	} {
		if rec := do(h, c.method, c.key); rec.Code != c.status {
			t.Errorf("%s with key %q: %d %s, want %d", c.method, c.key, rec.Code, rec.Body, c.status)
		}
	}
	rec := do(h, "GET", opsKey)
	var snap traffic.Snapshot
	if err := json.Unmarshal(rec.Body.Bytes(), &snap); err != nil {
		t.Fatalf("body: %v: %s", err, rec.Body)
	}
	if len(snap.Models) != 1 || snap.Models[0].Model != "smol" || snap.Models[0].Totals.Requests != 2 || snap.Models[0].Totals.ErrorsByCode["no_capacity"] != 1 {
		t.Fatalf("snapshot %+v", snap.Models)
	}
	if got := rec.Header().Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control %q", got)
	}
	if rec := do(adminhttp.New(adminhttp.Deps{Keyring: kr}), "GET", opsKey); rec.Code != 404 {
		t.Errorf("without a recorder: %d, want 404", rec.Code)
	}
}
