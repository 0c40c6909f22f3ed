package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a discovery source's address is left out: the reason label of
// tlgate_discovery_addresses_dropped.
const (
	// DiscoveryRefused: an address the gateway never sends requests to
	// (unspecified, multicast, link-local such as a cloud metadata
	// service, outside engine_networks, the gateway's own listener).
	DiscoveryRefused = "refused"
	// DiscoveryCapped: an address past the source's max_engines.
	DiscoveryCapped = "cap"
)

// lDiscovery is the label naming a [[gateway.discovery]] source: values
// come from the configuration only.
const lDiscovery = "discovery"

// DiscoveryMetrics are the metrics of [[gateway.discovery]] sources. The
// methods are safe for concurrent use and do nothing on a nil
// *DiscoveryMetrics.
type DiscoveryMetrics struct {
	engines *prometheus.GaugeVec
	dropped *prometheus.GaugeVec
}

// NewDiscoveryMetrics creates the discovery metrics and registers them on
// reg; it fails, registering nothing, when reg is nil or refuses one.
func NewDiscoveryMetrics(reg prometheus.Registerer) (*DiscoveryMetrics, error) {
	if reg == nil {
		return nil, ErrNilRegisterer
	}
	d := &DiscoveryMetrics{
		engines: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "discovery_engines",
			Help: "Engines a discovery source reports now (routable and draining), by source."}, []string{lDiscovery}),
		dropped: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "discovery_addresses_dropped",
			Help: "Addresses a discovery source found and left out of its last report, by source and reason " +
				"(refused: an address requests are never sent to; cap: past max_engines)."}, []string{lDiscovery, lReason}),
	}
	cs := []prometheus.Collector{d.engines, d.dropped}
	if err := registerAll(reg, cs...); err != nil {
		return nil, err
	}
	return d, nil
}

// Discovered sets a source's engines and the addresses its last report
// left out, refused and past its cap.
func (d *DiscoveryMetrics) Discovered(source string, engines, refused, capped int) {
	if d == nil {
		return
	}
	d.engines.WithLabelValues(source).Set(float64(engines))
	d.dropped.WithLabelValues(source, DiscoveryRefused).Set(float64(refused))
	d.dropped.WithLabelValues(source, DiscoveryCapped).Set(float64(capped))
}
