package deploy

import (
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync"
)

// TestNATSPerReplicaConfig: nats/per-replica.conf loads in nats-server,
// and gives each replica's user exactly the subjects fleet sync needs of
// it (fleetsync.Permissions): publishing on its own, subscribing to the
// fleet's.
func TestNATSPerReplicaConfig(t *testing.T) {
	opts, err := server.ProcessConfigFile("nats/per-replica.conf")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range opts.Users {
		names = append(names, u.Username)
		if !strings.HasPrefix(u.Password, "$2a$") {
			t.Errorf("user %s: its password is not a bcrypt hash", u.Username)
		}
		if u.Permissions == nil || u.Permissions.Publish == nil || u.Permissions.Subscribe == nil {
			t.Fatalf("user %s has no publish and subscribe permissions", u.Username)
		}
		pub, sub := fleetsync.Permissions(config.DefaultSyncSubjectPrefix, u.Username)
		if !slices.Equal(u.Permissions.Publish.Allow, pub) || !slices.Equal(u.Permissions.Subscribe.Allow, sub) {
			t.Errorf("user %s: publish %v subscribe %v, want %v and %v", u.Username, u.Permissions.Publish.Allow, u.Permissions.Subscribe.Allow, pub, sub)
		}
	}
	if !slices.Equal(names, []string{"tlgate-0", "tlgate-1", "tlgate-2"}) {
		t.Fatalf("users %v", names)
	}
	if opts.MaxPayload < config.DefaultSyncMaxMessageBytes {
		t.Fatalf("max_payload %d below the default max_message_bytes %d", opts.MaxPayload, config.DefaultSyncMaxMessageBytes)
	}
}
