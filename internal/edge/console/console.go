// Package console is the operator's web console, served at /ui/: plain
// HTML, CSS and JavaScript embedded in the binary (no CDN, no build step).
//
// The pages themselves are public and carry no secrets: a browser cannot
// send an Authorization header on navigation, so /ui/ asks for the admin
// key once, keeps it in sessionStorage (gone when the tab closes) and sends
// it as "Authorization: Bearer" on every admin API call it makes. All data
// and every action go through /admin/v1/, which needs the admin scope; a
// gateway without keys (loopback only) needs no key here either.
//
// The pages are sent with a Content-Security-Policy that allows only this
// origin's scripts, styles and API (no inline script, no framing), so a
// route name or a worker id cannot run script in the console.
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed assets
var assets embed.FS

// Prefix is where the console is mounted.
const Prefix = "/ui/"

// csp allows this origin only; SVG charts are built with DOM calls.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console's files under Prefix.
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic("console: embedded assets: " + err.Error()) // the embed pattern guarantees the folder
	}
	files := http.StripPrefix(Prefix, http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}

// Register mounts the console on mux: GET /ui/ and its files, and /ui
// redirected there.
func Register(mux *http.ServeMux) {
	mux.Handle("GET "+Prefix, Handler())
	mux.Handle("GET /ui", http.RedirectHandler(Prefix, http.StatusMovedPermanently))
}
