package gateway

import (
	"errors"
	"fmt"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/adapter/statefile"
	"github.com/tlgate/tlgate/internal/routing/policy"
	"github.com/tlgate/tlgate/internal/routing/routes"
)

// Check makes the checks Start makes before it binds a listener or dials
// anything, without starting: the API keys and tokens (their environment
// variables read), the route policy, the TLS files, the configuration's
// routes and, for the file store, that state_dir is writable and its
// route table loads within the bounds (gateway.max_routes,
// gateway.max_table_bytes, the epoch margin); for etcd, the client's settings (etcd is not dialed).
// cfg has passed Validate (config.Load). It returns every problem found,
// each naming its key, joined.
func Check(cfg *config.Config) error {
	gw := &cfg.Gateway
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	wrap := func(key string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
		}
	}
	if len(gw.APIKeys) == 0 && !cfg.AllLoopback() {
		wrap("gateway.api_keys", ErrOpenWithoutKeys)
	}
	_, err := keyringOf(gw.APIKeys)
	wrap("gateway.api_keys", err)
	_, err = policy.ParsePolicy(gw.RoutePolicy)
	wrap("gateway.route_policy", err)
	_, err = gw.RegistryTokenValue()
	add(err)
	_, err = engineTokensOf(gw.EngineTokens)
	wrap("gateway.engine_tokens", err)
	_, err = loadServerTLS(gw.TLSCertFile, gw.TLSKeyFile)
	wrap("gateway.tls_cert_file, gateway.tls_key_file", err)
	if _, err := loadEngineTLS(gw.EngineCAFile); err != nil {
		errs = append(errs, fmt.Errorf("gateway.%w", err))
	}
	_, err = routes.NewTable(gw.Routes)
	wrap("gateway.routes", err)
	if gw.Store.Kind == config.StoreEtcd {
		_, err := EtcdConfig(&gw.Store)
		add(err)
	} else {
		if err := statefile.CheckWritable(gw.StateDir); err != nil {
			wrap("gateway.state_dir", err)
		} else if epoch, rs, found, err := statefile.Load(gw.StateDir); err != nil {
			wrap("gateway.state_dir", err)
		} else if found {
			_, err := routes.NewTable(rs)
			wrap("gateway.state_dir: "+statefile.Path(gw.StateDir), err)
			add(checkStateFile(gw.StateDir, boundsOf(gw), epoch, rs))
		}
	}
	if gw.Tracing.Endpoint != "" {
		_, err := gw.Tracing.Headers()
		add(err)
	}
	return errors.Join(errs...)
}
