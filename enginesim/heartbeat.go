package enginesim

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	controlv1 "github.com/tlgate/tlgate/protos/tl/control/v1"
)

// heartbeatLoop sends the engine's status to one gateway registry: at once,
// then every interval (which the gateway's ack may change), counted from
// each send, until the engine stops. An ack with drain set makes the engine drain.
func (e *Engine) heartbeatLoop(addr string, conn *grpc.ClientConn) {
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
		case <-e.ctx.Done():
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
		ctx, cancel := context.WithTimeout(e.ctx, max(interval, time.Second))
		if e.cfg.RegistryToken != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+e.cfg.RegistryToken)
		}
		ack, err := client.Heartbeat(ctx, e.Status())
		cancel()
		if err != nil {
			e.core.count(func(c *counters) { c.heartbeatsFailed++ })
			if !failing && e.ctx.Err() == nil {
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
