package registry

import (
	"errors"
	"fmt"
	"time"

	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// Errors of a refused heartbeat; the registry answers it with *Refused.
var (
	// ErrWorkerIDBound: the worker id is bound to another engine (another
	// address, or an older started_at) until that engine is evicted. The
	// gRPC edge answers FailedPrecondition.
	ErrWorkerIDBound = errors.New("worker_id bound to another engine")
	// ErrTooManyWorkers: the registry already holds max_workers workers.
	// The gRPC edge answers ResourceExhausted.
	ErrTooManyWorkers = errors.New("too many registered workers")
)

// CheckBinding decides whether w, a heartbeat for a worker id the registry
// already knows as bound, may update it. A worker id is bound to the first
// engine that registered it (its addresses, its source and its started_at)
// until it is evicted:
//
//   - another http, grpc or kv address, or another source (a probed id
//     heartbeated, or the reverse), is refused: it is another engine, or an
//     impostor, and must wait for the eviction of the bound one (k·T after
//     its last heartbeat), after which the id is free;
//   - the same addresses with a later started_at is the engine restarted in
//     place before its eviction: accepted, and the binding moves to the new
//     started_at;
//   - an earlier started_at than the bound one is an older incarnation (or
//     a replay): refused. A zero started_at (not reported) is not compared.
func CheckBinding(bound, w fleet.Worker) error {
	switch {
	case w.HTTPAddress != bound.HTTPAddress, w.GRPCAddress != bound.GRPCAddress, w.KVAddress != bound.KVAddress:
		return fmt.Errorf("%w: %q is bound to http_address %q (grpc %q, kv %q) until it is evicted; this heartbeat names http_address %q (grpc %q, kv %q)",
			ErrWorkerIDBound, w.ID, bound.HTTPAddress, bound.GRPCAddress, bound.KVAddress, w.HTTPAddress, w.GRPCAddress, w.KVAddress)
	case w.Source != bound.Source:
		return fmt.Errorf("%w: %q is a %s worker until it is evicted; this status comes from a %s", ErrWorkerIDBound, w.ID, bound.Source, w.Source)
	case !w.StartedAt.IsZero() && !bound.StartedAt.IsZero() && w.StartedAt.Before(bound.StartedAt):
		return fmt.Errorf("%w: %q is bound to the engine started at %s; this heartbeat says started_at %s, earlier",
			ErrWorkerIDBound, w.ID, bound.StartedAt.Format(time.RFC3339Nano), w.StartedAt.Format(time.RFC3339Nano))
	}
	return nil
}

// OwnDrain decides the draining flag the gateway routes by, from what the
// engine reports and what the gateway asked. An engine drains itself when
// an ack says drain (the operator drained its model); after the operator's
// resume it keeps reporting draining until an ack without drain reaches it,
// a heartbeat or two later. A drain the gateway caused (byAck) therefore
// ends with the resume, at once, rather than at the engine's next report.
//
// prevReported and prevByAck are the worker's previous report and
// attribution; reported is this heartbeat's draining; modelDrained says
// whether an operator drain of its model is on now. The drain is the
// gateway's doing when the engine starts reporting it while its model is
// drained; a drain the engine reported before that stays the engine's.
func OwnDrain(prevReported, prevByAck, reported, modelDrained bool) (draining, byAck bool) {
	if !reported {
		return false, false
	}
	byAck = prevByAck || (!prevReported && modelDrained)
	if byAck && !modelDrained {
		return false, true // resumed: the engine will hear it on its next ack
	}
	return true, byAck
}
