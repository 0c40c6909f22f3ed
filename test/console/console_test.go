// Package console tests the web console in a real browser: headless
// Chromium (Debian's chromium package) driven by chromedp, against a
// running gateway with reference engines on loopback (internal/runtime/stage).
//
// Without a Chromium binary the tests skip, unless the CI environment
// variable is set: then they fail, so CI cannot pass without a browser.
package console

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/stage"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/tool/browser"
)

func TestMain(m *testing.M) {
	leakcheck.VerifyTestMain(m)
}

// Bounds: the whole of one test, and one step of it.
const (
	testBudget = 90 * time.Second
	stepBudget = 20 * time.Second
)

// ui is one test's gateway, engines and browser tab.
type ui struct {
	t  *testing.T
	st *stage.Stage
	b  *browser.Browser
}

// chromium returns the browser to use, skipping the test when there is
// none outside CI and failing it inside.
func chromium(t *testing.T) string {
	t.Helper()
	path, err := browser.Find()
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("%v (CI is unset, so this is a skip; in CI it fails)", err)
		}
		t.Fatalf("CI is set and %v", err)
	}
	return path
}

func setup(t *testing.T) *ui {
	t.Helper()
	return setupWith(t, stage.Options{}, 1280)
}

// setupWith is setup with stage options o (its StateDir is the test's)
// and a window width wide pixels wide.
func setupWith(t *testing.T, o stage.Options, wide int) *ui {
	t.Helper()
	path := chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), testBudget)
	t.Cleanup(cancel)
	o.StateDir = t.TempDir()
	st, err := stage.Start(ctx, o)
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
	b, err := browser.Start(ctx, path, wide, 900)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return &ui{t: t, st: st, b: b}
}

// do runs actions in the tab within stepBudget.
func (u *ui) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	u.t.Helper()
	ctx, cancel := context.WithTimeout(u.b.Ctx, stepBudget)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		u.t.Fatalf("%s: %v\npage text:\n%s", what, err, u.pageText())
	}
}

// waitJS waits until the expression is truthy.
func (u *ui) waitJS(what, expr string) {
	u.t.Helper()
	u.do(what, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(stepBudget-time.Second)))
}

func eval[T any](u *ui, expr string) T {
	u.t.Helper()
	ctx, cancel := context.WithTimeout(u.b.Ctx, stepBudget)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		u.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

func (u *ui) pageText() string {
	ctx, cancel := context.WithTimeout(u.b.Ctx, 2*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return s
}

// enterKey opens the console and enters key in its prompt.
func (u *ui) enterKey(key string) {
	u.t.Helper()
	u.do("open the console",
		chromedp.Navigate(u.st.URL+"/ui/"),
		chromedp.WaitVisible(chromedp.ID("key")),
		chromedp.SendKeys(chromedp.ID("key"), key),
		chromedp.Click(chromedp.CSS(`#login-form button`)))
}

// login enters key and waits for the console to open.
func (u *ui) login(key string) {
	u.t.Helper()
	u.enterKey(key)
	u.do("console open", chromedp.WaitVisible(chromedp.ID("nav")))
}

func (u *ui) open(page string) {
	u.t.Helper()
	u.do("open "+page, chromedp.Evaluate[chromedp.Void](`location.hash = "#`+page+`"`, chromedp.EvalIgnoreExceptions),
		chromedp.WaitVisible(chromedp.ID("page-"+page)))
}

// TestKeyAskedOnceAndKept: the console asks for the key; a wrong key and a
// key without the admin scope are refused with a message; the right one
// opens the fleet page and stays in sessionStorage, so a reload asks
// nothing; "Forget key" asks again.
func TestKeyAskedOnceAndKept(t *testing.T) {
	u := setup(t)
	u.enterKey("wrong")
	u.waitJS("wrong key refused", `document.getElementById("login-error").textContent.includes("not accepted")`)
	u.do("clear", chromedp.Evaluate[chromedp.Void](`document.getElementById("key").value = ""`))
	u.do("app key", chromedp.SendKeys(chromedp.ID("key"), stage.AppKey), chromedp.Click(chromedp.CSS(`#login-form button`)))
	u.waitJS("app key refused", `document.getElementById("login-error").textContent.includes("admin scope")`)
	u.do("clear", chromedp.Evaluate[chromedp.Void](`document.getElementById("key").value = ""`))
	u.do("admin key", chromedp.SendKeys(chromedp.ID("key"), stage.AdminKey), chromedp.Click(chromedp.CSS(`#login-form button`)),
		chromedp.WaitVisible(chromedp.ID("page-fleet")))
	if got := eval[string](u, `sessionStorage.getItem("tlgate.adminKey")`); got != stage.AdminKey {
		t.Fatalf("sessionStorage key %q", got)
	}
	u.do("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("page-fleet")))
	if eval[bool](u, `!document.getElementById("login").hidden`) {
		t.Fatal("the key prompt is shown again after a reload")
	}
	u.do("forget", chromedp.Click(chromedp.ID("forget")), chromedp.WaitVisible(chromedp.ID("key")))
	if got := eval[*string](u, `sessionStorage.getItem("tlgate.adminKey")`); got != nil {
		t.Fatalf("key still stored after Forget: %q", *got)
	}
}

// TestFleetListsEngines: a row per engine, each routable with its model,
// role, its requests in flight from the other replicas (peer_in_flight)
// and a fresh heartbeat; a card per model; a configured engine that is
// down listed so, with its last error.
func TestFleetListsEngines(t *testing.T) {
	u := setupWith(t, stage.Options{Probed: []config.Engine{{ID: "vllm-down", HTTPAddress: "127.0.0.1:1", Model: "llama",
		Kind: config.KindVLLM, ProbeInterval: config.D(100 * time.Millisecond)}}}, 1280)
	u.login(stage.AdminKey)
	want := len(u.st.Engines)
	u.waitJS("every engine listed", fmt.Sprintf(`document.querySelectorAll('tr[data-worker][data-state="routable"]').length === %d`, want))
	u.waitJS("the down engine listed", `document.querySelector('.card[data-model="llama"] tr[data-worker="vllm-down"][data-state="down"]') !== null &&
		(document.querySelector('.card[data-model="llama"] tr[data-error-of="vllm-down"] [data-last-error]') || {textContent: ""}).textContent.includes("refused")`)
	if peers := eval[[]string](u, `[...document.querySelectorAll("tr[data-worker] td[data-peer-in-flight]")].map(td => td.textContent)`); len(peers) != want+1 {
		t.Errorf("peer in-flight cells %q, want one per row", peers)
	} else {
		for _, p := range peers {
			if p != "0" { // one replica: no peer
				t.Errorf("peer in-flight cells %q, want 0s", peers)
			}
		}
	}
	type row struct{ ID, Model, Role, Heartbeat string }
	rows := eval[[]row](u, `[...document.querySelectorAll("tr[data-worker]")].map(tr => ({
		ID: tr.dataset.worker,
		Model: tr.closest(".card").dataset.model,
		Role: tr.children[1].textContent,
		Heartbeat: tr.lastElementChild.textContent }))`)
	got := map[string]row{}
	for _, r := range rows {
		if r.ID != "vllm-down" {
			got[r.ID] = r
		}
	}
	for id, e := range u.st.Engines {
		r, ok := got[id]
		switch {
		case !ok:
			t.Errorf("engine %s not listed; rows %+v", id, rows)
		case r.Model != e.Model() || r.Role != e.Role():
			t.Errorf("%s: model %q role %q, want %q %q", id, r.Model, r.Role, e.Model(), e.Role())
		case !strings.HasSuffix(r.Heartbeat, " s"):
			t.Errorf("%s: heartbeat age %q, want seconds", id, r.Heartbeat)
		}
	}
	if n := eval[int](u, `document.querySelectorAll(".card.model").length`); n != 4 {
		t.Errorf("%d model cards, want 4 (big, llama, smol-v3, smol-v4)", n)
	}
}

// TestHeadersFitAt1400: at 1,400 pixels no header of the Fleet or Traffic
// page's tables runs out of its column or over its neighbour.
func TestHeadersFitAt1400(t *testing.T) {
	u := setupWith(t, stage.Options{}, 1400)
	u.login(stage.AdminKey)
	u.waitJS("fleet shown", `document.querySelectorAll('tr[data-worker][data-state="routable"]').length > 0`)
	u.st.Complete(context.Background(), "smol", 1) // a row on the traffic page
	check := func(page string) {
		t.Helper()
		bad := eval[[]string](u, `(() => {
			const out = [];
			for (const tr of document.querySelectorAll(".page:not([hidden]) table thead tr")) {
				let prev = null;
				for (const th of tr.children) {
					const r = th.getBoundingClientRect();
					if (th.scrollWidth > th.clientWidth) out.push(th.textContent + " overflows its column");
					if (prev && r.left < prev.right - 0.5) out.push(th.textContent + " overlaps its left neighbour");
					prev = r;
				}
			}
			return out;
		})()`)
		if len(bad) > 0 {
			t.Errorf("%s page at 1400 px: %v", page, bad)
		}
	}
	check("fleet")
	u.open("traffic")
	u.waitJS("traffic table", `document.querySelector('#traffic-models tr[data-model]') !== null`)
	check("traffic")
}

// TestDrainClickStopsRouting: clicking Drain on a model's card marks its
// workers drained, and the gateway stops sending that model requests
// (503, and its engines see none); Resume brings it back.
func TestDrainClickStopsRouting(t *testing.T) {
	u := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), stepBudget)
	defer cancel()
	if status, err := u.st.Complete(ctx, "smol-v3", 1); err != nil || status != 200 {
		t.Fatalf("before the drain: %d %v", status, err)
	}
	u.login(stage.AdminKey)
	u.waitJS("fleet shown", `document.querySelectorAll('tr[data-worker^="smol-v3"][data-state="routable"]').length === 2`)
	u.do("click Drain", chromedp.Click(chromedp.CSS(`button[data-action="drain"][data-model="smol-v3"]`)))
	u.waitJS("rows drained", `document.querySelectorAll('tr[data-worker^="smol-v3"][data-state="drained"]').length === 2`)
	u.waitJS("buttons flipped", `document.querySelector('button[data-action="drain"][data-model="smol-v3"]').disabled &&
		!document.querySelector('button[data-action="resume"][data-model="smol-v3"]').disabled`)
	if n := eval[int](u, `document.querySelectorAll('tr[data-worker^="big"][data-state="routable"]').length`); n != 4 {
		t.Errorf("%d big workers routable after draining smol-v3, want 4", n)
	}

	before := u.requestsOn("smol-v3")
	for i := 0; i < 10; i++ {
		status, err := u.st.Complete(ctx, "smol-v3", i)
		if err != nil || status != 503 {
			t.Fatalf("request %d after the drain: %d %v, want 503", i, status, err)
		}
	}
	if after := u.requestsOn("smol-v3"); after != before {
		t.Fatalf("smol-v3 engines got %d requests after the drain", after-before)
	}

	u.do("click Resume", chromedp.Click(chromedp.CSS(`button[data-action="resume"][data-model="smol-v3"]`)))
	u.waitJS("rows routable", `document.querySelectorAll('tr[data-worker^="smol-v3"][data-state="routable"]').length === 2`)
	// The engines stop draining at their next heartbeat's answer: until
	// then the gateway may fail over between them and answer 503.
	deadline := time.Now().Add(10 * time.Second)
	for {
		status, err := u.st.Complete(ctx, "smol-v3", 99)
		if err == nil && status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after resume: %d %v", status, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (u *ui) requestsOn(model string) uint64 {
	var n uint64
	for _, e := range u.st.Engines {
		if e.Model() == model {
			n += e.Stats().Requests
		}
	}
	return n
}

// TestRouteEditStaleETagShows412Conflict: the table changes behind the
// editor's back; saving the stale edit shows "changed since you loaded
// it" with both versions side by side and saves nothing; loading the
// current version edits it at its new ETag.
func TestRouteEditStaleETagShows412Conflict(t *testing.T) {
	u := setup(t)
	u.login(stage.AdminKey)
	u.open("routes")
	u.waitJS("routes listed", `document.querySelectorAll(".card.route").length === 3`)
	if got := eval[string](u, `document.getElementById("routes-etag").textContent`); !strings.Contains(got, `If-Match: "1"`) {
		t.Fatalf("editor says %q, want it editing ETag \"1\"", got)
	}

	// Someone else moves the canary to 50/50.
	ctx, cancel := context.WithTimeout(context.Background(), stepBudget)
	defer cancel()
	rs := stage.Routes()
	rs[0].Backends[0].Weight, rs[0].Backends[1].Weight = 0.5, 0.5
	body, _ := json.Marshal(map[string]any{"routes": rs})
	if status, b, _, err := u.st.Do(ctx, "PUT", "/admin/v1/routes", stage.AdminKey, string(body), "If-Match", `"1"`); err != nil || status != 200 {
		t.Fatalf("PUT behind the editor's back: %d %s %v", status, b, err)
	}

	// The editor, still at ETag "1", adds an alias and saves.
	u.do("edit", chromedp.Evaluate[chromedp.Void](`(() => {
		const ta = document.getElementById("routes-json");
		ta.value = ta.value.replace('"smol-latest"', '"smol-latest", "smol-stable"');
		ta.dispatchEvent(new Event("input"));
	})()`), chromedp.Click(chromedp.ID("routes-save")))
	u.waitJS("conflict shown", `!document.getElementById("conflict").hidden`)
	if got := eval[string](u, `document.querySelector("#conflict h3").textContent`); got != "Changed since you loaded it" {
		t.Errorf("conflict heading %q", got)
	}
	sides := eval[[]string](u, `[...document.querySelectorAll("#conflict .side pre")].map(p => p.textContent)`)
	if len(sides) != 2 || !strings.Contains(sides[0], "smol-stable") || strings.Contains(sides[1], "smol-stable") ||
		!strings.Contains(sides[1], `"weight": 0.5`) || strings.Contains(sides[0], `"weight": 0.5`) {
		t.Fatalf("side by side: want mine (with smol-stable, 0.9) and the current (0.5, no smol-stable); got %q", sides)
	}
	if got := eval[string](u, `document.querySelector("#conflict .sides").dataset.epoch`); got != "2" {
		t.Errorf("conflict shows epoch %s, want 2", got)
	}
	// Nothing was saved.
	if status, b, h, _ := u.st.Do(ctx, "GET", "/admin/v1/routes", stage.AdminKey, ""); status != 200 || h.Get("ETag") != `"2"` || strings.Contains(string(b), "smol-stable") {
		t.Fatalf("after the conflict the gateway has %d %s %s", status, h.Get("ETag"), b)
	}

	u.do("take theirs", chromedp.Click(chromedp.CSS(`#conflict button[data-action="take-theirs"]`)))
	u.waitJS("current loaded", `document.getElementById("conflict").hidden && document.getElementById("routes-etag").textContent.includes('If-Match: "2"')`)
	if got := eval[string](u, `document.getElementById("routes-json").value`); !strings.Contains(got, `"weight": 0.5`) {
		t.Fatalf("editor after loading the current version:\n%s", got)
	}
	if got := eval[string](u, `document.querySelector('.card.route[data-route="0"] .weight .num').textContent`); got != "50%" {
		t.Errorf("the list shows the canary's first backend at %q, want 50%%", got)
	}
}

// TestInvalidRouteErrorNextToField: a 400 invalid_routes is shown on the
// editor line of the field its message names, whether the gateway names
// it in param (a rule) or only in the message (the JSON's shape).
func TestInvalidRouteErrorNextToField(t *testing.T) {
	u := setup(t)
	u.login(stage.AdminKey)
	tests := []struct {
		name, old, new string
		path           string // the note's field
		lineHas        string // the editor line it must sit on
		says           string
	}{
		{"accept_if rule", "mean_logprob > -1.2", "mean_logprob >> -1.2", "routes[1].cascade[0].accept_if", `"accept_if"`, `unknown operator ">>"`},
		{"weight type", `"weight": 0.1`, `"weight": "x"`, "routes[0].backends[1].weight", `"weight": "x"`, "number"},
		{"unknown field", `"model": "big-pd",`, `"model": "big-pd", "colour": 1,`, "routes[2].colour", `"colour"`, "unknown field"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u.t = t
			u.do("fresh editor", chromedp.Navigate(u.st.URL+"/ui/#routes"), chromedp.Reload())
			u.waitJS("routes listed", `document.querySelectorAll(".card.route").length === 3`)
			u.do("edit and save", chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => {
				const ta = document.getElementById("routes-json");
				ta.value = ta.value.replace(%q, %q);
				ta.dispatchEvent(new Event("input"));
			})()`, tc.old, tc.new)), chromedp.Click(chromedp.ID("routes-save")))
			u.waitJS("note shown", `document.querySelector('#notes .note') !== null`)
			if got := eval[[]string](u, `[...document.querySelectorAll("#notes .note")].map(n => n.dataset.path)`); len(got) != 1 || got[0] != tc.path {
				t.Fatalf("notes on %q, want one on %s", got, tc.path)
			}
			want := eval[int](u, fmt.Sprintf(`document.getElementById("routes-json").value.split("\n").findIndex(l => l.includes(%q)) + 1`, tc.lineHas))
			if got := eval[string](u, `document.querySelector('#notes .note').dataset.line`); got != fmt.Sprint(want) {
				t.Errorf("note on line %s, want line %d (the line with %s)", got, want, tc.lineHas)
			}
			// The note sits just below that line, inside the visible editor.
			type box struct{ NoteTop, LineTop, EditorTop, EditorBottom float64 }
			b := eval[box](u, `(() => {
				const n = document.querySelector("#notes .note").getBoundingClientRect();
				const l = document.querySelector("#hl .hline").getBoundingClientRect();
				const e = document.getElementById("editor").getBoundingClientRect();
				return {NoteTop: n.top, LineTop: l.top, EditorTop: e.top, EditorBottom: e.bottom};
			})()`)
			if d := b.NoteTop - b.LineTop; d < 15 || d > 25 || b.LineTop < b.EditorTop || b.NoteTop > b.EditorBottom {
				t.Errorf("note at y=%v, its line at y=%v, editor %v..%v: want the note right under the line, in view", b.NoteTop, b.LineTop, b.EditorTop, b.EditorBottom)
			}
			if got := eval[string](u, `document.querySelector("#notes .note").textContent`); !strings.Contains(got, tc.says) {
				t.Errorf("note %q, want it to say %q", got, tc.says)
			}
		})
	}
}

// TestTrafficChartsMoveUnderLoad: with no traffic the page says so; under
// load the model appears and its request and latency charts fill and keep
// moving.
func TestTrafficChartsMoveUnderLoad(t *testing.T) {
	u := setup(t)
	u.login(stage.AdminKey)
	u.open("traffic")
	u.waitJS("empty page", `document.getElementById("traffic-charts").textContent.includes("No requests")`)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); u.st.Load(ctx, "smol", 25) }()
	defer func() { cancel(); wg.Wait() }()

	const sum = `Number((document.querySelector('svg[data-chart="requests"]') || {dataset: {sum: 0}}).dataset.sum)`
	u.waitJS("requests chart filled", sum+` > 0 && document.querySelector('#traffic-models tr[data-model="smol"]') !== null`)
	first := eval[float64](u, sum)
	u.waitJS("requests chart moves", fmt.Sprintf(`%s > %v`, sum, first))
	u.waitJS("latency chart filled", `Number(document.querySelector('svg[data-chart="latency"]').dataset.points) > 0`)
	if n := eval[int](u, `document.querySelectorAll('svg[data-chart="requests"] path.line').length`); n != 1 {
		t.Errorf("requests chart has %d lines, want 1", n)
	}
	if got := eval[string](u, `document.getElementById("traffic-title").textContent`); got != "smol" {
		t.Errorf("charts shown for %q, want smol", got)
	}
}
