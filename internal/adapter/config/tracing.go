package config

import (
	"fmt"
	"net/url"
	"strings"
)

// tracing checks the [gateway.tracing] table; with no endpoint only the
// keys' forms are checked (tracing is off).
func (v *checker) tracing(t Tracing) {
	switch t.Protocol {
	case TracingGRPC, TracingHTTP:
	default:
		v.add("gateway.tracing.protocol", "must be %q or %q, got %q", TracingGRPC, TracingHTTP, t.Protocol)
	}
	if !(t.SampleRatio >= 0 && t.SampleRatio <= 1) {
		v.add("gateway.tracing.sample_ratio", "must be within [0, 1], got %v", t.SampleRatio)
	}
	if t.Endpoint != "" {
		if u, err := url.Parse(t.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			v.add("gateway.tracing.endpoint", "must be an http:// or https:// URL with a host (e.g. http://127.0.0.1:4317), got %q", t.Endpoint)
		}
		if strings.TrimSpace(t.ServiceName) == "" {
			v.add("gateway.tracing.service_name", "required when tracing is on")
		}
	}
	if t.HeadersEnv != "" {
		if _, err := envValue(t.HeadersEnv); err != nil {
			v.add("gateway.tracing.headers_env", "%s", err)
		}
	}
}

// Headers returns the raw header list named by headers_env (read
// now), or "" when it is not set. Parsing is the tracing package's.
func (t Tracing) Headers() (string, error) {
	if t.HeadersEnv == "" {
		return "", nil
	}
	v, err := envValue(t.HeadersEnv)
	if err != nil {
		return "", fmt.Errorf("config: tracing.headers_env: %w", err)
	}
	return v, nil
}
