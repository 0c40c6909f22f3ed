// Command consoleshots writes a screenshot of each page of the web console
// into a folder: it starts a gateway with reference engines on loopback,
// drives traffic through it (a canary, a cascade, a disaggregated route, a
// short engine outage that causes failovers, and a few requests for an
// unknown model), with one configured engine down, then photographs the
// pages in headless Chromium.
//
//	go run ./cmd/consoleshots -out docs/console
//
// The traffic rings use 1 s buckets here (not the gateway's 5 s) so a
// minute of load fills the charts.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/traffic"
	"github.com/tlgate/tlgate/internal/runtime/stage"
	"github.com/tlgate/tlgate/internal/tool/browser"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "consoleshots:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("consoleshots", flag.ContinueOnError)
	out := fs.String("out", "docs/console", "folder for the PNG files")
	load := fs.Duration("load", 100*time.Second, "how long to drive traffic before the traffic screenshot")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("out: %w", err)
	}
	path, err := browser.Find()
	if err != nil {
		return err
	}
	stateDir, err := os.MkdirTemp("", "consoleshots-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stateDir)
	// One configured engine nothing answers at: the Fleet page lists it
	// down, with its last error.
	down := config.Engine{ID: "vllm-down", HTTPAddress: "127.0.0.1:1", Model: "llama", Kind: config.KindVLLM, ProbeInterval: config.D(time.Second)}
	st, err := stage.Start(ctx, stage.Options{StateDir: stateDir, Traffic: traffic.Config{Width: time.Second, Buckets: 120}, Probed: []config.Engine{down}})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = st.Close(cctx)
	}()

	b, err := browser.Start(ctx, path, 1360, 900)
	if err != nil {
		return err
	}
	defer b.Close()

	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopLoad(); wg.Wait() }()
	drive := func(model string, rps float64) {
		wg.Add(1)
		go func() { defer wg.Done(); st.Load(loadCtx, model, rps) }()
	}
	drive("smol", 24)
	drive("auto", 8)
	drive("big-pd", 3)
	wg.Add(1)
	go func() { defer wg.Done(); outage(loadCtx, st, *load) }()

	shoot := func(name, hash string, ready chromedp.Action[chromedp.Void]) error {
		sctx, cancel := context.WithTimeout(b.Ctx, 30*time.Second)
		defer cancel()
		png, err := screenshot(sctx,
			chromedp.Navigate(st.URL+"/ui/#"+hash),
			ready,
			chromedp.Sleep(300*time.Millisecond)) // the last poll's paint
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return write(*out, name, png)
	}

	// Log in once; the key stays in the tab's sessionStorage.
	lctx, cancel := context.WithTimeout(b.Ctx, 20*time.Second)
	err = chromedp.Do(lctx,
		chromedp.Navigate(st.URL+"/ui/"),
		chromedp.WaitVisible(chromedp.ID("key")),
		chromedp.SendKeys(chromedp.ID("key"), stage.AdminKey),
		chromedp.Click(chromedp.CSS(`#login-form button`)),
		chromedp.WaitVisible(chromedp.ID("nav")))
	cancel()
	if err != nil {
		return fmt.Errorf("login: %w", err)
	}

	// Let some traffic flow, drain the canary's new version, then look.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(*load / 2):
	}
	if status, body, _, err := st.Do(ctx, "POST", "/admin/v1/models/smol-v4:drain", stage.AdminKey, ""); err != nil || status != 202 {
		return fmt.Errorf("drain smol-v4: %d %s %v", status, body, err)
	}
	if err := shoot("fleet", "fleet", chromedp.WaitVisible(chromedp.CSS(`tr[data-worker="big-decode-b"]`))); err != nil {
		return err
	}
	if err := shoot("routes", "routes", chromedp.WaitVisible(chromedp.CSS(`.card.route`))); err != nil {
		return err
	}
	if err := routesErrorShot(b, st, *out); err != nil {
		return err
	}
	if err := conflictShot(ctx, b, st, *out); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(*load / 2):
	}
	err = shoot("traffic", "traffic", chromedp.Poll[chromedp.Void](`document.querySelectorAll('svg.chart[data-points]:not([data-points="0"])').length >= 2`,
		chromedp.WithPollingInterval(100*time.Millisecond)))
	return err
}

// outage makes one worker of the canary's main version answer 503 for a
// while in the middle of the run, so failovers show, and for a few seconds
// every worker behind the canary.
func outage(ctx context.Context, st *stage.Stage, total time.Duration) {
	e := st.Engines["smol-v3-b"]
	wait := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	if !wait(total / 5) {
		return
	}
	// The canary's new version has a single worker: its requests have
	// nowhere to fail over to and are answered no_capacity.
	// For a few seconds in the middle every worker behind "smol" is down:
	// no_capacity errors.
	v4, v3a := st.Engines["smol-v4-a"], st.Engines["smol-v3-a"]
	down := enginesim.Faults{Unavailable: true}
	_ = e.SetFaults(down)
	_ = v4.SetFaults(down)
	ok := wait(total / 15)
	if ok {
		_ = v3a.SetFaults(down)
		ok = wait(total / 25)
		_ = v3a.SetFaults(enginesim.Faults{})
	}
	ok = ok && wait(total/15)
	_ = e.SetFaults(enginesim.Faults{})
	_ = v4.SetFaults(enginesim.Faults{})
	if !ok {
		return
	}
	// A client with a typo: model_not_found, counted under "(no route)".
	for i := 0; i < 20 && wait(300*time.Millisecond); i++ {
		_, _ = st.Complete(ctx, "smoll", i)
	}
}

// edit changes the route editor's text (old to new) and saves.
func edit(old, new string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => {
			const ta = document.getElementById("routes-json");
			ta.value = ta.value.replace(%q, %q);
			ta.dispatchEvent(new Event("input"));
		})()`, old, new)),
		chromedp.Click(chromedp.ID("routes-save")))
}

// conflictShot photographs the 412 view: the table changes behind the
// editor's back, then the editor saves its stale edit.
func conflictShot(ctx context.Context, b *browser.Browser, st *stage.Stage, out string) error {
	bctx, cancel := context.WithTimeout(b.Ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(bctx, chromedp.Navigate(st.URL+"/ui/#routes"), chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`.card.route`))); err != nil {
		return fmt.Errorf("routes-conflict: %w", err)
	}
	status, body, h, err := st.Do(ctx, "GET", "/admin/v1/routes", stage.AdminKey, "")
	if err != nil || status != 200 {
		return fmt.Errorf("routes-conflict: GET: %d %v", status, err)
	}
	theirs := strings.Replace(string(body), `"weight":0.9`, `"weight":0.75`, 1)
	theirs = strings.Replace(theirs, `"weight":0.1`, `"weight":0.25`, 1)
	if status, b, _, err := st.Do(ctx, "PUT", "/admin/v1/routes", stage.AdminKey, theirs, "If-Match", h.Get("ETag")); err != nil || status != 200 {
		return fmt.Errorf("routes-conflict: PUT: %d %s %v", status, b, err)
	}
	png, err := screenshot(bctx,
		edit(`"smol-latest"`, `"smol-latest",
        "smol-stable"`),
		chromedp.WaitVisible(chromedp.ID("conflict")),
		chromedp.Sleep(200*time.Millisecond))
	if err != nil {
		return fmt.Errorf("routes-conflict: %w", err)
	}
	return write(out, "routes-conflict", png)
}

// screenshot runs steps and then takes a full-page PNG of the tab.
func screenshot(ctx context.Context, steps ...chromedp.Action[chromedp.Void]) ([]byte, error) {
	if err := chromedp.Do(ctx, steps...); err != nil {
		return nil, err
	}
	return chromedp.Run(ctx, chromedp.FullScreenshot(100))
}

func write(out, name string, png []byte) error {
	file := filepath.Join(out, name+".png")
	if err := os.WriteFile(file, png, 0o644); err != nil {
		return err
	}
	fmt.Println("wrote", file)
	return nil
}

// routesErrorShot photographs the editor showing a validation error next
// to its field.
func routesErrorShot(b *browser.Browser, st *stage.Stage, out string) error {
	ctx, cancel := context.WithTimeout(b.Ctx, 30*time.Second)
	defer cancel()
	png, err := screenshot(ctx,
		chromedp.Navigate(st.URL+"/ui/#routes"),
		chromedp.WaitVisible(chromedp.CSS(`.card.route`)),
		edit("mean_logprob > -1.2", "mean_logprob >> -1.2"),
		chromedp.WaitVisible(chromedp.CSS(`#notes .note`)),
		chromedp.Sleep(200*time.Millisecond))
	if err != nil {
		return fmt.Errorf("routes-invalid: %w", err)
	}
	return write(out, "routes-invalid", png)
}
