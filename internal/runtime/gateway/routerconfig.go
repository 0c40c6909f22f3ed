package gateway

import (
	"time"

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
		RecentModels:         recentModels(gw.RecentModelWindow.Duration),
	}
}

// recentModels is the router's RecentModels for recent_model_window
// (whose 0 is the router's "not at all").
func recentModels(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
