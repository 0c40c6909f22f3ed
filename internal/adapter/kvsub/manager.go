package kvsub

import (
	"context"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/routing/fleet"
	"github.com/tlgate/tlgate/internal/routing/kvindex"
)

// ManagerConfig is what a Manager needs.
type ManagerConfig struct {
	// Root sends to the actors; Registry is subscribed to for the workers
	// (actors/registry); Router receives their events (router.KVEvents).
	Root     *actor.RootContext
	Registry *actor.PID
	Router   *actor.PID
	Logger   zerolog.Logger
	// Base is every subscription's config but its worker, endpoints and
	// sink (timeouts, bounds, limits, observer, dial control).
	Base Config
}

// Manager runs one subscriber per worker that publishes KV cache events
// (its fleet.Worker.KVEvents), following the registry: a new worker's
// subscription starts, one whose endpoints change starts again, and a
// worker gone (or that stopped publishing) ends its subscription, and its
// view (a router.KVEvents with state kvindex.None). Every replica runs
// its own, so each follows every engine itself.
type Manager struct {
	cfg  ManagerConfig
	pid  *actor.PID
	mu   sync.Mutex
	subs map[string]*subscription
	wg   sync.WaitGroup
	done bool
}

// subscription is one running subscriber.
type subscription struct {
	ev     fleet.KVEvents
	cancel context.CancelFunc
	sink   *routerSink
}

// StartManager starts a manager; Close stops it.
func StartManager(cfg ManagerConfig) *Manager {
	m := &Manager{cfg: cfg, subs: map[string]*subscription{}}
	m.pid = cfg.Root.Spawn(actor.PropsFromFunc(m.receive))
	return m
}

// receive is the manager's actor: the registry's worker changes.
func (m *Manager) receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		ctx.Send(m.cfg.Registry, &registry.Subscribe{PID: ctx.Self()})
	case *registry.SnapshotResult:
		keep := map[string]bool{}
		for _, w := range msg.Workers {
			keep[w.ID] = true
			m.follow(w)
		}
		m.mu.Lock()
		var gone []string
		for id := range m.subs {
			if !keep[id] {
				gone = append(gone, id)
			}
		}
		m.mu.Unlock()
		for _, id := range gone {
			m.unfollow(id)
		}
	case *registry.WorkerChanged:
		m.follow(msg.Worker)
	case *registry.WorkerGone:
		m.unfollow(msg.ID)
	}
}

// follow makes w's subscription match its KVEvents.
func (m *Manager) follow(w fleet.Worker) {
	m.mu.Lock()
	cur := m.subs[w.ID]
	m.mu.Unlock()
	if cur != nil && cur.ev == w.KVEvents {
		return
	}
	if cur != nil {
		m.unfollow(w.ID)
	}
	if w.KVEvents.Endpoint == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	sink := &routerSink{root: m.cfg.Root, router: m.cfg.Router}
	cfg := m.cfg.Base
	cfg.Worker, cfg.Endpoint, cfg.Replay, cfg.Topic, cfg.Sink = w.ID, w.KVEvents.Endpoint, w.KVEvents.Replay, w.KVEvents.Topic, sink
	cfg.Logger = m.cfg.Logger
	m.subs[w.ID] = &subscription{ev: w.KVEvents, cancel: cancel, sink: sink}
	// The view exists (pending) from now on: the router knows the worker
	// publishes events before the first batch.
	sink.Send(&Update{Worker: w.ID, State: kvindex.Pending}, func() {})
	m.cfg.Logger.Info().Str("worker", w.ID).Str("endpoint", cfg.Endpoint).Str("replay", cfg.Replay).Msg("kv events: subscribing")
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		if err := Run(ctx, cfg); err != nil && ctx.Err() == nil {
			m.cfg.Logger.Error().Err(err).Str("worker", cfg.Worker).Msg("kv events: subscription refused")
		}
	}()
}

// unfollow ends worker id's subscription and its view.
func (m *Manager) unfollow(id string) {
	m.mu.Lock()
	cur := m.subs[id]
	delete(m.subs, id)
	m.mu.Unlock()
	if cur == nil {
		return
	}
	cur.cancel()
	cur.sink.stop() // nothing of it reaches the router after the end below
	m.cfg.Root.Send(m.cfg.Router, &router.KVEvents{Worker: id, State: kvindex.None})
	if f, ok := m.cfg.Base.Observer.(interface{ Forget(worker string) }); ok {
		f.Forget(id)
	}
}

// Close ends every subscription and waits for them.
func (m *Manager) Close() {
	_ = m.cfg.Root.StopFuture(m.pid).Wait()
	m.mu.Lock()
	m.done = true
	subs := m.subs
	m.subs = map[string]*subscription{}
	m.mu.Unlock()
	for _, s := range subs {
		s.cancel()
		s.sink.stop()
	}
	m.wg.Wait()
}

// routerSink sends a subscriber's updates to the router; once stopped it
// sends nothing more.
type routerSink struct {
	root    *actor.RootContext
	router  *actor.PID
	mu      sync.Mutex
	stopped bool
}

// Send implements Sink.
func (s *routerSink) Send(u *Update, done func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		done()
		return
	}
	s.root.Send(s.router, &router.KVEvents{Worker: u.Worker, Clear: u.Clear, Restarted: u.Restarted, Batches: u.Batches, State: u.State, Done: done})
}

func (s *routerSink) stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
}
