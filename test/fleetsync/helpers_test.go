package fleetsync

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync/embednats"
	"github.com/tlgate/tlgate/internal/testkit/cluster"
)

// opsKey has every scope: the tests read X-TL-Route (debug).
const opsKey = "fleetsync-ops-key"

// model is the engines' served model, named directly by the requests.
const model = "smol-v3"

// baseConfig is every replica's configuration but the policy and sync.
const baseConfig = `
[gateway]
listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "200ms"
heartbeat_miss_limit = 25
first_byte_timeout = "5s"
idle_timeout = "5s"

[[gateway.api_keys]]
name = "ops"
key = "` + opsKey + `"
scopes = ["inference", "debug", "admin"]
`

// fleet is an embedded NATS, the replicas syncing through it and the
// engines heartbeating to every replica.
type fleet struct {
	*cluster.Fleet
	nats   *embednats.Server
	policy string
	// tweak, when set, changes every replica's configuration last.
	tweak func(*config.Gateway)
	// users: the NATS server has a user per replica (cluster.StartNATSUsers):
	// replica i is gw-<i> and logs in as its own user. named: replica i is
	// gw-<i>, with the shared token.
	users, named bool
}

// newFleet starts n replicas under policy syncing through ns (nil: sync
// off), then engines (ids) heartbeating to them and to extra registry
// addresses, and waits until every replica routes to every engine.
func newFleet(t testing.TB, ns *embednats.Server, policy string, n int, engines []enginesim.Config, extraRegistries ...string) *fleet {
	t.Helper()
	return newTweakedFleet(t, ns, policy, n, engines, nil, extraRegistries...)
}

// newTweakedFleet is newFleet with tweak applied to every replica's
// configuration.
func newTweakedFleet(t testing.TB, ns *embednats.Server, policy string, n int, engines []enginesim.Config, tweak func(*config.Gateway), extraRegistries ...string) *fleet {
	t.Helper()
	f := &fleet{Fleet: cluster.New(t, opsKey), nats: ns, policy: policy, tweak: tweak}
	for range n {
		f.startReplica(nil)
	}
	f.StartEngines(engines, extraRegistries...)
	return f
}

// replicaID is the id of replica i of a fleet whose NATS has users.
func replicaID(i int) string { return fmt.Sprintf("gw-%d", i) }

// newUsersFleet is newTweakedFleet on a NATS with one user per replica
// (and per intruder: users that may publish as those replica ids only),
// every replica logging in as its own.
func newUsersFleet(t testing.TB, policy string, n int, engines []enginesim.Config, tweak func(*config.Gateway), extraRegistries []string, intruders ...string) *fleet {
	t.Helper()
	ids := append([]string(nil), intruders...)
	for i := range n + 2 { // two more, for replicas started later
		ids = append(ids, replicaID(i))
	}
	f := &fleet{Fleet: cluster.New(t, opsKey), nats: cluster.StartNATSUsers(t, config.DefaultSyncSubjectPrefix, ids...), policy: policy, tweak: tweak, users: true}
	for range n {
		f.startReplica(nil)
	}
	f.StartEngines(engines, extraRegistries...)
	return f
}

// engineConfigs are n reference engines of model, with decodePerToken.
func engineConfigs(n int, decodePerToken time.Duration) []enginesim.Config {
	out := make([]enginesim.Config, n)
	for i := range out {
		out[i] = enginesim.Config{ID: fmt.Sprintf("w%d", i), Model: model, Role: enginesim.RoleUnified, DecodePerToken: decodePerToken}
	}
	return out
}

// startReplica starts one replica with its registry on a port the test
// holds (on one the OS picks when registry is nil).
func (f *fleet) startReplica(registry *cluster.Port) *cluster.Replica {
	f.T.Helper()
	cfg, err := config.Parse([]byte(baseConfig))
	if err != nil {
		f.T.Fatal(err)
	}
	g := &cfg.Gateway
	g.RoutePolicy = f.policy
	if f.nats != nil {
		g.Sync.Kind = config.SyncNATS
		g.Sync.URL = config.StringList{f.nats.URL()}
		if f.users {
			g.Sync.ReplicaID = replicaID(len(f.Replicas))
			g.Sync.User, g.Sync.Password = g.Sync.ReplicaID, cluster.NATSPassword(g.Sync.ReplicaID)
		} else {
			g.Sync.Token = f.nats.Token()
			if f.named {
				g.Sync.ReplicaID = replicaID(len(f.Replicas))
			}
		}
		g.Sync.ReconnectWait = config.D(100 * time.Millisecond)
		g.Sync.ConnectTimeout = config.D(time.Second)
		g.Sync.LoadInterval = config.D(200 * time.Millisecond)
		g.Sync.PeerTimeout = config.D(2 * time.Second)
	}
	if f.tweak != nil {
		f.tweak(g)
	}
	if err := cfg.Validate(); err != nil {
		f.T.Fatal(err)
	}
	return f.StartReplicaOn(cfg, registry)
}

// complete sends a completion of prompt with maxTokens to replica i.
func (f *fleet) complete(ctx context.Context, i int, prompt string, maxTokens int) cluster.Reply {
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d}`, model, prompt, maxTokens)
	return f.Do(ctx, "POST", f.Replicas[i].URL+"/v1/completions", body)
}

// load runs clients concurrent clients sending short completions to the
// replicas in turn until stop is called; stop returns the answers that
// were not 200.
func (f *fleet) load(clients int, prompt func(n int) string) (stop func() []string) {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures []string
	)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				i := (c + n) % len(f.Replicas)
				rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
				r := f.complete(rctx, i, prompt(c*1_000_000+n), 4)
				rcancel()
				if ctx.Err() != nil {
					return
				}
				if r.Err != nil || r.Status != 200 {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("replica %d: %d %v %s", i, r.Status, r.Err, r.Body))
					mu.Unlock()
				}
			}
		}()
	}
	return func() []string {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return failures
	}
}
