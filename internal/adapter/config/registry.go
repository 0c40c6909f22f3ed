package config

import (
	"crypto/sha256"
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"strings"
)

var workerIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

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
	v.engineTokens(g)
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
	return g.RegistryToken == "" && g.RegistryTokenEnv == "" && len(g.EngineTokens) == 0 && !isLoopback(g.RegistryListen)
}

// engineTokens checks engine_tokens: a unique name, exactly one of token
// and token_env (the variable set), a secret of its own (not another
// token's, not registry_token's: a heartbeat's token must name one entry),
// and valid worker ids, each in one token at most.
func (v *checker) engineTokens(g *Gateway) {
	names := map[string]int{}
	owner := map[string]int{}
	digests := map[[sha256.Size]byte]string{} // secret's digest -> the entry holding it
	if tok, err := g.RegistryTokenValue(); err == nil && tok != "" {
		name := "registry_token"
		if g.RegistryTokenEnv != "" {
			name = "registry_token_env"
		}
		digests[sha256.Sum256([]byte(tok))] = name
	}
	for i, et := range g.EngineTokens {
		at := fmt.Sprintf("gateway.engine_tokens[%d]", i)
		switch {
		case strings.TrimSpace(et.Name) == "":
			v.add(at+".name", "required")
		default:
			if j, dup := names[et.Name]; dup {
				v.add(at+".name", "%q already names engine_tokens[%d]", et.Name, j)
			}
			names[et.Name] = i
		}
		switch {
		case et.Token == "" && et.TokenEnv == "":
			v.add(at, "exactly one of token and token_env is required, got none")
		case et.Token != "" && et.TokenEnv != "":
			v.add(at, "exactly one of token and token_env is required, got both")
		default:
			tok := et.Token
			if et.TokenEnv != "" {
				var err error
				if tok, err = envValue(et.TokenEnv); err != nil {
					v.add(at+".token_env", "%s", err)
					break
				}
			}
			d := sha256.Sum256([]byte(tok))
			if other, dup := digests[d]; dup {
				v.add(at, "same secret as %s", other)
			} else {
				digests[d] = fmt.Sprintf("engine_tokens[%d]", i)
			}
		}
		if len(et.WorkerIDs) == 0 {
			v.add(at+".worker_ids", "required: the worker ids this token may register")
		}
		for k, id := range et.WorkerIDs {
			wat := fmt.Sprintf("%s.worker_ids[%d]", at, k)
			switch j, dup := owner[id]; {
			case !workerIDPattern.MatchString(id):
				v.add(wat, "%q must match [A-Za-z0-9._:-]{1,128}", id)
			case dup:
				v.add(wat, "%q is already in engine_tokens[%d]", id, j)
			default:
				owner[id] = i
			}
		}
	}
}
