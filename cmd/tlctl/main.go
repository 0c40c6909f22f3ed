// Command tlctl is tlgate's admin command line: workers, routes get/put
// with the ETag, drain and resume. See package internal/tool/tlctl.
package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/tlgate/tlgate/internal/tool/tlctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := tlctl.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
