package enginesim

import (
	"context"
	"errors"
	"net"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// heartbeatLoop sends the engine's status to one gateway registry address:
// at once, then every interval (which the gateway's ack may change),
// counted from each send, until ctx ends. An ack with drain set makes the
// engine drain.
func (e *Engine) heartbeatLoop(ctx context.Context, addr string, conn *grpc.ClientConn) {
	client := controlv1.NewWorkerRegistryClient(conn)
	interval := e.cfg.HeartbeatInterval
	log := e.log.With().Str("gateway", addr).Logger()
	failing := false
	// drainedByAck: this gateway's ack started the drain, so its ack
	// without drain (an operator's :resume) ends it. A drain set by the
	// operator of the engine (SetDraining) is left alone.
	drainedByAck := false
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if e.Faults().NoHeartbeat {
			e.core.count(func(c *counters) { c.heartbeatsSkipped++ })
			e.hook(func(h *hooks) chan struct{} { return h.heartbeatSkipped })
			t.Reset(interval)
			continue
		}
		sent := time.Now()
		hctx, cancel := context.WithTimeout(ctx, max(interval, time.Second))
		if e.cfg.RegistryToken != "" {
			hctx = metadata.AppendToOutgoingContext(hctx, "authorization", "Bearer "+e.cfg.RegistryToken)
		}
		ack, err := client.Heartbeat(hctx, e.Status())
		cancel()
		if err != nil {
			e.core.count(func(c *counters) { c.heartbeatsFailed++ })
			if !failing && ctx.Err() == nil {
				log.Warn().Err(err).Msg("heartbeat failed")
			}
			failing = true
		} else {
			e.core.count(func(c *counters) { c.heartbeatsSent++ })
			if failing {
				log.Info().Msg("heartbeat acknowledged again")
			}
			failing = false
			if ms := ack.GetIntervalMs(); ms > 0 && time.Duration(ms)*time.Millisecond != interval {
				interval = time.Duration(ms) * time.Millisecond
				log.Info().Dur("interval", interval).Msg("heartbeat interval set by gateway")
			}
			switch {
			case ack.GetDrain() && !e.Draining():
				log.Info().Msg("gateway asked to drain")
				e.SetDraining(true)
				drainedByAck = true
			case !ack.GetDrain() && drainedByAck:
				log.Info().Msg("gateway resumed the drained model")
				e.SetDraining(false)
				drainedByAck = false
			}
		}
		if e.cfg.hooks != nil && e.cfg.hooks.heartbeatReturned != nil {
			select {
			case e.cfg.hooks.heartbeatReturned <- err:
			default:
			}
		}
		// The next heartbeat is due one interval after this one was sent,
		// not after its ack: a gateway slow to answer (a loaded machine)
		// must not stretch the period towards its eviction deadline.
		t.Reset(nextBeat(interval, time.Since(sent)))
	}
}

// nextBeat is the wait before the next heartbeat, when the last one was
// sent elapsed ago: the rest of the interval, or none if it is used up.
func nextBeat(interval, elapsed time.Duration) time.Duration { return max(0, interval-elapsed) }

// ReconnectBackoff is the gRPC reconnect backoff towards a gateway with
// heartbeat interval T: retries start after a tenth of T and grow to at
// most T (gRPC's default grows to 120 s), so a gateway that comes back is
// reached again within one interval and registers the engine with the
// heartbeat after, within two heartbeats of its start.
func ReconnectBackoff(interval time.Duration) grpc.ConnectParams {
	interval = max(interval, 10*time.Millisecond)
	return grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: interval / 10, Multiplier: 1.6, Jitter: 0.2, MaxDelay: interval},
		MinConnectTimeout: max(interval, time.Second),
	}
}

// gatewayLoop heartbeats every registry address target names. A target
// whose host is an IP address is one registry; a DNS name (the headless
// Service of a gateway's replicas) is resolved at once and then every
// heartbeat interval (localhost is left to gRPC: one registry), and each address it resolves to gets its own
// connection and heartbeat loop: a new address is heartbeated from the
// resolution that finds it, and one no longer published stops being
// heartbeated (its connection closed). A failed resolution keeps the
// addresses of the last one. gatewayLoop returns when the engine stops.
func (e *Engine) gatewayLoop(target string) {
	host, port, _ := net.SplitHostPort(target) // validated by withDefaults
	log := e.log.With().Str("gateway", target).Logger()
	type running struct {
		cancel context.CancelFunc
		done   chan struct{}
		conn   *grpc.ClientConn
	}
	loops := map[string]*running{}
	start := func(addr string) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(ReconnectBackoff(e.cfg.HeartbeatInterval)))
		if err != nil {
			log.Error().Err(err).Str("address", addr).Msg("gateway address unusable")
			return
		}
		ctx, cancel := context.WithCancel(e.ctx)
		r := &running{cancel: cancel, done: make(chan struct{}), conn: conn}
		loops[addr] = r
		go func() {
			defer close(r.done)
			e.heartbeatLoop(ctx, addr, conn)
		}()
	}
	stop := func(addr string) {
		r := loops[addr]
		r.cancel()
		<-r.done
		_ = r.conn.Close()
		delete(loops, addr)
	}
	defer func() {
		for addr := range loops {
			stop(addr)
		}
	}()
	if net.ParseIP(host) != nil || host == "localhost" {
		start(target)
		<-e.ctx.Done()
		return
	}
	resolver := e.cfg.Resolver
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	failing := false
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(e.cfg.HeartbeatInterval)
		ctx, cancel := context.WithTimeout(e.ctx, max(e.cfg.HeartbeatInterval, time.Second))
		ips, err := resolver.LookupHost(ctx, host)
		cancel()
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			ips, err = nil, nil
		}
		if err != nil {
			if !failing && e.ctx.Err() == nil {
				log.Warn().Err(err).Msg("gateway name does not resolve; heartbeating the last addresses")
			}
			failing = true
			continue
		}
		failing = false
		want := make([]string, len(ips))
		for i, ip := range ips {
			want[i] = net.JoinHostPort(ip, port)
		}
		for addr := range loops {
			if !slices.Contains(want, addr) {
				log.Info().Str("address", addr).Msg("gateway address gone; no longer heartbeated")
				stop(addr)
			}
		}
		for _, addr := range want {
			if _, ok := loops[addr]; !ok {
				log.Info().Str("address", addr).Msg("gateway address found; heartbeating it")
				start(addr)
			}
		}
	}
}
