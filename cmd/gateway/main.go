// Command gateway runs tlgate, the LLM inference gateway.
//
//	gateway -config tlgate.toml     run with a configuration file
//	gateway -demo                   run with in-process reference engines
//	gateway -demo -replicas 3       the same with 3 gateways sharing an embedded etcd
//	gateway -config F -seed-from D/routes.json   copy a file store's table into etcd, then exit
//
// -listen and -registry-listen override the listeners of either (port 0
// picks a free port; the demo prints the address it got).
//
// main parses flags and calls run, which builds the logger, the metrics
// registry and the gateway, reloads the keys, tokens and probed engines on SIGHUP and stops
// everything in reverse on SIGINT/SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/runtime/gateway"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, hup); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// run runs the gateway until ctx ends, then stops it and returns nil (or
// why it could not start or stop cleanly). Each value received on reload
// (main feeds it SIGHUP) re-reads the -config file and applies its API
// keys, registry tokens and probed engines; a nil reload never fires.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, reload <-chan os.Signal) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "path of the TOML configuration file")
	demo := fs.Bool("demo", false, "run with in-process reference engines and example routes on loopback")
	listen := fs.String("listen", "", "HTTP listener host:port, overriding the config's listen (port 0: any free port)")
	registryListen := fs.String("registry-listen", "", "gRPC registry listener host:port, overriding the config's registry_listen")
	logFormat := fs.String("log-format", "", "json or console (default: the config's log_format; console with -demo)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	replicas := fs.Int("replicas", 1, "with -demo: gateway replicas sharing an embedded etcd (1: the file store)")
	seedFrom := fs.String("seed-from", "", "copy this routes.json (a file store's) into the -config's etcd store and exit")
	seedForce := fs.Bool("seed-force", false, "with -seed-from: replace a table etcd already holds")
	otlp := fs.String("otlp-endpoint", "", "OTLP receiver URL for traces (grpc, e.g. http://127.0.0.1:4317), overriding [gateway.tracing] endpoint; with -demo the engines export there too")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see -h)", fs.Arg(0))
	}
	var cfg *config.Config
	switch {
	case *demo && *configPath != "":
		return errors.New("-demo and -config are exclusive")
	case *demo:
		cfg = demoConfig()
	case *configPath != "":
		var err error
		if cfg, err = config.Load(*configPath); err != nil {
			return err
		}
	default:
		return errors.New("-config FILE or -demo is required (see -h)")
	}
	if err := overrideListeners(cfg, *listen, *registryListen); err != nil {
		return err
	}
	switch {
	case *seedFrom != "" && *demo:
		return errors.New("-seed-from needs -config, not -demo")
	case *seedFrom != "":
		return seedStore(ctx, cfg, *seedFrom, *seedForce, stdout)
	case *replicas < 1 || *replicas > maxReplicas:
		return fmt.Errorf("-replicas: must be from 1 to %d, got %d", maxReplicas, *replicas)
	case *replicas > 1 && !*demo:
		return errors.New("-replicas needs -demo (a deployment runs one gateway per process)")
	}
	if *otlp != "" {
		cfg.Gateway.Tracing.Endpoint = *otlp
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("-otlp-endpoint: %w", err)
		}
	}
	format := cfg.Gateway.LogFormat
	if *demo {
		format = config.LogConsole
	}
	if *logFormat != "" {
		format = *logFormat
	}
	logger, err := newLogger(stderr, format, *logLevel)
	if err != nil {
		return err
	}
	if *demo && *replicas > 1 {
		return runReplicas(ctx, *replicas, logger, stdout)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	gw, err := gateway.Start(ctx, cfg, gateway.Options{Logger: logger, Registry: reg, Gatherer: reg})
	if err != nil {
		return err
	}
	var stopDemo func()
	if *demo {
		if stopDemo, err = startDemo(ctx, gw, cfg.Gateway.Tracing, logger, stdout); err != nil {
			_ = gw.Close(context.Background())
			if ctx.Err() != nil {
				return nil // stopped while starting: not a failure
			}
			return err
		}
	}
	for waiting := true; waiting; {
		select {
		case <-ctx.Done():
			waiting = false
		case <-reload:
			reloadConfig(*configPath, gw, logger)
		}
	}
	logger.Info().Msg("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Gateway.ShutdownTimeout.Duration+time.Second)
	defer cancel()
	if stopDemo != nil {
		stopDemo()
	}
	return gw.Close(sctx)
}

// overrideListeners applies -listen and -registry-listen (empty: keep the
// config's) and validates the result, naming the flags on error.
func overrideListeners(cfg *config.Config, listen, registryListen string) error {
	var flags []string
	if listen != "" {
		cfg.Gateway.Listen = listen
		flags = append(flags, "-listen")
	}
	if registryListen != "" {
		cfg.Gateway.RegistryListen = registryListen
		flags = append(flags, "-registry-listen")
	}
	if len(flags) == 0 {
		return nil
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%s: %w", joinFlags(flags), err)
	}
	return nil
}

func joinFlags(flags []string) string {
	if len(flags) == 1 {
		return flags[0]
	}
	return flags[0] + " and " + flags[1]
}

// reloadConfig re-reads the configuration on SIGHUP and applies what can change
// at run time: the API keys with their limits, the registry and engine
// tokens, and the list of probed engines. A bad file changes nothing; keys that cannot be applied (none
// left while keys are configured) leave the keys, and the engines, as they
// were.
func reloadConfig(path string, gw *gateway.Gateway, logger zerolog.Logger) {
	if path == "" {
		logger.Warn().Msg("SIGHUP ignored: no -config file to reload")
		return
	}
	cfg, err := config.Load(path)
	if err != nil {
		logger.Error().Err(err).Msg("reload refused; nothing changed")
		return
	}
	if err := gw.ApplyCredentials(&cfg.Gateway); err != nil {
		logger.Error().Err(err).Msg("reload refused; nothing changed")
		return
	}
	gw.ApplyEngines(cfg.Gateway.Engines)
	logger.Info().Int("api_keys", len(cfg.Gateway.APIKeys)).Int("engine_tokens", len(cfg.Gateway.EngineTokens)).
		Int("engines", len(cfg.Gateway.Engines)).Msg("reloaded the API keys, the registry tokens and the probed engines")
}

func newLogger(w io.Writer, format, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		return zerolog.Nop(), fmt.Errorf("-log-level: %w", err)
	}
	switch format {
	case config.LogJSON, "":
	case config.LogConsole:
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	default:
		return zerolog.Nop(), fmt.Errorf("-log-format: must be json or console, got %q", format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}
