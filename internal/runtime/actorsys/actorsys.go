// Package actorsys builds the protoactor actor system the way tlgate runs
// it: its logs go to the gateway's zerolog logger through a slog handler,
// dead-letter chatter is demoted to debug, and no metrics provider is
// installed (protoactor's default Prometheus provider would bind :2222 and
// "/"; the gateway exports its own metrics).
package actorsys

import (
	"context"
	"log/slog"
	"strings"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
)

// New returns an actor system whose logs go to logger.
func New(logger zerolog.Logger) *actor.ActorSystem {
	h := quiet{zerolog.NewSlogHandler(logger.With().Str("component", "protoactor").Logger())}
	return actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(h) }),
		actor.WithDeadLetterRequestLogging(false),
	)
}

// quiet demotes protoactor's routine Info records (dead letters, system
// start, supervision of an actor we restart on purpose) to Debug.
type quiet struct{ slog.Handler }

func (q quiet) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo && (strings.HasPrefix(r.Message, "[DeadLetter]") || strings.HasPrefix(r.Message, "actor system started")) {
		r.Level = slog.LevelDebug
		if !q.Handler.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
	}
	return q.Handler.Handle(ctx, r)
}

func (q quiet) WithAttrs(attrs []slog.Attr) slog.Handler { return quiet{q.Handler.WithAttrs(attrs)} }
func (q quiet) WithGroup(name string) slog.Handler       { return quiet{q.Handler.WithGroup(name)} }
