package gateway

import (
	"context"
	"fmt"

	"github.com/tlgate/tlgate/internal/config"
	"github.com/tlgate/tlgate/internal/tracing"
)

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
		return nil, fmt.Errorf("tracing.headers_env: %w", err)
	}
	p, err := tracing.New(context.Background(), tracing.Config{
		Endpoint: c.Endpoint, Protocol: c.Protocol, SampleRatio: c.SampleRatio,
		ServiceName: c.ServiceName, Headers: headers,
	})
	if err != nil {
		return nil, err
	}
	g.stops = append(g.stops, p.Shutdown)
	return p, nil
}
