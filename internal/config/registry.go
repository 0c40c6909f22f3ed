package config

import (
	"fmt"
	"math"
	"net/netip"
)

// registryLimits checks max_workers, registry_peer_rate,
// registry_peer_burst and engine_networks.
func (v *checker) registryLimits(g *Gateway) {
	if g.MaxWorkers < 1 {
		v.add("gateway.max_workers", "must be >= 1, got %d", g.MaxWorkers)
	}
	if !(g.RegistryPeerRate >= 0) || math.IsInf(g.RegistryPeerRate, 0) {
		v.add("gateway.registry_peer_rate", "must be a finite number >= 0 (0 disables the limit), got %v", g.RegistryPeerRate)
	}
	if g.RegistryPeerRate > 0 && g.RegistryPeerBurst < 1 {
		v.add("gateway.registry_peer_burst", "must be >= 1 when registry_peer_rate is set, got %d", g.RegistryPeerBurst)
	}
	for i, n := range g.EngineNetworks {
		p, err := netip.ParsePrefix(n)
		switch {
		case err != nil:
			v.add(fmt.Sprintf("gateway.engine_networks[%d]", i), "must be a CIDR network such as \"10.0.0.0/8\", got %q", n)
		case p.Masked() != p:
			v.add(fmt.Sprintf("gateway.engine_networks[%d]", i), "%q has host bits set; the network is %q", n, p.Masked())
		}
	}
}

// EngineNetworkPrefixes returns engine_networks parsed (they are valid
// after Validate).
func (g Gateway) EngineNetworkPrefixes() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(g.EngineNetworks))
	for _, n := range g.EngineNetworks {
		if p, err := netip.ParsePrefix(n); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// RegistryOpen reports whether registry_listen accepts heartbeats from off
// this host with no registry token: anyone who can reach it can register
// engines (and, without keys, nothing else stops them).
func (g Gateway) RegistryOpen() bool {
	return g.RegistryToken == "" && g.RegistryTokenEnv == "" && !isLoopback(g.RegistryListen)
}
