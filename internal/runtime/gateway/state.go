package gateway

import (
	"fmt"

	"github.com/tlgate/tlgate/internal/adapter/statefile"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// loadRoutes returns the route table to start with: the one persisted in
// stateDir when there is one (a corrupt file stops the start), else the
// configuration's routes at epoch 1.
func loadRoutes(stateDir string, seed []routes.Route) (uint64, []routes.Route, error) {
	epoch, rs, found, err := statefile.Load(stateDir)
	if err != nil {
		return 0, nil, fmt.Errorf("state_dir: %w", err)
	}
	if found {
		return epoch, rs, nil
	}
	return 1, seed, nil
}
