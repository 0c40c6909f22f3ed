package gateway

import (
	"github.com/tlgate/tlgate/actors/router"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/routing/policy"
)

// routerConfig is the router's share of the [gateway] settings.
func routerConfig(pol policy.Name, gw *config.Gateway) router.Config {
	return router.Config{
		Policy: pol, LoadFactor: gw.AffinityLoadFactor,
		CacheAware: policy.CacheAwareConfig{
			PrefillWeight: gw.CacheAwarePrefillWeight, LoadWeight: gw.CacheAwareLoadWeight,
			BalanceAbs: gw.CacheAwareBalanceAbs, BalanceRel: gw.CacheAwareBalanceRel,
		},
		PrefixIndex: gw.PrefixIndex(),
		// A worker that registers or comes back is routable after its
		// next heartbeat.
		NoCapacityRetryAfter: gw.HeartbeatInterval.Duration,
	}
}
