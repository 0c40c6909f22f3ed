package config

import (
	"strings"
	"testing"
)

func TestTracingValidation(t *testing.T) {
	t.Setenv("TLGATE_TEST_OTLP_HEADERS", "x-api-key=abc")
	cases := []struct {
		name, toml, want string // want: "" valid, else a substring of the error
	}{
		{"off by default", ``, ""},
		{"grpc on", `endpoint = "http://127.0.0.1:4317"`, ""},
		{"http on with tls", `endpoint = "https://otel.example:4318"` + "\nprotocol = \"http\"", ""},
		{"headers from env", `endpoint = "http://127.0.0.1:4317"` + "\nheaders_env = \"TLGATE_TEST_OTLP_HEADERS\"", ""},
		{"unknown protocol", `protocol = "thrift"`, `gateway.tracing.protocol: must be "grpc" or "http", got "thrift"`},
		{"ratio above one", `sample_ratio = 1.5`, "gateway.tracing.sample_ratio: must be within [0, 1], got 1.5"},
		{"ratio negative", `sample_ratio = -0.1`, "gateway.tracing.sample_ratio"},
		{"ratio nan", `sample_ratio = nan`, "gateway.tracing.sample_ratio"},
		{"endpoint without scheme", `endpoint = "127.0.0.1:4317"`, "gateway.tracing.endpoint: must be an http:// or https:// URL"},
		{"endpoint without host", `endpoint = "http://"`, "gateway.tracing.endpoint"},
		{"service name empty", `endpoint = "http://127.0.0.1:4317"` + "\nservice_name = \" \"", "gateway.tracing.service_name: required"},
		{"headers env unset", `headers_env = "TLGATE_TEST_OTLP_UNSET"`, "gateway.tracing.headers_env: environment variable TLGATE_TEST_OTLP_UNSET is not set"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte("[gateway.tracing]\n" + tc.toml + "\n"))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if err == nil && tc.name == "headers from env" {
				h, err := c.Gateway.Tracing.Headers()
				if err != nil || h != "x-api-key=abc" {
					t.Fatalf("Headers() = %q, %v", h, err)
				}
			}
		})
	}
}
