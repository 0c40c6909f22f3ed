package config

import (
	"strings"
	"testing"
)

func TestStoreValidation(t *testing.T) {
	t.Setenv("TLGATE_TEST_ETCD_PW", "secret")
	cases := []struct {
		name, toml, wantKey string
	}{
		{"file default", ``, ""},
		{"etcd", `kind = "etcd"
endpoints = ["http://127.0.0.1:2379", "etcd-1:2379", "https://etcd-2.example:2379"]`, ""},
		{"unknown kind", `kind = "redis"`, "gateway.store.kind"},
		{"etcd without endpoints", `kind = "etcd"`, "gateway.store.endpoints"},
		{"bad endpoint", `kind = "etcd"
endpoints = ["ftp://x:1"]`, "gateway.store.endpoints[0]"},
		{"endpoint without port", `kind = "etcd"
endpoints = ["etcd-0"]`, "gateway.store.endpoints[0]"},
		{"prefix", `kind = "etcd"
endpoints = ["e:1"]
prefix = "tlgate"`, "gateway.store.prefix"},
		{"dial_timeout", `kind = "etcd"
endpoints = ["e:1"]
dial_timeout = "0s"`, "gateway.store.dial_timeout"},
		{"username without password", `kind = "etcd"
endpoints = ["e:1"]
username = "u"`, "gateway.store.password_env"},
		{"password unset", `kind = "etcd"
endpoints = ["e:1"]
username = "u"
password_env = "TLGATE_TEST_ETCD_PW_UNSET"`, "gateway.store.password_env"},
		{"user and password", `kind = "etcd"
endpoints = ["e:1"]
username = "u"
password_env = "TLGATE_TEST_ETCD_PW"`, ""},
		{"cert without key", `kind = "etcd"
endpoints = ["e:1"]
cert_file = "store_test.go"`, "gateway.store.key_file"},
		{"missing ca", `kind = "etcd"
endpoints = ["e:1"]
ca_file = "/nonexistent/ca.pem"`, "gateway.store.ca_file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte("[gateway.store]\n" + c.toml + "\n"))
			switch {
			case c.wantKey == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case c.wantKey != "" && (err == nil || !strings.Contains(err.Error(), c.wantKey+":")):
				t.Fatalf("error %v, want one naming %s", err, c.wantKey)
			case c.wantKey == "" && c.name == "user and password":
				if pw, err := cfg.Gateway.Store.Password(); pw != "secret" || err != nil {
					t.Fatalf("Password() = %q, %v", pw, err)
				}
			}
		})
	}
}
