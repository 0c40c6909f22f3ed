package tlbench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// tlbench runs itself as the bare Go reverse proxy of the overhead
// comparison when roleEnv says so: the floor of what a Go HTTP proxy costs
// on this machine, as a process of its own like the gateway and nginx.
const (
	roleEnv     = "TLBENCH_ROLE"
	roleGoProxy = "goproxy"
	listenEnv   = "TLBENCH_LISTEN"
	upstreamEnv = "TLBENCH_UPSTREAM"
)

// RunRole runs the role roleEnv names, if any, and reports whether it did.
// The overhead experiment starts the running executable again as its Go
// reverse proxy, so a binary that calls Run calls RunRole first thing in
// main (a test binary in TestMain) and exits when it ran.
func RunRole() (bool, error) {
	switch os.Getenv(roleEnv) {
	case "":
		return false, nil
	case roleGoProxy:
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return true, serveGoProxy(ctx, os.Getenv(listenEnv), os.Getenv(upstreamEnv))
	default:
		return true, fmt.Errorf("%s=%q: unknown role", roleEnv, os.Getenv(roleEnv))
	}
}

// serveGoProxy serves net/http/httputil.ReverseProxy on listen in front of
// upstream until ctx ends: upstream keep-alive, every write flushed (SSE
// passes event by event), nothing else.
func serveGoProxy(ctx context.Context, listen, upstream string) error {
	u, err := url.Parse(upstream)
	if err != nil || u.Host == "" {
		return fmt.Errorf("goproxy: upstream %q: want http://host:port", upstream)
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(u) },
		FlushInterval: -1,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: 4096,
			IdleConnTimeout:     2 * time.Minute,
		},
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("goproxy: %w", err)
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("goproxy: %w", err)
	}
	return nil
}
