package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/tracing"
)

// flushTimeout bounds the flush of the spans not yet exported at Close.
const flushTimeout = 2 * time.Second

// startTracing returns the provider given in Options, or the one the
// [gateway.tracing] table configures (off without an endpoint); a provider
// built here is shut down (its spans flushed) last at Close.
func (g *Gateway) startTracing(c config.Tracing, given *tracing.Provider) (*tracing.Provider, error) {
	if given != nil {
		return given, nil
	}
	if c.Endpoint == "" {
		return tracing.Off(), nil
	}
	raw, err := c.Headers()
	if err != nil {
		return nil, err
	}
	headers, err := tracing.ParseHeaders(raw)
	if err != nil {
		return nil, fmt.Errorf("gateway.tracing.headers_env: %w", err)
	}
	p, err := tracing.New(context.Background(), tracing.Config{
		Endpoint: c.Endpoint, Protocol: c.Protocol, SampleRatio: c.SampleRatio,
		ServiceName: c.ServiceName, Headers: headers,
	})
	if err != nil {
		return nil, fmt.Errorf("gateway.tracing: %w", err)
	}
	g.stops = append(g.stops, func(ctx context.Context) error {
		// Flushing to a receiver that is down would retry until ctx ends;
		// losing the last spans is no reason to fail the shutdown.
		ctx, cancel := context.WithTimeout(ctx, flushTimeout)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			g.log.Warn().Err(err).Msg("spans not flushed")
		}
		return nil
	})
	return p, nil
}
