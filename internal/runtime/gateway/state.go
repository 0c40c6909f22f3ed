package gateway

import (
	"fmt"
	"reflect"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/adapter/statefile"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// loadRoutes returns the route table to start with: the one persisted in
// stateDir when there is one (a corrupt file stops the start), else the
// configuration's routes at epoch 1. stateDir must be writable (admin
// writes save the table there). When the persisted table differs from the
// configuration's routes it is logged, once, naming the file and its
// epoch: the configuration's routes only seed an empty state_dir.
func loadRoutes(stateDir string, seed []routes.Route, log zerolog.Logger) (uint64, []routes.Route, error) {
	if err := statefile.CheckWritable(stateDir); err != nil {
		return 0, nil, fmt.Errorf("gateway.state_dir: %w", err)
	}
	epoch, rs, found, err := statefile.Load(stateDir)
	if err != nil {
		return 0, nil, fmt.Errorf("gateway.state_dir: %w", err)
	}
	if !found {
		return 1, seed, nil
	}
	if len(seed) > 0 && !sameRoutes(seed, rs) {
		log.Warn().Str("file", statefile.Path(stateDir)).Uint64("epoch", epoch).Int("routes", len(rs)).Int("config_routes", len(seed)).
			Msg("the route table in the state file supersedes the config's routes, which only seed an empty state_dir; change the table with PUT /admin/v1/routes, or remove the file to start from the config's")
	}
	return epoch, rs, nil
}

// sameRoutes reports whether two route lists encode alike.
func sameRoutes(a, b []routes.Route) bool {
	ea, errA := routes.EncodeJSON(0, a)
	eb, errB := routes.EncodeJSON(0, b)
	if errA != nil || errB != nil {
		return reflect.DeepEqual(a, b)
	}
	return string(ea) == string(eb)
}
