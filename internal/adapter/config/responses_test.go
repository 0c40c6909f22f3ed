package config

import (
	"strings"
	"testing"
	"time"
)

func TestResponsesValidation(t *testing.T) {
	ok, err := Parse([]byte("[gateway.responses]\nstore_ttl = \"168h\"\nstore_max_entries = 10000000\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := ok.Gateway.Responses; r.StoreTTL.Duration != 168*time.Hour || r.StoreMaxEntries != 10_000_000 {
		t.Errorf("parsed %+v", r)
	}
	cases := []struct{ toml, want string }{
		{"store_ttl = \"0s\"", "gateway.responses.store_ttl: must be from 1s to 168h0m0s, got 0s"},
		{"store_ttl = \"500ms\"", "gateway.responses.store_ttl: must be from 1s"},
		{"store_ttl = \"-1h\"", "gateway.responses.store_ttl: must be from 1s"},
		{"store_ttl = \"169h\"", "gateway.responses.store_ttl: must be from 1s to 168h0m0s, got 169h0m0s"},
		{"store_max_entries = 0", "gateway.responses.store_max_entries: must be from 1 to 10000000, got 0"},
		{"store_max_entries = -5", "gateway.responses.store_max_entries: must be from 1 to 10000000"},
		{"store_max_entries = 10000001", "gateway.responses.store_max_entries: must be from 1 to 10000000, got 10000001"},
		{"store_entries = 3", "unknown key gateway.responses.store_entries"},
	}
	for _, tc := range cases {
		_, err := Parse([]byte("[gateway.responses]\n" + tc.toml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.toml, err, tc.want)
		}
	}
}
