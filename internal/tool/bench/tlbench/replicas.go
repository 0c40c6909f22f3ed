package tlbench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/tool/bench/procs"
)

// replicaSpec is what a replica fleet's gateways run with.
type replicaSpec struct {
	bin       string // the gateway binary
	replicas  int
	policy    string
	heartbeat time.Duration
	// syncURL, when set, turns fleet sync on: every replica connects to
	// this NATS server with syncToken.
	syncURL, syncToken string
	// syncBatch is [gateway.sync] batch_interval (0: the default).
	syncBatch time.Duration
	// syncHold is [gateway.sync] release_hold (nil: the default).
	syncHold *time.Duration
	// pprof serves the replicas' Go profiles (gateway.pprof).
	pprof bool
	// keyLimits is [gateway.sync] key_limits ("": the default).
	keyLimits string
	// extra is TOML appended to every replica's configuration.
	extra string
}

// replicaFleet is N gateway processes (the real gateway binary, each its
// own process as behind a load balancer) and in-process engines that
// heartbeat to every one of them.
type replicaFleet struct {
	dir      string
	gateways []*procs.Proc
	urls     []string // the replicas' base URLs
	engines  []*enginesim.Engine
}

// syncTokenEnv is the environment variable the replicas read the NATS
// token from (secrets stay out of the config file).
const syncTokenEnv = "TLBENCH_SYNC_TOKEN"

// replicaTOML is one replica's configuration file.
func replicaTOML(s replicaSpec, i int, listen, registry, stateDir string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[gateway]\nlisten = %q\nregistry_listen = %q\nheartbeat_interval = %q\nstate_dir = %q\nroute_policy = %q\nlog_format = \"json\"\n",
		listen, registry, s.heartbeat.String(), stateDir, s.policy)
	if s.pprof {
		b.WriteString("pprof = true\n")
	}
	if s.syncURL != "" {
		fmt.Fprintf(&b, "\n[gateway.sync]\nkind = \"nats\"\nurl = %q\nreplica_id = \"replica-%d\"\ntoken_env = %q\n", s.syncURL, i, syncTokenEnv)
		if s.syncBatch > 0 {
			fmt.Fprintf(&b, "batch_interval = %q\n", s.syncBatch.String())
		}
		if s.syncHold != nil {
			fmt.Fprintf(&b, "release_hold = %q\n", s.syncHold.String())
		}
		if s.keyLimits != "" {
			fmt.Fprintf(&b, "key_limits = %q\n", s.keyLimits)
		}
	}
	b.WriteString(s.extra)
	return b.String()
}

// startReplicas starts the gateways, then the engines heartbeating to all
// of them, and waits until every replica routes to every engine.
func startReplicas(ctx context.Context, s replicaSpec, engines []enginesim.Config) (_ *replicaFleet, err error) {
	dir, err := os.MkdirTemp("", "tlbench-replicas-")
	if err != nil {
		return nil, err
	}
	f := &replicaFleet{dir: dir}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	addrs, err := procs.FreeAddrs(2 * s.replicas)
	if err != nil {
		return nil, err
	}
	var registries []string
	for i := range s.replicas {
		listen, registry := addrs[2*i], addrs[2*i+1]
		name := fmt.Sprintf("gateway-%d", i)
		path := filepath.Join(dir, name+".toml")
		if err := os.WriteFile(path, []byte(replicaTOML(s, i, listen, registry, filepath.Join(dir, name+"-state"))), 0o644); err != nil {
			return nil, err
		}
		var env []string
		if s.syncToken != "" {
			env = []string{syncTokenEnv + "=" + s.syncToken}
		}
		p, err := procs.Start(name, dir, s.bin, []string{"-config", path}, env)
		if err != nil {
			return nil, err
		}
		f.gateways = append(f.gateways, p)
		f.urls = append(f.urls, "http://"+listen)
		registries = append(registries, registry)
	}
	for i, p := range f.gateways {
		if err := p.WaitHTTP(ctx, f.urls[i]+"/healthz", http.StatusOK, 30*time.Second); err != nil {
			return nil, err
		}
	}
	for _, ec := range engines {
		ec.Gateways = registries
		e, err := enginesim.Start(ctx, ec)
		if err != nil {
			return nil, fmt.Errorf("engine %s: %w", ec.ID, err)
		}
		f.engines = append(f.engines, e)
	}
	for i := range f.gateways {
		if err := f.waitRoutable(ctx, i, 15*time.Second); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// waitRoutable polls replica i's /metrics until it counts every engine
// routable.
func (f *replicaFleet) waitRoutable(ctx context.Context, i int, within time.Duration) error {
	deadline := time.Now().Add(within)
	n := 0
	for {
		if b, err := fetch(ctx, f.urls[i]+"/metrics"); err == nil {
			n = routableWorkers(b)
			if n >= len(f.engines) {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%w: replica %d sees %d of %d after %v: %s", errNotRoutable, i, n, len(f.engines), within, f.gateways[i].Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// routableWorkers sums tlgate_workers{state="routable"} in a Prometheus
// text exposition.
func routableWorkers(exposition []byte) int {
	sc := bufio.NewScanner(bytes.NewReader(exposition))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "tlgate_workers{") || !strings.Contains(line, `state="routable"`) {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err == nil {
			n += int(v)
		}
	}
	return n
}

// cpu is the gateways' CPU time so far, all replicas together.
func (f *replicaFleet) cpu() (time.Duration, error) {
	return sumOver(f, func(pid int) (time.Duration, error) { return procs.CPU(pid, false) })
}

// switches are the gateways' context switches so far, all replicas
// together.
func (f *replicaFleet) switches() (int64, error) { return sumOver(f, procs.Switches) }

// sumOver sums read over the gateways' processes.
func sumOver[T time.Duration | int64](f *replicaFleet, read func(pid int) (T, error)) (T, error) {
	var sum T
	for _, p := range f.gateways {
		v, err := read(p.Pid())
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// stats are every engine's figures now.
func (f *replicaFleet) stats() []enginesim.Stats {
	out := make([]enginesim.Stats, len(f.engines))
	for i, e := range f.engines {
		out[i] = e.Stats()
	}
	return out
}

// close stops the engines, then the gateways, and removes the files.
func (f *replicaFleet) close() {
	for _, e := range f.engines {
		e.Kill()
	}
	for _, p := range f.gateways {
		p.Stop(5 * time.Second)
	}
	_ = os.RemoveAll(f.dir)
}
