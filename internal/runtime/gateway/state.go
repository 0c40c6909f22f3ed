package gateway

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/actors/admin"
	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/statefile"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// loadRoutes returns the route table to start with: the one persisted in
// stateDir when there is one (a corrupt file, or one that breaks the
// bounds, stops the start), else the configuration's routes at epoch 1.
// stateDir must be writable (admin writes save the table there). When the
// persisted table differs from the configuration's routes it is logged,
// once, naming the file and its epoch: the configuration's routes only
// seed an empty state_dir.
func loadRoutes(stateDir string, seed []routes.Route, b admin.Bounds, log zerolog.Logger) (uint64, []routes.Route, error) {
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
	if err := checkStateFile(stateDir, b, epoch, rs); err != nil {
		return 0, nil, err
	}
	if len(seed) > 0 && !sameRoutes(seed, rs) {
		log.Warn().Str("file", statefile.Path(stateDir)).Uint64("epoch", epoch).Int("routes", len(rs)).Int("config_routes", len(seed)).
			Msg("the route table in the state file supersedes the config's routes, which only seed an empty state_dir; change the table with PUT /admin/v1/routes, or remove the file to start from the config's")
	}
	return epoch, rs, nil
}

// boundsOf are the bounds [gateway] sets on route tables.
func boundsOf(gw *config.Gateway) admin.Bounds {
	return admin.Bounds{MaxRoutes: gw.MaxRoutes, MaxTableBytes: gw.MaxTableBytes}
}

// checkStateFile holds the state file's table (epoch, rs) to the bounds a
// shared store's tables are held to (admin.Bounds.Check).
func checkStateFile(stateDir string, b admin.Bounds, epoch uint64, rs []routes.Route) error {
	size, err := statefile.BodySize(stateDir)
	if err != nil {
		return fmt.Errorf("gateway.state_dir: %w", err)
	}
	if err := b.Check(int(size), epoch, len(rs)); err != nil {
		return fmt.Errorf("gateway.state_dir: %s: %w; %s", statefile.Path(stateDir), err,
			startFix(err, "replace the file, or remove it to start from the config's routes"))
	}
	return nil
}

// startFix says how to get past a stored table refused at start (err, of
// admin.Bounds.Check): replace says how to replace it.
func startFix(err error, replace string) string {
	if errors.Is(err, admin.ErrTableTooBig) {
		return "raise the bound, or " + replace
	}
	return replace
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
