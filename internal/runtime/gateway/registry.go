package gateway

import (
	"errors"
	"net"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/registry"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/edge/registryrpc"
	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// registryRefused logs the heartbeats the registry refused (they are
// counted by the gRPC edge): a worker id conflict is a warning, since it
// is an impostor or a misconfigured engine; refusals at max_workers come
// in floods, so they are logged at debug level (the metric counts them).
func registryRefused(log zerolog.Logger) func(w fleet.Worker, err error) {
	return func(w fleet.Worker, err error) {
		ev := log.Debug()
		msg := "heartbeat refused"
		if errors.Is(err, registry.ErrWorkerIDBound) {
			ev, msg = log.Warn(), "worker id conflict: heartbeat refused"
		}
		ev.Str("worker", w.ID).Str("model", w.Model).Str("http", w.HTTPAddress).Time("started_at", w.StartedAt).Err(err).Msg(msg)
	}
}

// addOwn records a listener of the gateway in the address policy, warning
// when a wildcard listener's host addresses cannot be listed (under a
// systemd unit whose RestrictAddressFamilies lacks AF_NETLINK, say): an
// engine could then name the gateway at one of them.
func addOwn(log zerolog.Logger, addrs *fleet.AddressPolicy, a net.Addr) {
	if err := addrs.AddOwn(a); err != nil {
		log.Warn().Err(err).
			Msg("cannot list this host's addresses: an engine naming the gateway's own listener at one of them is not refused (a heartbeat could make the gateway send requests to itself); under systemd, allow AF_NETLINK in RestrictAddressFamilies")
	}
}

// warnOpenRegistry warns, loudly, when anyone who reaches registry_listen
// can register engines and so receive clients' requests.
func warnOpenRegistry(log zerolog.Logger, gw config.Gateway) {
	if gw.RegistryOpen() {
		log.Warn().Str("registry_listen", gw.RegistryListen).
			Msg("SECURITY: registry_listen is not on loopback and no registry_token is set: anyone who can reach it can register an engine and receive clients' requests, prompts included; set registry_token (or registry_token_env)")
	}
}

// engineTokensOf resolves engine_tokens for the gRPC edge.
func engineTokensOf(ts []config.EngineToken) ([]registryrpc.EngineToken, error) {
	out := make([]registryrpc.EngineToken, 0, len(ts))
	for _, et := range ts {
		v, err := et.Value()
		if err != nil {
			return nil, err
		}
		out = append(out, registryrpc.EngineToken{Name: et.Name, Token: v, WorkerIDs: et.WorkerIDs})
	}
	return out, nil
}
