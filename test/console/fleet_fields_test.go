package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tlgate/tlgate/internal/edge/console"
	"github.com/tlgate/tlgate/internal/tool/browser"
)

// TestFleetRendersEjectionAndPrefixIndex: fields the workers' JSON may
// carry beyond today's (an outlier ejection with its deadline and reason,
// a prefix-index size, LoRA adapters, the admission queue's priority
// bands) are rendered when present, against a fake admin
// API without keys (so the console asks for none).
func TestFleetRendersEjectionAndPrefixIndex(t *testing.T) {
	path := chromium(t)
	until := time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano)
	beat := time.Now().UTC().Format(time.RFC3339Nano)
	mux := http.NewServeMux()
	console.Register(mux)
	mux.HandleFunc("GET /admin/v1/workers", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			http.Error(w, "no key expected", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"epoch":3,"queued":{"m":4},"queued_bands":{"m":[{"priority":10,"key":"chat","waiting":1},{"priority":-1,"key":"batch","waiting":2},{"priority":-1,"key":"etl","waiting":1}]},"workers":[
			{"id":"w-ok","model":"m","role":"unified","source":"heartbeat","routable":true,"kv_total_blocks":100,"kv_free_blocks":25,"last_heartbeat":%[1]q,"prefix_index_blocks":1234,"adapters":["chat-lora","sql-lora"]},
			{"id":"w-out","model":"m","role":"unified","source":"probe","kind":"vllm","routable":false,"ejected_until":%[2]q,"ejection_reason":"5 consecutive failures","last_heartbeat":%[1]q,"prefix_index_blocks":7},
			{"id":"w-past","model":"m","role":"unified","source":"heartbeat","routable":true,"ejected_until":"2000-01-01T00:00:00Z","last_heartbeat":%[1]q},
			{"id":"w-sus","model":"m","role":"unified","source":"heartbeat","routable":true,"consecutive_failures":2,"last_heartbeat":%[1]q}
		]}`, beat, until)
	})
	u := openFake(t, path, mux)
	u.waitJS("rows", `document.querySelectorAll("tr[data-worker]").length === 4`)
	type row struct{ State, Chip, Title, Source, KV string }
	rows := eval[map[string]row](u, `Object.fromEntries([...document.querySelectorAll("tr[data-worker]")].map(tr => [tr.dataset.worker, {
		State: tr.dataset.state,
		Chip: tr.querySelector(".chip").textContent,
		Title: tr.querySelector(".chip").title,
		Source: tr.children[2].textContent,
		KV: tr.querySelector(".kv .num").textContent }]))`)
	if r := rows["w-out"]; r.State != "ejected" || !strings.HasPrefix(r.Chip, "ejected · ") || r.Title != "5 consecutive failures" || r.Source != "probe (vllm)" {
		t.Errorf("ejected worker rendered %+v", r)
	}
	if r := rows["w-past"]; r.State != "routable" {
		t.Errorf("an ejection in the past still shows: %+v", r)
	}
	if r := rows["w-sus"]; r.State != "suspect" || r.Chip != "suspect" || r.Title != "2 failed attempts in a row; one request at a time until it answers" {
		t.Errorf("suspect worker rendered %+v", r)
	}
	if r := rows["w-ok"]; r.State != "routable" || r.KV != "75%" {
		t.Errorf("routable worker rendered %+v", r)
	}
	heads := eval[[]string](u, `[...document.querySelectorAll(".card.model thead th")].map(th => th.textContent)`)
	if !slices.Contains(heads, "Index blocks") {
		t.Errorf("no prefix index column: %q", heads)
	}
	cells := eval[[]string](u, `[...document.querySelectorAll("tr[data-worker]")].map(tr => tr.children[10].textContent)`)
	if strings.Join(cells, ",") != "1.2k,7,–,–" {
		t.Errorf("prefix index cells %q, want 1.2k, 7 and – (absent) twice", cells)
	}
	if got := eval[string](u, `document.querySelector('.card.model[data-model="m"] .cardhead .muted').textContent`); got != "3 of 4 routable · 4 waiting · LoRA adapters: chat-lora, sql-lora" {
		t.Errorf("model card says %q, want 3 of 4 routable, 4 waiting for admission and the adapters", got)
	}
	if got := eval[string](u, `[...document.querySelectorAll('.card.model[data-model="m"] .bands .chip')].map(c => c.textContent).join(" | ")`); got != "10: 1 (chat 1) | -1 (sheddable): 3 (batch 2, etl 1)" {
		t.Errorf("priority bands rendered %q", got)
	}
	if got := eval[string](u, `document.querySelector('tr[data-worker="w-ok"] .adapters').textContent`); got != "LoRA: chat-lora, sql-lora" {
		t.Errorf("w-ok's adapters rendered %q", got)
	}
	if got := eval[string](u, `document.getElementById("live").textContent`); !strings.Contains(got, "no keys") {
		t.Errorf("status %q, want it to say no keys are configured", got)
	}
}

// TestFleetShowsCacheView: each worker's cache view (exact from its KV
// events, with the blocks held per tier; stale; approximate) is shown.
func TestFleetShowsCacheView(t *testing.T) {
	path := chromium(t)
	beat := time.Now().UTC().Format(time.RFC3339Nano)
	mux := http.NewServeMux()
	console.Register(mux)
	mux.HandleFunc("GET /admin/v1/workers", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"epoch":1,"workers":[
			{"id":"w-exact","model":"m","role":"unified","source":"heartbeat","routable":true,"last_heartbeat":%[1]q,"cache_view":"exact","kv_blocks":{"gpu":1200,"cpu":40},"kv_events":"tcp://10.0.0.1:5557"},
			{"id":"w-stale","model":"m","role":"unified","source":"heartbeat","routable":true,"last_heartbeat":%[1]q,"cache_view":"stale","kv_blocks":{},"kv_events":"tcp://10.0.0.2:5557"},
			{"id":"w-approx","model":"m","role":"unified","source":"probe","kind":"vllm","routable":true,"last_heartbeat":%[1]q,"cache_view":"approximate"}
		]}`, beat)
	})
	u := openFake(t, path, mux)
	u.waitJS("rows", `document.querySelectorAll("tr[data-worker]").length === 3`)
	type cell struct{ View, Text, Title string }
	got := eval[map[string]cell](u, `Object.fromEntries([...document.querySelectorAll("tr[data-worker]")].map(tr => {
		const c = tr.querySelector("[data-cache-view]");
		return [tr.dataset.worker, {View: c.dataset.cacheView, Text: c.textContent, Title: c.title}]; }))`)
	if c := got["w-exact"]; c.View != "exact" || c.Title != "from its KV events: 40 cpu, 1.2k gpu held" {
		t.Errorf("exact worker: %+v", c)
	}
	if c := got["w-stale"]; c.View != "stale" || !strings.Contains(c.Title, "prefix index until they flow again") {
		t.Errorf("stale worker: %+v", c)
	}
	if c := got["w-approx"]; c.View != "approximate" || c.Title != "no KV events: the prefix index" {
		t.Errorf("approximate worker: %+v", c)
	}
	heads := eval[[]string](u, `[...document.querySelectorAll(".card.model thead th")].map(th => th.textContent)`)
	if !slices.Contains(heads, "Cache view") {
		t.Errorf("no cache view column: %q", heads)
	}
}

// TestFleetAgesOnTheGatewaysClock: heartbeat ages are measured on the
// gateway's clock (its Date header) when the browser's is far off.
func TestFleetAgesOnTheGatewaysClock(t *testing.T) {
	path := chromium(t)
	skew := time.Hour
	mux := http.NewServeMux()
	console.Register(mux)
	mux.HandleFunc("GET /admin/v1/workers", func(w http.ResponseWriter, r *http.Request) {
		gwNow := time.Now().Add(skew)
		w.Header().Set("Date", gwNow.UTC().Format(http.TimeFormat))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"epoch":1,"workers":[{"id":"w","model":"m","role":"unified","source":"heartbeat","routable":true,"last_heartbeat":%q}]}`,
			gwNow.Add(-5*time.Second).UTC().Format(time.RFC3339Nano))
	})
	u := openFake(t, path, mux)
	u.waitJS("row", `document.querySelector('tr[data-worker="w"]') !== null`)
	// The Date header has whole seconds: 5 s, give or take one.
	age := eval[float64](u, `parseFloat(document.querySelector('tr[data-worker="w"]').lastElementChild.textContent)`)
	if age < 3.9 || age > 6.1 {
		t.Fatalf("heartbeat age %v s, want about 5 s on the gateway's clock", age)
	}
}

// openFake serves mux (the console and a fake admin API) on loopback and
// opens the console in a fresh browser on it.
func openFake(t *testing.T, path string, mux *http.ServeMux) *ui {
	t.Helper()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), testBudget)
	t.Cleanup(cancel)
	b, err := browser.Start(ctx, path, 1280, 900)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	u := &ui{t: t, b: b}
	u.do("open", chromedp.Navigate(srv.URL+"/ui/"))
	return u
}
