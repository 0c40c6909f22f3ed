// Package browser finds a Chromium and starts it headless under chromedp,
// with the flags that keep it quiet and self-contained (no network of its
// own, no first-run or sync) and a fresh profile each time.
package browser

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"

	"github.com/chromedp/chromedp"
)

// ErrNotFound is returned by Find when no Chromium binary is found.
var ErrNotFound = errors.New("browser: no chromium binary found (apt-get install chromium, or set CHROMIUM)")

// Candidates are the binaries Find looks for on PATH, in order.
var candidates = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"}

// Find returns the path of a Chromium: $CHROMIUM when set, else the first
// of the usual names on PATH.
func Find() (string, error) {
	if p := os.Getenv("CHROMIUM"); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			return "", fmt.Errorf("browser: CHROMIUM=%s: %w", p, err)
		}
		return p, nil
	}
	for _, c := range candidates {
		if p, err := exec.LookPath(c); err == nil {
			return p, nil
		}
	}
	return "", ErrNotFound
}

// Browser is a running headless Chromium.
type Browser struct {
	// Ctx is a chromedp context on the browser's first tab.
	Ctx     context.Context
	cancel  []context.CancelFunc
	profile string
}

// Start launches the Chromium at path, headless, with a window of width
// × height and a fresh profile directory (removed by Close). ctx bounds
// the browser's whole life.
func Start(ctx context.Context, path string, width, height int) (*Browser, error) {
	profile, err := os.MkdirTemp("", "tlgate-chromium-")
	if err != nil {
		return nil, fmt.Errorf("browser: profile: %w", err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("mute-audio", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(width, height),
	}
	b := &Browser{profile: profile}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	b.cancel = append(b.cancel, cancelAlloc)
	bctx, cancelCtx := chromedp.NewContext(actx)
	b.cancel = append(b.cancel, cancelCtx)
	b.Ctx = bctx
	if err := chromedp.Do(bctx); err != nil { // starts the browser
		b.Close()
		return nil, fmt.Errorf("browser: start %s: %w", path, err)
	}
	return b, nil
}

// Close stops the browser and removes its profile.
func (b *Browser) Close() {
	for i := len(b.cancel) - 1; i >= 0; i-- {
		b.cancel[i]()
	}
	_ = os.RemoveAll(b.profile)
}
