// Package embedetcd runs an etcd cluster inside the process, on loopback
// ports the OS picks, with its data in a directory of the caller's: for
// the demo (-replicas) and the tests of several replicas. It links the
// etcd server, so only they import it; the gateway itself needs only the
// client (package etcdstore).
package embedetcd

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// StartTimeout bounds a member's start (a cluster's first election).
const StartTimeout = 20 * time.Second

// ErrNotReady is Start's error for a member that did not become ready.
var ErrNotReady = errors.New("embedetcd: member not ready")

// Cluster is an embedded etcd cluster of one or more members.
type Cluster struct {
	dir     string
	mu      sync.Mutex
	members []*member
	initial string
	// procs: each member runs in a child process (StartProcesses).
	procs bool
}

type member struct {
	name         string
	client, peer url.URL
	etcd         *embed.Etcd
	proc         *process
}

// Start starts n members (n >= 1) with data under dir and waits until each
// is ready.
func Start(dir string, n int) (*Cluster, error) { return start(dir, n, false) }

// StartProcesses is Start with every member in a child process: the
// running executable again, which must call MemberMain first thing (a
// test binary's TestMain). Stop kills the child, as a crash would; each
// member's goroutines and connections end with its process.
func StartProcesses(dir string, n int) (*Cluster, error) { return start(dir, n, true) }

func start(dir string, n int, procs bool) (*Cluster, error) {
	if n < 1 {
		n = 1
	}
	c := &Cluster{dir: dir, procs: procs}
	var peers []string
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	for i := range n {
		cp, pp := ports[2*i], ports[2*i+1]
		m := &member{
			name:   fmt.Sprintf("m%d", i),
			client: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cp)},
			peer:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pp)},
		}
		c.members = append(c.members, m)
		peers = append(peers, m.name+"="+m.peer.String())
	}
	c.initial = strings.Join(peers, ",")
	errs := make(chan error, n)
	for i := range c.members {
		go func() { errs <- c.start(i, embed.ClusterStateFlagNew) }()
	}
	for range n {
		err = errors.Join(err, <-errs)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// freePorts asks the OS for k distinct free loopback ports. Every
// listener is held until all are picked: one closed before the next is
// asked for can be handed out again (two members got the same port).
func freePorts(k int) ([]int, error) {
	ports := make([]int, 0, k)
	for range k {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("embedetcd: pick a port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (c *Cluster) start(i int, state string) error {
	c.mu.Lock()
	m := c.members[i]
	c.mu.Unlock()
	spec := memberSpec{
		Name: m.name, Dir: filepath.Join(c.dir, m.name), Client: m.client.String(), Peer: m.peer.String(),
		Initial: c.initial, State: state,
	}
	if c.procs {
		p, err := startProcess(spec)
		if err != nil {
			return err
		}
		c.mu.Lock()
		m.proc = p
		c.mu.Unlock()
		return nil
	}
	e, err := spec.run()
	if err != nil {
		return err
	}
	c.mu.Lock()
	m.etcd = e
	c.mu.Unlock()
	return nil
}

// memberSpec is what a member is started with.
type memberSpec struct {
	Name, Dir, Client, Peer, Initial, State string
}

// run starts the member in this process and waits until it is ready.
func (s memberSpec) run() (*embed.Etcd, error) {
	client, err := url.Parse(s.Client)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: %s: %w", s.Name, err)
	}
	peer, err := url.Parse(s.Peer)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: %s: %w", s.Name, err)
	}
	cfg := embed.NewConfig()
	cfg.Name = s.Name
	cfg.Dir = s.Dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.InitialCluster = s.Initial
	cfg.InitialClusterToken = "tlgate-embedded"
	cfg.ClusterState = s.State
	cfg.TickMs, cfg.ElectionMs = 50, 500
	cfg.UnsafeNoFsync = true // a throwaway cluster: speed over durability
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: start %s: %w", s.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedetcd: start %s: %w", s.Name, err)
	case <-time.After(StartTimeout):
		e.Close()
		return nil, fmt.Errorf("%w: %s after %s", ErrNotReady, s.Name, StartTimeout)
	}
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.client.String()
	}
	return out
}

// Stop stops member i (its data stays, for Restart).
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	e, p := c.members[i].etcd, c.members[i].proc
	c.members[i].etcd, c.members[i].proc = nil, nil
	c.mu.Unlock()
	if e != nil {
		e.Close()
	}
	if p != nil {
		p.kill()
	}
}

// Restart starts a stopped member i again on the same ports and data.
func (c *Cluster) Restart(i int) error { return c.start(i, embed.ClusterStateFlagExisting) }

// Close stops every member.
func (c *Cluster) Close() {
	for i := range c.members {
		c.Stop(i)
	}
}
