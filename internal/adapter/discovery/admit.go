package discovery

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/rs/zerolog"
)

// Metrics is told what each source's last report held and left out:
// *metrics.DiscoveryMetrics.
type Metrics interface {
	Discovered(source string, engines, refused, capped int)
}

// maxLoggedRefusals bounds the addresses one report logs one by one; the
// rest are counted in one line.
const maxLoggedRefusals = 8

// admission filters one source's reports before they reach the Sink: it
// drops the addresses check refuses and keeps at most max engines. Each
// refused address is logged once while it stays refused; reaching the cap
// is logged when it starts and when it ends. It belongs to the source's
// reporting goroutine.
type admission struct {
	source  string
	max     int
	check   func(network, address string) error
	log     zerolog.Logger
	metrics Metrics

	refused map[string]bool // addresses the last report refused
	kept    map[string]bool // keys the last report kept
	capped  int             // engines the last report left out past max
}

func newAdmission(source string, limit int, check func(network, address string) error, log zerolog.Logger, m Metrics) *admission {
	return &admission{source: source, max: limit, check: check, log: log, metrics: m, refused: map[string]bool{}, kept: map[string]bool{}}
}

// filter returns eps (sorted by key) without the refused addresses and
// past the cap, sorted by key. At the cap, routable engines win over
// draining ones, then engines kept last time over new ones (the set does
// not churn), then keys in order.
func (a *admission) filter(eps []Endpoint) []Endpoint {
	out := make([]Endpoint, 0, len(eps))
	refused := make(map[string]bool)
	logged := 0
	for _, ep := range eps {
		err := a.refuse(ep.Address)
		if err == nil {
			out = append(out, ep)
			continue
		}
		refused[ep.Address] = true
		if a.refused[ep.Address] {
			continue
		}
		if logged < maxLoggedRefusals {
			a.log.Warn().Err(err).Str("address", ep.Address).Msg("discovery: address dropped: the gateway sends no request there")
		}
		logged++
	}
	if logged > maxLoggedRefusals {
		a.log.Warn().Int("more", logged-maxLoggedRefusals).Int("refused", len(refused)).Msg("discovery: more addresses dropped: the gateway sends no request there")
	}
	a.refused = refused

	capped := 0
	if len(out) > a.max {
		slices.SortStableFunc(out, func(x, y Endpoint) int {
			if x.Draining != y.Draining {
				return boolOrder(x.Draining, y.Draining)
			}
			if kx, ky := a.kept[x.Key], a.kept[y.Key]; kx != ky {
				return boolOrder(ky, kx)
			}
			return strings.Compare(x.Key, y.Key)
		})
		capped = len(out) - a.max
		out = out[:a.max]
		slices.SortFunc(out, func(x, y Endpoint) int { return strings.Compare(x.Key, y.Key) })
	}
	switch {
	case capped > 0 && a.capped == 0:
		a.log.Error().Int("max_engines", a.max).Int("left_out", capped).
			Msg("discovery: the source reports more engines than max_engines; the others are left out")
	case capped == 0 && a.capped > 0:
		a.log.Info().Int("max_engines", a.max).Int("engines", len(out)).Msg("discovery: the source is within max_engines again")
	}
	a.capped = capped
	a.kept = make(map[string]bool, len(out))
	for _, ep := range out {
		a.kept[ep.Key] = true
	}
	if a.metrics != nil {
		a.metrics.Discovered(a.source, len(out), len(refused), capped)
	}
	return out
}

// refuse checks an endpoint's address: one that is not an IP address and
// port (a host name) is left to the check every dial makes once it is
// resolved.
func (a *admission) refuse(addr string) error {
	if a.check == nil {
		return nil
	}
	if _, err := netip.ParseAddrPort(addr); err != nil {
		return nil
	}
	return a.check("tcp", addr)
}

// boolOrder orders false before true.
func boolOrder(x, y bool) int {
	switch {
	case x == y:
		return 0
	case x:
		return 1
	}
	return -1
}
