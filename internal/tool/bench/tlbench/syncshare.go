package tlbench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/enginesim"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/fleetsync"
	"github.com/tlgate/tlgate/internal/routing/prefixindex"
	"github.com/tlgate/tlgate/internal/runtime/actorsys"
	"github.com/tlgate/tlgate/internal/tool/bench/loadgen"
	"github.com/tlgate/tlgate/internal/tool/bench/procs"
	"github.com/tlgate/tlgate/internal/wire/openai"
)

// One replica's share of the sync cost. The whole-fleet measurement
// (syncCost) runs 3 gateways, the engines, NATS and the load generator on
// the same cores, and at 1,000 req/s they saturate a small machine: the
// figure then measures contention as much as sync. Here one gateway serves
// its third of the requests while two mirror peers in this process stand
// in for the other replicas: they answer their thirds at once, without
// engines or HTTP, and tell the fleet what a replica's router would (each
// pick, its prompt's chunk hashes, the release, the in-flight counts)
// through a real fleetsync.Client, so their batches are paced and encoded
// as a replica's are. The gateway does all that a synced replica of such
// a fleet does, with cores to spare for it.

// mirrorPeers is how many replicas the mirror peers stand in for: a fleet
// of 3, as the whole-fleet measurement runs.
const mirrorPeers = 2

// peerSyncer is what a mirror peer tells the fleet: the router.Syncer
// methods a router calls for its own requests.
type peerSyncer interface {
	Picked(model, worker string)
	Indexed(model, worker string, hashes []uint64)
	Released(worker string)
	Load(own []router.WorkerLoad)
}

// mirrorPeer stands in for a gateway replica: it answers each request at
// once with a one-token stream and, when it syncs, reports the request as
// a cache_aware router would. It picks the worker by the prompt's middle
// chunk (a RAG document's), keeping one document on one worker.
type mirrorPeer struct {
	host    string     // the host of the URL the load balancer sends to
	sync    peerSyncer // nil: sync off, the peer only answers
	hasher  *prefixindex.Index
	model   string
	workers []string

	mu       sync.Mutex
	inFlight map[string]int
}

// mirrorStream is a mirror peer's answer: one token, then the end.
const mirrorStream = "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"

// serve answers req, reporting the pick and, when the answer is closed,
// the release.
func (p *mirrorPeer) serve(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("mirror peer %s: %w", p.host, err)
	}
	r, err := openai.ParseRequest(body, req.URL.Path == loadgen.ChatPath)
	if err != nil {
		return nil, fmt.Errorf("mirror peer %s: %w", p.host, err)
	}
	hs := p.hasher.Hashes(nil, r.Prompt)
	w := p.workers[0]
	if len(hs) > 0 {
		w = p.workers[hs[len(hs)/2]%uint64(len(p.workers))]
	}
	p.mu.Lock()
	p.inFlight[w]++
	p.mu.Unlock()
	if p.sync != nil {
		p.sync.Picked(r.Model, w)
		p.sync.Indexed(p.model, w, hs)
	}
	done := func() {
		p.mu.Lock()
		p.inFlight[w]--
		p.mu.Unlock()
		if p.sync != nil {
			p.sync.Released(w)
		}
	}
	return &http.Response{
		Status: "200 OK", StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": []string{"text/event-stream"}},
		Body:          &mirrorBody{Reader: strings.NewReader(mirrorStream), done: done},
		ContentLength: -1, Request: req,
	}, nil
}

// loads are the peer's in-flight counts, as its router would report them.
func (p *mirrorPeer) loads() []router.WorkerLoad {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []router.WorkerLoad
	for _, w := range p.workers {
		if n := p.inFlight[w]; n > 0 {
			out = append(out, router.WorkerLoad{Worker: w, N: n})
		}
	}
	return out
}

// Receive is the actor the peer's fleetsync.Client talks to in place of a
// router: it reports the in-flight counts on SyncTick, answers a warm
// start with an empty view, and drops the batches it is sent.
func (p *mirrorPeer) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *router.SyncInbox:
		m.Take()
	case *router.SyncTick:
		if p.sync != nil {
			p.sync.Load(p.loads())
		}
	case *router.SyncSnapshot:
		ctx.Respond(&router.Snapshot{ChunkBytes: p.hasher.Config().ChunkBytes})
	}
}

// mirrorBody is a mirror peer's answer; closing it ends the request.
type mirrorBody struct {
	io.Reader
	once sync.Once
	done func()
}

func (b *mirrorBody) Close() error {
	b.once.Do(b.done)
	return nil
}

// mirrorTransport sends the requests for a mirror peer's host to the peer
// and the others on to next (the fleet's replicas), counting those.
type mirrorTransport struct {
	next  http.RoundTripper
	peers map[string]*mirrorPeer
	own   atomic.Int64
}

func (t *mirrorTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if p := t.peers[req.URL.Host]; p != nil {
		return p.serve(req)
	}
	t.own.Add(1)
	return t.next.RoundTrip(req)
}

// urls are the peers' base URLs, entries for the load balancer, in the
// order of their hosts.
func (t *mirrorTransport) urls() []string {
	var out []string
	for _, h := range slices.Sorted(maps.Keys(t.peers)) {
		out = append(out, "http://"+h)
	}
	return out
}

// mirrorHost is the i-th mirror peer's host (a name that never resolves).
func mirrorHost(i int) string { return fmt.Sprintf("mirror-%d.invalid", i+1) }

// newMirrorPeer is the i-th peer for engines serving model, telling s
// (nil: sync off).
func newMirrorPeer(i int, model string, engines []enginesim.Config, s peerSyncer) *mirrorPeer {
	p := &mirrorPeer{
		host: mirrorHost(i), sync: s, model: model, inFlight: map[string]int{},
		hasher: prefixindex.New(config.Default().Gateway.PrefixIndex()),
	}
	for _, e := range engines {
		p.workers = append(p.workers, e.ID)
	}
	return p
}

// mirrorFleet is the mirror peers of one run and, with sync on, their
// fleetsync clients and the actor system those talk to.
type mirrorFleet struct {
	transport *mirrorTransport
	sys       *actor.ActorSystem
	clients   []*fleetsync.Client
}

// startMirrorFleet starts mirrorPeers peers for engines serving model,
// synced as s's replicas are (its NATS server, batch interval and release
// hold) when s syncs.
func startMirrorFleet(model string, engines []enginesim.Config, s replicaSpec) (_ *mirrorFleet, err error) {
	m := &mirrorFleet{transport: &mirrorTransport{peers: map[string]*mirrorPeer{}}}
	defer func() {
		if err != nil {
			m.close()
		}
	}()
	if s.syncURL != "" {
		m.sys = actorsys.New(zerolog.Nop())
	}
	for i := range mirrorPeers {
		var c *fleetsync.Client
		var ps peerSyncer
		if s.syncURL != "" {
			cfg := config.Default().Gateway.Sync
			cfg.Kind, cfg.URL, cfg.Token = config.SyncNATS, config.StringList{s.syncURL}, s.syncToken
			if s.syncBatch > 0 {
				cfg.BatchInterval = config.D(s.syncBatch)
			}
			if s.syncHold != nil {
				cfg.ReleaseHold = config.D(*s.syncHold)
			}
			c = fleetsync.New(cfg, fleetsync.Options{Root: m.sys.Root, Logger: zerolog.Nop(), ChunkBytes: config.Default().Gateway.CacheAwareChunkBytes})
			ps = c
		}
		p := newMirrorPeer(i, model, engines, ps)
		m.transport.peers[p.host] = p
		if c == nil {
			continue
		}
		pid := m.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return p }))
		if err := c.Start(strings.TrimSuffix(p.host, ".invalid"), pid); err != nil {
			return nil, fmt.Errorf("mirror peer %s: %w", p.host, err)
		}
		m.clients = append(m.clients, c)
	}
	return m, nil
}

// close stops the peers' clients (publishing what they queued) and their
// actor system.
func (m *mirrorFleet) close() {
	for _, c := range m.clients {
		c.Close()
	}
	if m.sys != nil {
		m.sys.Shutdown()
	}
}

// syncShare measures one replica's share of the sync cost at c.Rate: the
// same sessions as syncCost, a third of them through one gateway and the
// rest answered by mirror peers, sync off and on in turn, OpenRepeats
// times each. Its runs' per-request figures are the gateway's, over the
// requests it served. With seconds > 0 each run also takes a CPU profile
// of the gateway, that long, once its warmup is over.
func syncShare(ctx context.Context, c Config, spec func(replicas int, sync bool, policy string) replicaSpec, seconds int, logOut io.Writer) ([]costRun, error) {
	engines := costEngines(c)
	profiled := seconds > 0
	runs := 0
	return costRuns(c, logOut, func(sessions []loadgen.Session, seed uint64, on bool) (openRun, *cpuProfile, error) {
		runs++
		s := spec(1, on, config.PolicyCacheAware)
		s.pprof = profiled
		peers := s
		if c.SharePeersSilent {
			peers.syncURL = ""
		}
		m, err := startMirrorFleet(c.Model, engines, peers)
		if err != nil {
			return openRun{}, nil, fmt.Errorf("sync share, sync %s: %w", onOff(on), err)
		}
		o := openOpts{sessionRate: c.Rate, seed: seed, engines: engines, mirror: m.transport}
		// The profile is taken over the recorded window, and read once
		// openOne has waited for during to end.
		var prof struct {
			data     []byte
			requests int64
			err      error
		}
		if profiled {
			o.during = func(ctx context.Context, f *replicaFleet) {
				if !sleepFor(ctx, c.OpenWarmup) {
					prof.err = fmt.Errorf("cpu profile: the run ended before its warmup of %v", c.OpenWarmup)
					return
				}
				own := m.transport.own.Load()
				prof.data, prof.err = fetchProfile(ctx, f.urls[0], seconds)
				prof.requests = m.transport.own.Load() - own
			}
		}
		r, err := openOne(ctx, c, loadgen.RAG, s, sessions, o)
		m.close()
		if err != nil {
			return openRun{}, nil, fmt.Errorf("sync share, sync %s: %w", onOff(on), err)
		}
		fmt.Fprintf(logOut, "tlbench:   share of %.0f req/s, 1 replica and %d mirror peers, sync %-3s: %v CPU per request of its own, %.2f messages sent and %.2f received per request, failed %d, not sent %d, load %.1f\n",
			c.Rate, mirrorPeers, onOff(on), r.cpuPerRequest, r.syncMsgsPerRequest, r.syncRecvPerRequest, r.failed, r.dropped, r.load)
		if !profiled {
			return r, nil, nil
		}
		if prof.err != nil {
			return openRun{}, nil, fmt.Errorf("sync share, sync %s: %w", onOff(on), prof.err)
		}
		p, err := classify(prof.data)
		if err != nil {
			return openRun{}, nil, fmt.Errorf("sync share, sync %s: %w", onOff(on), err)
		}
		p.requests = prof.requests
		if err := writeProfile(c.Out, fmt.Sprintf("synccost-share-%d-sync-%s.pprof", runs, onOff(on)), prof.data); err != nil {
			return openRun{}, nil, err
		}
		return r, p, nil
	})
}

// wakeSleeps is how many sleeps wakeCost takes.
const wakeSleeps = 1000

// wakeCost is the CPU this process spends per wakeup when idle: n sleeps
// of 1 ms, the process's user and system time over them, per sleep. Run
// it while nothing else in the process works.
func wakeCost(ctx context.Context, n int) (time.Duration, error) {
	before, err := procs.SelfCPU()
	if err != nil {
		return 0, err
	}
	for range n {
		if !sleepFor(ctx, time.Millisecond) {
			return 0, ctx.Err()
		}
	}
	after, err := procs.SelfCPU()
	if err != nil {
		return 0, err
	}
	return (after - before) / time.Duration(n), nil
}
