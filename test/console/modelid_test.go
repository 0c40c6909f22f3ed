package console

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/routing/routes"
	"github.com/tlgate/tlgate/internal/runtime/stage"
	"github.com/tlgate/tlgate/internal/tool/browser"
)

// TestConsoleEncodesModelIDs: clicking Drain on the card of a model whose
// id has a "/" posts the id as one path segment, "/" sent as %2F, and
// drains that model alone, not a model named by its last segment.
func TestConsoleEncodesModelIDs(t *testing.T) {
	path := chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), testBudget)
	t.Cleanup(cancel)
	st, err := stage.Start(ctx, stage.Options{StateDir: t.TempDir(), Routes: []routes.Route{}, Engines: []enginesim.Config{
		{ID: "team-m1", Model: "team/m1", Role: enginesim.RoleUnified},
		{ID: "m1-a", Model: "m1", Role: enginesim.RoleUnified},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		if err := st.Close(cctx); err != nil {
			t.Errorf("stage close: %v", err)
		}
	})
	b, err := browser.Start(ctx, path, 1280, 900)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	u := &ui{t: t, st: st, b: b}
	u.login(stage.AdminKey)
	u.waitJS("fleet shown", `document.querySelectorAll('tr[data-worker][data-state="routable"]').length === 2`)
	// Record the paths the console fetches.
	u.do("watch fetch", chromedp.Evaluate[chromedp.Void](`(() => {
		window.tlPosts = [];
		const f = window.fetch;
		window.fetch = (p, o) => { if (o && o.method === "POST") window.tlPosts.push(String(p)); return f(p, o); };
	})()`))
	u.do("click Drain", chromedp.Click(chromedp.CSS(`button[data-action="drain"][data-model="team/m1"]`)))
	u.waitJS("team/m1 drained", `document.querySelector('tr[data-worker="team-m1"]').dataset.state === "drained"`)
	if got := eval[[]string](u, `window.tlPosts`); len(got) != 1 || got[0] != "/admin/v1/models/team%2Fm1:drain" {
		t.Fatalf("the console posted %q, want [/admin/v1/models/team%%2Fm1:drain]", got)
	}
	if s := eval[string](u, `document.querySelector('tr[data-worker="m1-a"]').dataset.state`); s != "routable" {
		t.Fatalf("m1 is %s after draining team/m1, want routable", s)
	}
	sctx, scancel := context.WithTimeout(context.Background(), stepBudget)
	defer scancel()
	status, body, _, err := u.st.Do(sctx, "GET", "/admin/v1/workers", stage.AdminKey, "")
	if err != nil || status != 200 {
		t.Fatalf("GET workers: %d %v", status, err)
	}
	var ws struct {
		Workers []struct {
			ID      string `json:"id"`
			Drained bool   `json:"drained"`
		} `json:"workers"`
	}
	if err := json.Unmarshal(body, &ws); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws.Workers {
		if w.Drained != (w.ID == "team-m1") {
			t.Errorf("worker %s drained %v after draining team/m1", w.ID, w.Drained)
		}
	}
}
