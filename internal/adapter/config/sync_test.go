package config

import (
	"slices"
	"strings"
	"testing"
)

func TestSyncValidation(t *testing.T) {
	t.Setenv("TLGATE_TEST_NATS_TOKEN", "tok")
	t.Setenv("TLGATE_TEST_NATS_PW", "pw")
	nats := "kind = \"nats\"\nurl = \"nats://127.0.0.1:4222\"\n"
	cases := []struct {
		name, toml, wantKey string
	}{
		{"none by default", ``, ""},
		{"token from the environment", nats + `token_env = "TLGATE_TEST_NATS_TOKEN"`, ""},
		{"several servers", "kind = \"nats\"\nurl = [\"nats://a:4222\", \"tls://b:4222\"]\ntoken = \"x\"", ""},
		{"user and password", nats + "user = \"u\"\npassword_env = \"TLGATE_TEST_NATS_PW\"", ""},
		{"creds file", nats + `creds_file = "sync_test.go"`, ""},
		{"unknown kind", `kind = "redis"`, "gateway.sync.kind"},
		{"nats without url", "kind = \"nats\"\ntoken = \"x\"", "gateway.sync.url"},
		{"bad url", "kind = \"nats\"\nurl = \"http://a:1\"\ntoken = \"x\"", "gateway.sync.url[0]"},
		{"credentials in the url", "kind = \"nats\"\nurl = \"nats://u:p@a:1\"\ntoken = \"x\"", "gateway.sync.url[0]"},
		{"no credentials", nats, "gateway.sync.token_env"},
		{"two credentials", nats + "token = \"x\"\ncreds_file = \"sync_test.go\"", "gateway.sync.token_env"},
		{"token env unset", nats + `token_env = "TLGATE_TEST_NATS_UNSET"`, "gateway.sync.token_env"},
		{"user without password", nats + `user = "u"`, "gateway.sync.password_env"},
		{"password without user", nats + `password = "p"`, "gateway.sync.user"},
		{"cert without key", nats + "token = \"x\"\ncert_file = \"sync_test.go\"", "gateway.sync.key_file"},
		{"missing ca", nats + "token = \"x\"\nca_file = \"/nonexistent/ca.pem\"", "gateway.sync.ca_file"},
		{"subject prefix", `subject_prefix = "tlgate.>"`, "gateway.sync.subject_prefix"},
		{"empty subject token", `subject_prefix = "a..b"`, "gateway.sync.subject_prefix"},
		{"replica id with spaces", `replica_id = "a b"`, "gateway.sync.replica_id"},
		{"replica id with a dot", `replica_id = "gw.0"`, "gateway.sync.replica_id"},
		{"replica id with a wildcard", `replica_id = "gw-*"`, "gateway.sync.replica_id"},
		{"peers listed", `peers = ["gw-0:8080", "gw-1:8080"]`, ""},
		{"a peer that is no replica id", `peers = ["gw-0", "a.b"]`, "gateway.sync.peers[1]"},
		{"a peer listed twice", `peers = ["gw-0", "gw-0"]`, "gateway.sync.peers[1]"},
		{"batch interval", `batch_interval = "0s"`, "gateway.sync.batch_interval"},
		{"batch interval too long", `batch_interval = "2s"`, "gateway.sync.batch_interval"},
		{"releases go like picks", `release_hold = "0s"`, ""},
		{"negative release hold", `release_hold = "-1ms"`, "gateway.sync.release_hold"},
		{"release hold too long", `release_hold = "2s"`, "gateway.sync.release_hold"},
		{"peer timeout within load interval", "load_interval = \"2s\"\npeer_timeout = \"1s\"", "gateway.sync.peer_timeout"},
		{"max queue", `max_queue = 0`, "gateway.sync.max_queue"},
		{"max message bytes", `max_message_bytes = 10`, "gateway.sync.max_message_bytes"},
		{"batch above message", "max_batch_bytes = 4096\nmax_message_bytes = 2048", "gateway.sync.max_batch_bytes"},
		{"peer rate", `peer_rate = 0`, "gateway.sync.peer_rate"},
		{"max peers", `max_peers = 0`, "gateway.sync.max_peers"},
		{"max peer in flight", `max_peer_in_flight = -1`, "gateway.sync.max_peer_in_flight"},
		{"snapshot chunks", `snapshot_chunks = -1`, "gateway.sync.snapshot_chunks"},
		{"url as a number", `url = 3`, "gateway.sync"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte("[gateway.sync]\n" + c.toml + "\n"))
			switch {
			case c.wantKey == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case c.wantKey != "" && (err == nil || !strings.Contains(err.Error(), c.wantKey)):
				t.Fatalf("error %v, want one naming %s", err, c.wantKey)
			}
			if err != nil {
				return
			}
			s := cfg.Gateway.Sync
			switch c.name {
			case "token from the environment":
				if tok, err := s.SyncToken(); tok != "tok" || err != nil {
					t.Fatalf("SyncToken() = %q, %v", tok, err)
				}
			case "user and password":
				if pw, err := s.SyncPassword(); pw != "pw" || err != nil {
					t.Fatalf("SyncPassword() = %q, %v", pw, err)
				}
			case "several servers":
				if !slices.Equal(s.URL, []string{"nats://a:4222", "tls://b:4222"}) {
					t.Fatalf("url = %q", s.URL)
				}
			case "none by default":
				if s.Kind != SyncNone || s.SubjectPrefix != DefaultSyncSubjectPrefix {
					t.Fatalf("defaults %+v", s)
				}
			}
		})
	}
}
