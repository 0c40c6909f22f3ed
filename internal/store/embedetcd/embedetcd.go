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
}

type member struct {
	name         string
	client, peer url.URL
	etcd         *embed.Etcd
}

// Start starts n members (n >= 1) with data under dir and waits until each
// is ready.
func Start(dir string, n int) (*Cluster, error) {
	if n < 1 {
		n = 1
	}
	c := &Cluster{dir: dir}
	var peers []string
	for i := range n {
		cp, err := freePort()
		if err != nil {
			return nil, err
		}
		pp, err := freePort()
		if err != nil {
			return nil, err
		}
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
	var err error
	for range n {
		err = errors.Join(err, <-errs)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// freePort asks the OS for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("embedetcd: pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) start(i int, state string) error {
	c.mu.Lock()
	m := c.members[i]
	c.mu.Unlock()
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = filepath.Join(c.dir, m.name)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{m.client}, []url.URL{m.client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{m.peer}, []url.URL{m.peer}
	cfg.InitialCluster = c.initial
	cfg.InitialClusterToken = "tlgate-embedded"
	cfg.ClusterState = state
	cfg.TickMs, cfg.ElectionMs = 50, 500
	cfg.UnsafeNoFsync = true // a throwaway cluster: speed over durability
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("embedetcd: start %s: %w", m.name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("embedetcd: start %s: %w", m.name, err)
	case <-time.After(StartTimeout):
		e.Close()
		return fmt.Errorf("%w: %s after %s", ErrNotReady, m.name, StartTimeout)
	}
	c.mu.Lock()
	m.etcd = e
	c.mu.Unlock()
	return nil
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
	e := c.members[i].etcd
	c.members[i].etcd = nil
	c.mu.Unlock()
	if e != nil {
		e.Close()
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
